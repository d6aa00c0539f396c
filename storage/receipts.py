"""Receipts of deletion requests, kept in the store's arrays.

One receipt per applied request: its request id, the number of ids it named, the ids the store
never had, its reason, when it was filed and applied, the commit that applied it, and when the
erased rows left history (``erased_at``: None while an earlier snapshot still holds them).
Receipts hold ids and times, never the erased data. They are written in the commit that applies
their request (that is what makes a rerun after a crash skip it), as the UTF-8 JSON of the whole
list in the uint8 array ``receipts/json``.

Which receipt forgot a row is kept per row in the int32 array ``receipts/row_receipt`` (the
receipt's position in the list plus one; 0: never forgotten), written in the same commit: its
chunks holding no forgotten row are never written, and a row beyond its end (appended after the
last forget, or a store made before the array existed) has no receipt recorded.
"""

from __future__ import annotations

import numpy as np

from fairpipe.storage.arrays import (
    create_array,
    open_array,
    open_group,
    read_json_array,
    read_rows_at,
    write_json_array,
)
from fairpipe.storage.writes import rewrite_rows_at

RECEIPTS = "receipts/json"
ROW_RECEIPT = "receipts/row_receipt"
REQUESTS_KEY = "fairpipe_requests"  # commit metadata: the request ids a commit applied


def read_receipts(session) -> list[dict]:
    return read_json_array(session, RECEIPTS)


def write_receipts(root, receipts: list[dict]) -> None:
    write_json_array(root, RECEIPTS, receipts)


def mark_forgotten(session, root, n_rows: int, rows: np.ndarray, numbers: np.ndarray) -> None:
    """Record that ``rows`` (sorted, unique) were forgotten by the receipts at positions
    ``numbers`` (one each, 0-based) of the receipt list."""
    if rows.size == 0:
        return
    if "receipts" in root and "row_receipt" in root["receipts"]:
        arr = root[ROW_RECEIPT]
        if arr.shape[0] < n_rows:
            arr.resize((n_rows,))
    else:
        chunk = int(open_array(session, "alive").chunks[0])
        create_array(root, ROW_RECEIPT, shape=(n_rows,), chunks=(chunk,), dtype="int32",
                     fill_value=0)  # fmt: skip
    values = np.asarray(numbers, dtype=np.int32) + 1
    done = 0

    def edit(chunk: np.ndarray, local: np.ndarray) -> None:
        nonlocal done  # the runs come in increasing row order, one chunk's at a time
        chunk[local] = values[done : done + local.size]
        done += local.size

    rewrite_rows_at(session, ROW_RECEIPT, rows, edit)


def receipts_of_rows(session, rows: np.ndarray) -> np.ndarray:
    """The position in the receipt list of the receipt that forgot each of ``rows``, or -1 where
    none is recorded (only the chunks holding ``rows`` are read)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(rows.shape, -1, dtype=np.int64)
    group = open_group(session)
    if rows.size == 0 or "receipts" not in group or "row_receipt" not in group["receipts"]:
        return out
    inside = rows < open_array(session, ROW_RECEIPT).shape[0]
    if inside.any():
        out[inside] = read_rows_at(session, ROW_RECEIPT, rows[inside]).astype(np.int64) - 1
    return out
