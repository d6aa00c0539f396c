"""Validation of user-supplied arrays, with messages that name the row and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError

NOT_2D = "{where} expects a 2-dimensional matrix of points. Got an array of shape {shape}."
WRONG_DIM = (
    "{where}: the points have {got} values per row; {expected}-dimensional points were expected."
)
NON_FINITE = "Row {row} of {where} holds {what} in column {col}; points must be finite numbers."
EMPTY = "{where} holds no rows; at least one point is needed."
NON_NUMERIC = "{where} must hold numbers. Got values of type {dtype}."
DUPLICATE_ID = "Id {id} appears more than once in {where} (rows {rows}); ids must be unique."


def check_points(
    X: np.ndarray,
    where: str,
    n_features: int | None = None,
    row_offset: int = 0,
    column_names: list[str] | None = None,
) -> np.ndarray:
    """Return ``X`` as a C-contiguous float32 matrix, or raise naming the first bad row.

    ``row_offset`` is added to reported row numbers, so a chunk can report rows of the whole file;
    ``column_names`` (of a table) name the bad column as well as its position.

    >>> check_points(np.array([[1.0, np.nan]]), where="points.npy")
    Traceback (most recent call last):
    ...
    fairpipe.errors.FairpipeInputError: Row 0 of points.npy holds a NaN value in column 1; points must be finite numbers.
    """
    X = np.asarray(X)
    if X.dtype == object or not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
        raise FairpipeInputError(NON_NUMERIC.format(where=where, dtype=X.dtype))
    if X.ndim != 2:
        raise FairpipeInputError(NOT_2D.format(where=where, shape=X.shape))
    if X.shape[0] == 0:
        raise FairpipeInputError(EMPTY.format(where=where))
    if n_features is not None and X.shape[1] != n_features:
        raise FairpipeInputError(WRONG_DIM.format(where=where, got=X.shape[1], expected=n_features))
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    finite = np.isfinite(X32)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        value = X32[row, col]
        if np.isnan(value):
            what = "a NaN value"
        else:
            what = "an inf value" if value > 0 else "a -inf value"
        if np.isfinite(X[row, col]):
            what = f"a value too large for float32 ({X[row, col]!r})"
        col_text = f"{int(col)}" if column_names is None else f"{int(col)} ({column_names[col]!r})"
        raise FairpipeInputError(
            NON_FINITE.format(row=int(row) + row_offset, where=where, what=what, col=col_text)
        )
    return X32


NEGATIVE_ID = "Id {id} (row {row}) of {where} is negative; ids must be integers >= 0."


def check_unique_ids(ids: np.ndarray, where: str) -> np.ndarray:
    """Return ``ids`` as int64, or raise naming a duplicated id and its rows."""
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise FairpipeInputError(
            f"Ids in {where} must be integers. Got values of type {ids.dtype}."
        )
    ids = ids.astype(np.int64, copy=False)
    if ids.size and ids.min() < 0:
        # Negative ids are refused everywhere: stored trees pad their id arrays with -1.
        row = int(np.argmin(ids))
        raise FairpipeInputError(NEGATIVE_ID.format(id=int(ids[row]), row=row, where=where))
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if dup.size:
        value = sorted_ids[dup[0]]
        rows = np.flatnonzero(ids == value)[:5].tolist()
        raise FairpipeInputError(DUPLICATE_ID.format(id=int(value), where=where, rows=rows))
    return ids


def check_points_and_ids(X, ids, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """Validated points and their ids (row numbers when ``ids`` is None), for ``owner.fit``."""
    X = check_points(X, where=f"{owner}.fit")
    ids = np.arange(X.shape[0], dtype=np.int64) if ids is None else np.asarray(ids)
    if ids.shape != (X.shape[0],):
        raise FairpipeInputError(
            f"{owner}.fit got {ids.shape[0]} ids for {X.shape[0]} points; one id per point is needed."
        )
    return X, check_unique_ids(ids, where=f"{owner}.fit")


class IdLookup:
    """Rows of ids, by binary search over a sorted copy made once (none when the ids are
    already increasing, as assigned ids are: no sort, no copy; at 10M ids the sort took
    0.08-0.35 s and two more arrays of n)."""

    def __init__(self, ids: np.ndarray):
        ids = np.asarray(ids)
        self.order: np.ndarray | None = None
        if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            self.order = np.argsort(ids, kind="stable")
            ids = ids[self.order]
        self.sorted = ids

    def rows(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows of the known ids, which of ``wanted`` are known)."""
        wanted = np.asarray(wanted, dtype=np.int64)
        if self.sorted.size == 0:
            return np.zeros(0, np.int64), np.zeros(wanted.shape, bool)
        pos = np.minimum(np.searchsorted(self.sorted, wanted), self.sorted.size - 1)
        known = self.sorted[pos] == wanted
        return (pos[known] if self.order is None else self.order[pos[known]]), known


def deletion_request(ids, lookup: IdLookup, alive: np.ndarray):
    """Ids to delete, checked: (unique ids, known mask, rows of the known ids, live mask over them).

    Unknown ids and ids already deleted are not errors: the caller reports them.
    """
    ids = np.atleast_1d(np.asarray(ids))
    if ids.size and ids.dtype.kind not in "iu":
        raise FairpipeInputError(f"Ids to delete must be integers. Got {ids.dtype}.")
    ids = np.unique(ids.astype(np.int64))
    rows, known = lookup.rows(ids)
    return ids, known, rows, alive[rows]


def load_npy(path, bad: str, **options) -> np.ndarray:
    """The array in the .npy file ``path`` (``options`` go to ``numpy.load``; pickled objects are
    refused). Raises ``bad`` (a message; ``{why}`` in it becomes the reason) when the file is not
    a .npy array numpy can read."""
    try:
        return np.load(path, allow_pickle=False, **options)
    except (ValueError, OSError, EOFError) as exc:  # not a .npy, cut short, empty, or pickled
        raise FairpipeInputError(bad.replace("{why}", str(exc))) from None


def read_json_object(path: str, missing: str, bad: str) -> dict:
    """The JSON object in the file ``path``. Raises ``missing`` (a message) when there is no such
    file, and ``bad`` (a template with ``{problem}``) when it is not valid JSON or not an object."""
    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(missing)
    try:
        spec = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise FairpipeInputError(bad.format(problem=f"it is not valid JSON ({exc})")) from None
    if not isinstance(spec, dict):
        raise FairpipeInputError(bad.format(problem="it is not an object"))
    return spec
