"""Ids named by users: a comma-separated list, or a file of them.

>>> read_ids(text="3, 1,2")
array([3, 1, 2])
>>> read_ids(text="3, x")
Traceback (most recent call last):
...
fairpipe.errors.FairpipeInputError: Id 'x' in --ids is not an integer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.validation import load_npy

NO_IDS = "No ids to forget: give --ids 1,2,3 or --ids-file FILE."
BAD_ID = "Id {value!r} in {where} is not an integer."
NO_FILE = "The ids file {path} does not exist."
EMPTY_FILE = "The ids file {path} holds no ids."
NOT_NPY = "The ids file {path} is not a numeric .npy array (save the ids with numpy.save)."


def read_ids(text: str | None = None, path: str | None = None) -> np.ndarray:
    """Ids from '1,2,3' or from a file (.npy, or text with one id per line or comma separated),
    as int64 in the order given; a token that is not an integer is named."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FairpipeInputError(NO_FILE.format(path=path))
        if p.suffix == ".npy":
            arr = load_npy(p, NOT_NPY.format(path=path))
            if arr.size and arr.dtype.kind not in "iu":
                raise FairpipeInputError(BAD_ID.format(value=arr.ravel()[0].item(), where=path))
            ids = arr.ravel().astype(np.int64)
        else:
            ids = _ints(p.read_text().replace(",", "\n").split(), path)
        if ids.size == 0:
            raise FairpipeInputError(EMPTY_FILE.format(path=path))
        return ids
    if text is None or not text.strip():
        raise FairpipeInputError(NO_IDS)
    return _ints([t for t in text.split(",") if t.strip()], "--ids")


def _ints(tokens, where) -> np.ndarray:
    out = []
    for t in tokens:
        try:
            out.append(int(t.strip()))
        except ValueError:
            raise FairpipeInputError(BAD_ID.format(value=t.strip(), where=where)) from None
    return np.array(out, dtype=np.int64)
