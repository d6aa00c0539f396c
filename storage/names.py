"""The store's attribute names: the library's parameter names. A store written with the older
names (``lsh`` -> ``k`` and ``width``; ``tree`` -> ``width`` and ``iterations``; ``qkmeans`` ->
``iterations`` and ``gamma``; ``summary`` -> ``width``) is read as if it held the current ones
(``fairpipe.old_names.OLD_ATTRIBUTES``; :func:`current_names`) and is rewritten with them by
its next commit (:func:`upgrade_names`, called by every transaction that writes)."""

from __future__ import annotations

from typing import Any

from fairpipe.old_names import OLD_ATTRIBUTES

GROUPS = ("tree", "qkmeans", "summary")


def renamed(attrs: dict[str, Any], place: str) -> dict[str, Any]:
    """``attrs`` (of ``place``) with every old name replaced by its current one (the same dict
    when it holds none)."""
    old = OLD_ATTRIBUTES[place]
    if not any(name in attrs for name in old):
        return attrs
    return {old.get(name, name): value for name, value in attrs.items()}


def current_names(root_attrs: dict[str, Any]) -> dict[str, Any]:
    """The root attributes of a store with the ``lsh`` attribute under its current names."""
    lsh = root_attrs.get("lsh")
    if not isinstance(lsh, dict):
        return root_attrs
    upgraded = renamed(lsh, "lsh")
    return root_attrs if upgraded is lsh else {**root_attrs, "lsh": upgraded}


def upgrade_names(root) -> None:
    """Rewrite the attributes of an open, writable store root that still hold old names. Every
    store written before holds them in its ``lsh`` attribute, and this rewrites them all in one
    commit: a store whose ``lsh`` holds the current names holds them everywhere (its groups are
    then not even opened)."""
    attrs = dict(root.attrs)
    upgraded = current_names(attrs)
    if upgraded is attrs:
        return
    root.attrs["lsh"] = upgraded["lsh"]
    for place in GROUPS:
        if place not in root:
            continue
        group = root[place]
        old = dict(group.attrs)
        new = renamed(old, place)
        if new is not old:
            group.attrs.put(new)  # replaces them all: the old names go
