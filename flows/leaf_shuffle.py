"""The shuffle of stored rows by leaf on Dask (DC-k-means and the fair summary): leaves in groups
of about LEAF_BATCH_POINTS points, one job per row chunk splitting its live rows by leaf group,
one job per leaf group solving it.
"""

from __future__ import annotations

import math

import numpy as np

from fairpipe.cluster import LEAF_BATCH_POINTS
from fairpipe.flows.dask_map import dask_client, gather
from fairpipe.storage.rows import RowBlocks, n_features, split_by_leaf_group


def leaf_groups(n_leaves: int, n_alive: int) -> np.ndarray:
    """Edges of runs of consecutive leaves with about LEAF_BATCH_POINTS points each (>= 8 runs
    where there are that many leaves, so the work spreads over the workers)."""
    per_leaf = max(n_alive / max(n_leaves, 1), 1.0)
    size = max(1, min(int(LEAF_BATCH_POINTS // per_leaf), math.ceil(n_leaves / 8)))
    return np.append(np.arange(0, n_leaves, size), n_leaves)


def _pick(parts: dict, g: int):
    return parts.get(g)


def shuffle_by_leaf(session, blocks: RowBlocks, seed, n_leaves, leaves_wanted, solve, args,
                    rows=None) -> list:  # fmt: skip
    """Run ``solve(leaves, *args, d, *parts)`` on Dask for every leaf group of ``leaves_wanted``
    (sorted): one job per block of rows splits its live rows (or only ``rows``) by leaf group, one job
    per leaf group gathers its parts (a shuffle: each worker holds only what passes through it).
    Returns the jobs' results, in group order."""
    d = n_features(session)
    edges = leaf_groups(n_leaves, blocks.n)
    group_of = np.searchsorted(edges, leaves_wanted, side="right") - 1
    chunks = blocks.ranges(rows)  # (only the blocks holding rows of interest, given rows)
    with dask_client() as client:
        split = [
            client.submit(split_by_leaf_group, session, a, b, seed, n_leaves, edges, rows,
                          pure=False)
            for a, b in chunks
        ]  # fmt: skip
        jobs = []
        for g in np.unique(group_of):
            parts = [client.submit(_pick, s, int(g), pure=False) for s in split]
            leaves = leaves_wanted[group_of == g]
            jobs.append(client.submit(solve, leaves, *args, d, *parts, pure=False))
        return gather(client, jobs, also=split)
