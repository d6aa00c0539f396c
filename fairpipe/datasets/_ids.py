"""Ids named by users: a comma-separated list, or a file of them.

A file is a ``.npy`` array, a ``.parquet`` file, or text: one id per line or comma separated
(a ``.csv`` may start with a header line; its column ``id`` is read, else its first column).
A bad token is named with its line.

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
NOT_PARQUET = "The ids file {path} is not a readable Parquet file ({why})."
ID_COLUMNS = ("id", "ids", "person_id")  # a CSV or Parquet column read before the first one


def read_ids(text: str | None = None, path: str | None = None) -> np.ndarray:
    """Ids from '1,2,3' or from a file (see the module), as int64 in the order given; a token
    that is not an integer is named (with its line in a file)."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FairpipeInputError(NO_FILE.format(path=path))
        suffix = p.suffix.lower()
        if suffix == ".npy":
            arr = load_npy(p, NOT_NPY.format(path=path))
            if arr.size and arr.dtype.kind not in "iu":
                raise FairpipeInputError(BAD_ID.format(value=arr.ravel()[0].item(), where=path))
            ids = arr.ravel().astype(np.int64)
        elif suffix in (".parquet", ".pq"):
            ids = _parquet_ids(p)
        else:
            ids = _text_ids(p.read_text(errors="replace"), str(path), csv=suffix == ".csv")
        if ids.size == 0:
            raise FairpipeInputError(EMPTY_FILE.format(path=path))
        return ids
    if text is None or not text.strip():
        raise FairpipeInputError(NO_IDS)
    return _ints([t for t in text.split(",") if t.strip()], "--ids")


def _parquet_ids(p: Path) -> np.ndarray:
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(p)
        names = f.schema_arrow.names
        column = next((c for c in ID_COLUMNS if c in names), names[0] if names else None)
        if column is None:
            return np.empty(0, dtype=np.int64)
        values = f.read(columns=[column]).column(0).to_numpy(zero_copy_only=False)
    except Exception as why:  # pyarrow's errors for a file that is not Parquet are many
        raise FairpipeInputError(NOT_PARQUET.format(path=p, why=why)) from None
    if values.size and values.dtype.kind not in "iu":
        bad = values.ravel()[0]
        if values.dtype.kind == "f":
            whole = np.isfinite(values) & (values == np.round(values))
            if whole.all():  # a float column of whole numbers (an int column with nulls read)
                return values.astype(np.int64)
            bad = values[~whole][0]
        raise FairpipeInputError(BAD_ID.format(value=str(bad), where=f"{p} column {column!r}"))
    return values.astype(np.int64)


def _text_ids(body: str, where: str, csv: bool) -> np.ndarray:
    lines = body.splitlines()
    first = 0
    column = 0
    if csv and lines:
        header = [h.strip().strip('"').lower() for h in lines[0].split(",")]
        if not _is_int(header[0]):  # a header line: read its id column
            first = 1
            column = next((header.index(c) for c in ID_COLUMNS if c in header), 0)
            tokens = [ln.split(",")[column] if ln.count(",") >= column else "" for ln in lines[1:]]
            return _ints_by_line(tokens, where, first, skip_blank=True)
    if csv and any("," in ln for ln in lines[:1]):
        # A headerless CSV with several columns: its first one.
        return _ints_by_line([ln.split(",")[0] for ln in lines], where, 0, skip_blank=True)
    tokens = body.replace(",", " ").split()
    try:
        return np.array(tokens, dtype=np.int64)  # the fast path: every token an integer
    except (ValueError, OverflowError):
        pass
    for number, line in enumerate(lines, start=1):
        for t in line.replace(",", " ").split():
            if not _is_int(t):
                raise FairpipeInputError(BAD_ID.format(value=t, where=f"{where} line {number}"))
    raise AssertionError("a token failed to parse but none was found")  # pragma: no cover


def _ints_by_line(tokens: list[str], where: str, offset: int, skip_blank: bool) -> np.ndarray:
    out = []
    for i, t in enumerate(tokens):
        t = t.strip().strip('"')
        if not t and skip_blank:
            continue
        if not _is_int(t):
            raise FairpipeInputError(BAD_ID.format(value=t, where=f"{where} line {i + 1 + offset}"))
        out.append(int(t))
    return np.array(out, dtype=np.int64)


def _is_int(t: str) -> bool:
    try:
        int(t)
        return True
    except ValueError:
        return False


def _ints(tokens, where) -> np.ndarray:
    out = []
    for t in tokens:
        try:
            out.append(int(t.strip()))
        except ValueError:
            raise FairpipeInputError(BAD_ID.format(value=t.strip(), where=where)) from None
    return np.array(out, dtype=np.int64)
