"""The tree shared by DC-k-means and the fair summary: leaves by hash, recomputation up the tree.

A tree of ``height`` levels of edges and fan-out ``fanout`` has ``fanout ** height`` leaves at
level 0 and one root at level ``height``; node j of level l has the children
``j * fanout .. (j + 1) * fanout - 1`` of level l - 1. A point's leaf is a hash of (seed, id)
modulo the leaf count, so it depends on neither file order nor chunking (and a deletion or an
insertion touches the leaves of the rows it names, nothing else).

:func:`walk_up` is the one recomputation rule of both models: given the leaves that changed,
recompute only their ancestors, level by level.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fairpipe.errors import (
    FairpipeInputError,
    check_int_range,
    check_non_negative_int,
    check_positive_int,
)
from fairpipe.hashing import stable_hash

MAX_LEAVES = 1 << 24
TOO_MANY_LEAVES = (
    "The tree of {owner} has 'fanout' ** 'height' = {fanout} ** {height} leaves; at most {limit} "
    "are supported."
)
LEAF_SALT = 0xDC


def leaf_of(ids: np.ndarray, seed: int, n_leaves: int) -> np.ndarray:
    """The leaf of each id: a hash of (seed, id) modulo the leaf count."""
    return (stable_hash(int(seed), ids, salt=LEAF_SALT) % np.uint64(n_leaves)).astype(np.int64)


def check_tree(fanout, height, owner: str, needs_root_above_leaves: bool = False) -> int:
    """Validate the tree's shape (``height`` >= 1 when ``needs_root_above_leaves``, else >= 0);
    returns its number of leaves."""
    fanout = check_int_range(fanout, "fanout", owner, 2)  # 1: a chain of one child per node
    check_height = check_positive_int if needs_root_above_leaves else check_non_negative_int
    height = check_height(height, "height", owner)
    leaves = fanout**height
    if leaves > MAX_LEAVES:
        raise FairpipeInputError(
            TOO_MANY_LEAVES.format(owner=owner, fanout=fanout, height=height, limit=MAX_LEAVES)
        )
    return leaves


def nodes_per_level(fanout: int, height: int) -> list[int]:
    """Number of nodes at each level, leaves first."""
    return [fanout ** (height - level) for level in range(height + 1)]


def children(nodes: np.ndarray, fanout: int) -> np.ndarray:
    """The children of ``nodes`` (one level down), each node's ``fanout`` children in order."""
    return (np.asarray(nodes, dtype=np.int64)[:, None] * fanout + np.arange(fanout)).ravel()


def walk_up(
    leaves: np.ndarray, fanout: int, height: int, solve_level: Callable[[int, np.ndarray], None]
) -> list[np.ndarray]:
    """Call ``solve_level(level, nodes)`` for the ancestors of ``leaves`` at levels 1..height,
    bottom-up; returns the nodes of every level that changed (level 0: the distinct leaves)."""
    changed = [np.unique(np.asarray(leaves, dtype=np.int64))]
    for level in range(1, height + 1):
        nodes = np.unique(changed[-1] // fanout)
        if nodes.size:
            solve_level(level, nodes)
        changed.append(nodes)
    return changed
