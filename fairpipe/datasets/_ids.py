"""Ids named by users: a comma-separated list, or a file of them.

A file is a ``.npy`` array (one dimension), a ``.parquet`` file, or text: one id per line or
comma separated (a ``.csv`` may start with a header line; its column ``id`` is read, else its
first column). Every id follows the one rule of :func:`fairpipe.validation.check_ids` (integers
from 0 to 2^63 - 1; ``100300.0`` is the id 100300); a bad one is named with its line or row.

>>> read_ids(text="3, 1,2")
array([3, 1, 2])
>>> read_ids(text="3, x")
Traceback (most recent call last):
...
fairpipe.errors.FairpipeInputError: Id 'x' in --ids is not an integer; ids are integers from 0 to 9223372036854775807.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.validation import NO_ID, bad_id, check_ids, id_from_text, is_number_text, load_npy

NO_IDS = "No ids to forget: give --ids 1,2,3 or --ids-file FILE."
EMPTY_ITEM = (
    "Item {i} of the {n} comma-separated items of --ids is empty; give ids separated by single "
    "commas, such as --ids 1,2,3."
)
NO_FILE = "The ids file {path} does not exist."
EMPTY_FILE = "The ids file {path} holds no ids."
NOT_NPY = "The ids file {path} is not a numeric .npy array (save the ids with numpy.save)."
NOT_PARQUET = "The ids file {path} is not a readable Parquet file ({why})."
NOT_TEXT = "The ids file {path} is not UTF-8 text: line {line} holds the byte {byte}."
ID_COLUMNS = ("id", "ids", "person_id")  # a CSV or Parquet column read before the first one


def read_ids(text: str | None = None, path: str | None = None) -> np.ndarray:
    """Ids from '1,2,3' or from a file (see the module), as int64 in the order given; a value
    that is not an id is named (with its line in a text file, its row in another)."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FairpipeInputError(NO_FILE.format(path=path))
        suffix = p.suffix.lower()
        if suffix == ".npy":
            ids = check_ids(load_npy(p, NOT_NPY.format(path=path)), p.name)
        elif suffix in (".parquet", ".pq"):
            ids = _parquet_ids(p)
        else:
            ids = _text_ids(_read_text(p), p.name, csv=suffix == ".csv")
        if ids.size == 0:
            raise FairpipeInputError(EMPTY_FILE.format(path=path))
        return ids
    if text is None or not text.strip(" \t"):
        raise FairpipeInputError(NO_IDS)
    items = text.split(",")
    for i, item in enumerate(items):
        if not item.strip(" \t"):
            raise FairpipeInputError(EMPTY_ITEM.format(i=i + 1, n=len(items)))
    return _ints(items, lambda i: "in --ids")


def _read_text(p: Path) -> str:
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise FairpipeInputError(
            NOT_TEXT.format(path=p, line=line, byte=f"0x{data[e.start]:02x}")
        ) from None


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
    return check_ids(values, f"{p.name} column {column!r}",
                     lambda i: f"in row {i + 1} of {p.name} column {column!r}")  # fmt: skip


def _text_ids(body: str, where: str, csv: bool) -> np.ndarray:
    lines = body.splitlines()
    if csv and lines:
        header = [h.strip().strip('"').lower() for h in lines[0].split(",")]
        if header[0] and not is_number_text(header[0]):  # a header line: its id column is read
            column = next((header.index(c) for c in ID_COLUMNS if c in header), 0)
            return _by_line(lines, 1, column, where)
        if any("," in ln for ln in lines[:1]):  # a headerless CSV of several columns: its first
            return _by_line(lines, 0, 0, where)
    tokens = body.replace(",", " ").split()
    # The fast path, where numpy's reading and the rule of ids agree: ASCII text without the
    # '+' and '_' numpy would read (numpy reads other scripts' digits too).
    if body.isascii() and "+" not in body and "_" not in body:
        try:
            ids = np.array(tokens, dtype=np.int64)  # every token an int64
            if ids.size == 0 or ids.min() >= 0:
                return ids
        except (ValueError, OverflowError):
            pass
    located = [(t, number) for number, line in enumerate(lines, start=1)
               for t in line.replace(",", " ").split()]  # fmt: skip
    return _ints([t for t, _ in located], lambda i: f"on line {located[i][1]} of {where}")


def _by_line(lines: list[str], first: int, column: int, where: str) -> np.ndarray:
    """The ``column``-th field of each non-blank line from ``first`` on."""
    tokens, numbers = [], []
    for number in range(first, len(lines)):
        fields = lines[number].split(",")
        token = fields[column].strip().strip('"') if column < len(fields) else ""
        if token or lines[number].strip():
            tokens.append(token)
            numbers.append(number + 1)
    return _ints(tokens, lambda i: f"on line {numbers[i]} of {where}")


def _ints(tokens: list[str], locate) -> np.ndarray:
    out = np.empty(len(tokens), dtype=np.int64)
    for i, t in enumerate(tokens):
        if not t.strip():
            where = locate(i).split(" ", 1)[1]  # "on line 3 of a.csv" -> "line 3 of a.csv"
            raise FairpipeInputError(NO_ID.format(Where=where[:1].upper() + where[1:]) + ".")
        value, problem = id_from_text(t)
        if value is None:
            raise bad_id(t, locate(i), problem)
        out[i] = value
    return out
