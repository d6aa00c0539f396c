"""The fair summary in the store: ``summary/``.

- ``summary/level_<j>/candidates`` int64 (nodes_j, k + sum l): each node's candidates (the ids it
  passes to its parent, in stream order), padded with -1; level 0 = leaves, the last = the root.
- ``summary/level_<j>/evaluation`` int64 (nodes_j, eval_size): each node's evaluation ids, padded.
- ``summary/level_<j>/value`` float64 and ``calls`` int64 (nodes_j,): the node's utility and its
  gain evaluations.
- ``summary/ids`` int64: the root's summary, sorted. Parameters and the summary's figures (bounds,
  counts per group, error, value) in ``summary`` attributes.

Only ids are stored: a node's points are read back from ``points`` when a deletion recomputes its
parent.
"""

from __future__ import annotations

import numpy as np

from storage.store import _zarr, read_array
from storage.tree import _replace

NO_SUMMARY = (
    "The store {url} has no summary. Run 'fairpipe summarize --store {url} --k K --lower L "
    "--upper U' first."
)


def padded(rows: list[np.ndarray], width: int) -> np.ndarray:
    """Ragged id lists as one (len(rows), width) int64 array padded with -1."""
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def unpadded(row: np.ndarray) -> np.ndarray:
    return row[row >= 0]


def write_summary(root, attrs: dict, levels: list[dict[str, np.ndarray]], ids: np.ndarray) -> None:
    """Write (replacing any earlier one) a whole summary tree into an open store root."""
    if "summary" in root:
        del root["summary"]
    group = root.create_group("summary")
    group.attrs.update(attrs)
    for j, arrays in enumerate(levels):
        for name, values in arrays.items():
            _replace(root, f"summary/level_{j}/{name}", values)
    _replace(root, "summary/ids", np.asarray(ids, dtype=np.int64))


def update_summary(root, level: int, nodes: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
    """Overwrite some nodes of one level (a deletion batch's recomputed path)."""
    for name, values in arrays.items():
        arr = _zarr().open_array(root.store, path=f"summary/level_{level}/{name}", mode="r+")
        arr[nodes] = values


def write_root(root, attrs: dict, ids: np.ndarray) -> None:
    _replace(root, "summary/ids", np.asarray(ids, dtype=np.int64))
    root["summary"].attrs.update(attrs)


def has_summary(session) -> bool:
    return "summary" in _zarr().open_group(session.store, mode="r")


def summary_attrs(session) -> dict:
    return dict(_zarr().open_group(session.store, mode="r")["summary"].attrs)


def read_level(session, level: int, name: str, nodes=slice(None)) -> np.ndarray:
    return read_array(session, f"summary/level_{level}/{name}", nodes)


def read_summary_ids(session) -> np.ndarray:
    return read_array(session, "summary/ids")


def read_rows(session, name: str, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (sorted or not) of array ``name``: only the chunks holding them are read."""
    arr = _zarr().open_array(session.store, path=name, mode="r")
    if rows.size == 0:
        return np.zeros((0, *arr.shape[1:]), dtype=arr.dtype)
    sel = (np.asarray(rows, dtype=np.int64),) + (slice(None),) * (arr.ndim - 1)
    return np.asarray(arr.get_orthogonal_selection(sel))
