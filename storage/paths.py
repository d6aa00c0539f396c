"""The folder a local store path names: the one place a store's path is resolved and checked.

A store's folder is where every write of a command goes (its repository, its queue, an ingest's
staging), so the path a user gives is checked before anything is written, and every part of
fairpipe uses the folder this module returns (:func:`fairpipe.storage.urls.parse_store_url`):

- every name in it fits the filesystem (a name of at most 255 bytes, a path of at most 4,095):
  otherwise a store would be half made before the name is refused;
- its symbolic links are resolved: a link to a store or to a folder is that folder; a link that
  names nothing (dangling) is refused, since making the store would make the link's target,
  elsewhere; a loop of links is refused;
- it is not inside another store's folder (nor in a folder inside one: ``S/inner``,
  ``S/chunks/x``, ``S/queue``): the outer store's erasure would reach into it, and its garbage
  collection delete the inner store's objects.

The folders a store keeps beside its repository (its deletion queue and quarantine) must be
folders of its own, never links that lead elsewhere: :func:`own_folder`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from fairpipe.errors import FairpipeInputError

# Linux's limits (NAME_MAX, PATH_MAX less its terminating byte); other systems' are no larger.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095
# Icechunk's folders in a repository: a folder holding both holds a repository.
REPOSITORY_FOLDERS = ("refs", "snapshots")
# Icechunk's folders of objects: files only, each an object its garbage collection may delete.
OBJECT_FOLDERS = ("chunks", "manifests", "snapshots", "transactions")

NAME_TOO_LONG = (
    "The store path {path} has a name of {n:,} bytes ({name}); a name in a path holds at "
    "most {limit} bytes."
)
PATH_TOO_LONG = "The store path {path} is {n:,} bytes long; a path holds at most {limit} bytes."
LINK_LOOP = "The store path {path} is a loop of symbolic links; give the store's folder itself."
DANGLING_LINK = (
    "The store path {path} goes through the symbolic link {link}, which names nothing "
    "({target}); give the store's folder itself, or make the folder the link names."
)
NESTED = (
    "The store path {path} is inside the store {outer}; a store cannot hold another. Give a "
    "folder outside it."
)
FOREIGN = (
    "The store {url} holds the folder {entry}, which is not the store's (another store made "
    "inside it?): its garbage collection would delete what is in it. Move it out of the store, "
    "then run the command again."
)
NOT_OWN_FOLDER = (
    "{path} is {what}: fairpipe keeps {role} there, in a folder of the store's own. Move it "
    "away, then run the command again."
)


def _shown(path: str, limit: int = 60) -> str:
    return path if len(path) <= limit else path[:limit] + "..."


def store_folder(given: str) -> Path:
    """The folder the local store path ``given`` names (``~`` expanded, absolute, its links
    resolved), checked as the module says; a :class:`FairpipeInputError` naming the path
    otherwise. Looks, never writes."""
    path = Path(os.path.expanduser(given))
    if not path.is_absolute():
        path = Path.cwd() / path
    _check_lengths(str(path), given)
    _check_links(path, given)
    try:
        folder = path.resolve()
    except (RuntimeError, OSError) as exc:  # a loop: RuntimeError before Python 3.13
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise
        raise FairpipeInputError(LINK_LOOP.format(path=given)) from None
    _check_lengths(str(folder), given)
    outer = enclosing_repository(folder)
    if outer is not None and not holds_repository(folder):
        raise FairpipeInputError(NESTED.format(path=given, outer=outer))
    return folder


def _check_lengths(path: str, given: str) -> None:
    encoded = os.fsencode(path)
    if len(encoded) > MAX_PATH_BYTES:
        raise FairpipeInputError(
            PATH_TOO_LONG.format(path=_shown(given), n=len(encoded), limit=MAX_PATH_BYTES)
        )
    for name in encoded.split(b"/"):
        if len(name) > MAX_NAME_BYTES:
            shown = _shown(os.fsdecode(name), 40)
            raise FairpipeInputError(NAME_TOO_LONG.format(path=_shown(given), n=len(name),
                                                          name=shown, limit=MAX_NAME_BYTES))  # fmt: skip


def _check_links(path: Path, given: str) -> None:
    """Refuse a path through a symbolic link that names nothing, or through a loop of them."""
    at = Path(path.anchor)
    for part in path.parts[1:]:
        at = at / part
        try:
            if not at.is_symlink():
                if not os.path.lexists(at):
                    return  # the rest is to be made: no link in it
                continue
        except OSError:
            return
        try:
            os.stat(at)
        except FileNotFoundError:
            target = os.readlink(at)
            raise FairpipeInputError(
                DANGLING_LINK.format(path=given, link=at, target=f"-> {target}")
            ) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FairpipeInputError(LINK_LOOP.format(path=given)) from None
            raise


def holds_repository(folder: Path) -> bool:
    """Whether ``folder`` holds an Icechunk repository (a store, or one being made)."""
    return all((folder / name).is_dir() for name in REPOSITORY_FOLDERS)


def enclosing_repository(folder: Path) -> Path | None:
    """The nearest folder above ``folder`` (a resolved path) that holds a repository, if any."""
    for parent in folder.parents:
        if holds_repository(parent):
            return parent
    return None


def own_folder(path: Path, role: str) -> Path:
    """``path`` (a folder a store keeps beside its repository, for ``role``: "the store's
    deletion requests"), refused unless it is a folder of the store's own or absent: never a symbolic
    link (writes through it would go elsewhere) nor a file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    import stat

    if stat.S_ISLNK(mode):
        what = f"a symbolic link (to {os.readlink(path)})"
    elif not stat.S_ISDIR(mode):
        what = "not a folder"
    else:
        return path
    raise FairpipeInputError(NOT_OWN_FOLDER.format(path=path, what=what, role=role))


def check_own_objects(folder: Path, url: str) -> None:
    """Refuse to let garbage collection run over a local store whose object folders hold a
    folder (Icechunk writes only files there): another store, made inside it by hand or by an
    older release, whose objects the collection would delete."""
    for name in OBJECT_FOLDERS:
        try:
            entries = list(os.scandir(folder / name))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                raise FairpipeInputError(FOREIGN.format(url=url, entry=Path(name) / entry.name))
