"""Stored live rows read by leaf: a row chunk's live rows split by leaf group, the parts of a
leaf group joined, the leaves a deletion batch reaches, and the rows of a few leaves read chunk
by chunk in this process.
"""

from __future__ import annotations

import numpy as np

from fairpipe.storage.rows import RowBlocks, read_live_rows
from fairpipe.tree import gather_parts, leaf_of


def split_by_leaf_group(session, a: int, b: int, seed: int, n_leaves: int, edges: np.ndarray,
                        rows=None) -> dict:  # fmt: skip
    """Live rows of [a, b) (or only ``rows`` of it) split by leaf group:
    {group: (X, ids, leaf, groups)}."""
    X, ids, groups = read_live_rows(session, a, b, rows)
    if ids.size == 0:
        return {}
    leaf = leaf_of(ids, seed, n_leaves)
    group = np.searchsorted(edges, leaf, side="right") - 1
    return {
        int(g): (X[group == g], ids[group == g], leaf[group == g], groups[group == g])
        for g in np.unique(group)
    }


def reached_leaves(all_ids, alive_after, rows, seed: int, n_leaves: int):
    """(the leaves holding the deleted ``rows`` (sorted), the live rows left in them): what a
    deletion batch makes a tree recompute."""
    leaf_all = leaf_of(all_ids, seed, n_leaves)
    leaves = np.unique(leaf_all[rows])
    return leaves, np.flatnonzero(alive_after & np.isin(leaf_all, leaves))


def read_leaf_rows(session, rows: np.ndarray, blocks: RowBlocks, seed: int, n_leaves: int, d: int):
    """(X, ids, leaf, groups) of the stored ``rows`` read in this process, block by block: the
    local twin of the shuffle, for a few leaves."""
    one_group = np.zeros(1, np.int64)
    parts = [
        split_by_leaf_group(session, a, b, seed, n_leaves, one_group, rows).get(0)
        for a, b in blocks.ranges(rows)
    ]
    return gather_parts(d, parts)
