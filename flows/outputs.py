"""Output paths (``rerank --out``, ``audit --out``, ``demo --plot``) checked before the work
starts: a search of minutes must not end in an error about where its result goes.

An existing output file is replaced (atomically), as most tools do (``cp``, ``sort -o``, pandas'
``to_csv``): asking for the same output again is the common case (a rerun), and the files
written are results that the same command rebuilds, never the store. Refused: a folder that
does not exist (a typo must not create a tree of folders), a folder where a file is expected and
the reverse, and a place that cannot be written (a read-only filesystem, no permission).
"""

from __future__ import annotations

import os
from pathlib import Path

from fairpipe.errors import FairpipeInputError

NO_PARENT = "The folder {parent} of {option} {path} does not exist; create it first."
NOT_A_FILE = "{option} {path} is a folder; give a file name."
NOT_A_FOLDER = "{option} {path} is a file; give a folder (it is made if its parent exists)."
READ_ONLY = "{option} {path} is on a read-only filesystem; give a path on a writable one."
NOT_WRITABLE = "{option} {path} cannot be written in {folder} (no permission); give another path."
TABLE_KINDS = (".csv", ".parquet")  # the tables a command writes (rerank --out)
BAD_KIND = "{option} must end in {kinds}. Got {path!r}."


def check_output_file(path: str | os.PathLike, option: str, kinds: tuple[str, ...] = ()) -> None:
    """Raise a FairpipeInputError unless a file can be written at ``path`` (``option`` names it
    in the message): its name ends in one of ``kinds`` (if given), its folder exists and is
    writable, and it is not a folder itself."""
    p = Path(path)
    if p.is_dir():
        raise FairpipeInputError(NOT_A_FILE.format(option=option, path=p))
    if kinds and not p.name.lower().endswith(kinds):
        shown = " or ".join(kinds) if len(kinds) < 3 else ", ".join(kinds)
        raise FairpipeInputError(BAD_KIND.format(option=option, kinds=shown, path=str(path)))
    _check_writable(p.parent, p, option)


def check_output_folder(path: str | os.PathLike, option: str) -> None:
    """Raise a FairpipeInputError unless files can be written in the folder ``path``: an
    existing writable folder, or one that can be made in an existing writable folder."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FairpipeInputError(NOT_A_FOLDER.format(option=option, path=p))
    _check_writable(p if p.is_dir() else p.parent, p, option)


def _check_writable(folder: Path, path: Path, option: str) -> None:
    if not folder.is_dir():
        raise FairpipeInputError(NO_PARENT.format(parent=folder, option=option, path=path))
    if os.access(folder, os.W_OK):
        return
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise FairpipeInputError(READ_ONLY.format(option=option, path=path))
    raise FairpipeInputError(NOT_WRITABLE.format(option=option, path=path, folder=folder))
