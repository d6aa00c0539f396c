"""The tree engine shared by DC-k-means and the fair summary: the one place a tree is assembled.

A tree of ``height`` levels of edges and fan-out ``fanout`` has ``fanout ** height`` leaves at
level 0 and one root at level ``height``; node j of level l has the children
``j * fanout .. (j + 1) * fanout - 1`` of level l - 1. A point's leaf is a hash of (seed, id)
modulo the leaf count (:func:`leaf_of`), so it depends on neither file order nor chunking (and a
deletion or an insertion touches the leaves of the rows it names, nothing else).

:func:`refresh` is the one assembly rule of both models, for a fit (every leaf) as for a batch
of deletions or appends (the leaves it reaches): the leaves' results are given (solved from
their live rows, in memory or on Dask), leaves left without a live row are emptied, and then
only the ancestors of those leaves are recomputed, level by level. It works through two small
interfaces, so the same rule runs over a tree in memory and over a tree in a store:

- a :class:`NodeStore` reads, writes and empties the nodes of a level, as batches of the
  model's own kind (DC-k-means: centroids and masses arrays; the summary: node outputs);
- a :class:`NodeRule` makes a level's parents from their children's batch.

A tree's stored arrays are named by :func:`level_key` (``level_<j>/<name>``), here only.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.hashing import stable_hash
from fairpipe.settings import FANOUT, HEIGHT, SUMMARY_HEIGHT

MAX_LEAVES = 1 << 24
TOO_MANY_LEAVES = (
    "The tree of {owner} has 'fanout' ** 'height' = {fanout} ** {height} leaves; at most {limit} "
    "are supported."
)
LEAF_SALT = 0xDC


def leaf_of(ids: np.ndarray, seed: int, n_leaves: int) -> np.ndarray:
    """The leaf of each id: a hash of (seed, id) modulo the leaf count."""
    return (stable_hash(int(seed), ids, salt=LEAF_SALT) % np.uint64(n_leaves)).astype(np.int64)


def reached_leaves(all_ids, alive_after, rows, seed: int, n_leaves: int):
    """(the leaves holding the deleted ``rows`` (sorted), the live rows left in them): what a
    deletion batch makes a tree recompute."""
    leaf_all = leaf_of(all_ids, seed, n_leaves)
    leaves = np.unique(leaf_all[rows])
    return leaves, np.flatnonzero(alive_after & np.isin(leaf_all, leaves))


def check_tree(fanout, height, owner: str, needs_root_above_leaves: bool = False) -> int:
    """Validate the tree's shape (``height`` >= 1 when ``needs_root_above_leaves``, else >= 0);
    returns its number of leaves."""
    fanout = FANOUT.check(fanout, owner)  # 1: a chain of one child per node
    height = (HEIGHT if needs_root_above_leaves else SUMMARY_HEIGHT).check(height, owner)
    leaves = fanout**height
    if leaves > MAX_LEAVES:
        raise FairpipeInputError(
            TOO_MANY_LEAVES.format(owner=owner, fanout=fanout, height=height, limit=MAX_LEAVES)
        )
    return leaves


def gather_parts(d: int, given) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One leaf group's parts from every chunk job, concatenated: (X, ids, leaf, groups)."""
    parts = [p for p in given if p is not None]
    if not parts:
        z = np.zeros(0, np.int64)
        return np.zeros((0, d), np.float32), z, z, z.astype(np.int32)
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(4))  # type: ignore[return-value]


def nodes_per_level(fanout: int, height: int) -> list[int]:
    """Number of nodes at each level, leaves first."""
    return [fanout ** (height - level) for level in range(height + 1)]


def children(nodes: np.ndarray, fanout: int) -> np.ndarray:
    """The children of ``nodes`` (one level down), each node's ``fanout`` children in order."""
    return (np.asarray(nodes, dtype=np.int64)[:, None] * fanout + np.arange(fanout)).ravel()


def level_key(level: int, name: str) -> str:
    """The name of a tree's stored array ``name`` at ``level`` (0: the leaves)."""
    return f"level_{int(level)}/{name}"


Batch = TypeVar("Batch")


class NodeStore(Protocol[Batch]):
    """Where a tree's nodes live: a tree in memory, or a tree in a store."""

    def read(self, level: int, nodes: np.ndarray) -> Batch:
        """The nodes ``nodes`` (int64, in that order) of ``level``, as one batch."""
        ...

    def write(self, level: int, nodes: np.ndarray, batch: Batch) -> None:
        """Set the nodes ``nodes`` of ``level`` to ``batch`` (one entry per node, in order)."""
        ...

    def empty(self, level: int, nodes: np.ndarray) -> None:
        """Make the nodes ``nodes`` of ``level`` empty: a leaf without a live row."""
        ...


class NodeRule(Protocol[Batch]):
    """How a tree's parents are made from their children."""

    def parents(self, level: int, nodes: np.ndarray, children: Batch) -> Batch:
        """The nodes ``nodes`` of ``level`` from ``children``: each node's ``fanout`` children
        in order, node after node (as :func:`children` lists them)."""
        ...


def refresh(fanout: int, height: int, leaves, solved: np.ndarray, results, rule: NodeRule,
            store: NodeStore) -> list[np.ndarray]:  # fmt: skip
    """Bring a tree up to date after the leaves ``leaves`` changed (any order, repeats allowed;
    every leaf, for a fit).

    ``solved`` (sorted, distinct, a subset of ``leaves``) are the leaves that hold a live row
    and ``results`` their batch, in that order; the other leaves of ``leaves`` are emptied. Then
    the ancestors of ``leaves``, and nothing else, are made by ``rule`` from their children as
    ``store`` holds them, level by level, and written to ``store``. Returns the nodes recomputed
    per level (level 0: the distinct leaves of ``leaves``)."""
    changed = [np.unique(np.asarray(leaves, dtype=np.int64))]
    solved = np.asarray(solved, dtype=np.int64)
    if changed[0].size:
        store.empty(0, changed[0])
    if solved.size:
        store.write(0, solved, results)
    for level in range(1, int(height) + 1):
        nodes = np.unique(changed[-1] // fanout)
        if nodes.size:
            below = store.read(level - 1, children(nodes, fanout))
            store.write(level, nodes, rule.parents(level, nodes, below))
        changed.append(nodes)
    return changed
