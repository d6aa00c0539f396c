"""What making a store leaves in a local folder: the folders it makes (:func:`make_folders`),
and a creation killed before its first commit, recognised by what it left
(:func:`abandoned_creation`)."""

from __future__ import annotations

import itertools
from pathlib import Path

from fairpipe.storage.arrays import open_group
from fairpipe.storage.lock import LOCK_NAME


def abandoned_creation(repo, local: Path) -> bool:
    """Whether the repository ``repo`` in the folder ``local`` is one a fairpipe creation made and
    was killed (SIGKILL, power loss) before marking as a store: fairpipe's lock file beside it,
    no root group, and no snapshot but the repository's first (its clean-up never ran)."""
    if not (local / LOCK_NAME).exists():
        return False
    try:
        open_group(repo.readonly_session(branch="main"))
        return False  # a root group: someone's data
    except Exception:
        pass
    return sum(1 for _ in itertools.islice(repo.ancestry(branch="main"), 2)) == 1


def make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; return those this call made, outermost first
    (a folder another process made at the same moment is not ours; one it removed meanwhile is
    made again)."""
    made: list[Path] = []
    for _ in range(5):
        missing: list[Path] = []
        at = folder
        while not at.exists():
            missing.append(at)
            if at.parent == at:
                break
            at = at.parent
        try:
            for path in reversed(missing):
                try:
                    path.mkdir()
                except FileExistsError:
                    continue
                made.append(path)
            return made
        except FileNotFoundError:  # a parent removed meanwhile: look again
            continue
    raise FileNotFoundError(f"{folder}: its parent folders keep disappearing")
