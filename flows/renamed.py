"""Old option names, accepted for one release: a deployment (``deploy/prefect.yaml``) or a
script written before the options took the library's parameter names still runs. Each option
dataclass declares its old names as ``InitVar`` fields (never stored) and hands them to
:func:`take_old_names` in its ``__post_init__``."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from fairpipe.errors import FairpipeInputError

OLD_AND_NEW = "The {owner} options give {new!r} and its old name {old!r}: give only {new!r}."


def take_old_names(options: Any, renames: dict[str, str], values: dict[str, Any]) -> None:
    """Set the fields of ``options`` that old names (``renames``: old name -> field) were given
    for in ``values`` (old name -> value, None when not given). An old name given together
    with a new one set to something other than its default is bad input."""
    defaults = {f.name: f.default for f in fields(options) if f.default is not MISSING}
    for old, value in values.items():
        if value is None:
            continue
        new = renames[old]
        if getattr(options, new) != defaults.get(new):
            owner = type(options).__name__
            raise FairpipeInputError(OLD_AND_NEW.format(owner=owner, new=new, old=old))
        setattr(options, new, value)
