"""DC-k-means: divide-and-conquer k-means whose deletions recompute only leaf-to-root paths.

Ginart, Guan, Valiant, Zou, "Making AI Forget You: Data Deletion in Machine Learning" (NeurIPS
2019), Section 4.2, with the parents weighting their children's centroids by mass (the paper's
suggested extension) and the authors' layer bug absent.

The tree has ``height`` levels of edges and fan-out ``width``: ``width ** height`` leaves at level 0,
one root at level ``height``. A point's leaf is a hash of (seed, id) modulo the leaf count, so it
depends on neither file order nor chunking. Each leaf runs weighted k-means++ and ``iterations``
Lloyd steps on its points (weight 1 each, sorted by id); each parent does the same on its
children's centroids weighted by their masses; the root takes the best of ``n_init`` restarts.
All randomness is a hash of (seed, level, node, restart, step) (:mod:`fairpipe.batched_kmeans`).

Deletion equivalence: a node's result is a function of the seed and its own inputs only, and the
batched kernel gives bit-identical results whatever the batch, so deleting ids and recomputing
their leaves and those leaves' ancestors gives exactly the arrays of a fresh fit on the remaining
points. A leaf holding at most k points keeps them as its centroids (mass 1 each) and pads the
other slots with zero-mass centroids, which its parent ignores; an empty leaf has zero mass.

>>> X = np.random.default_rng(0).normal(size=(400, 3))
>>> model = DCKMeans(n_clusters=3, width=4, height=2, seed=1).fit(X)
>>> report = model.delete([5, 17])
>>> bool(np.array_equal(model.centroids_, DCKMeans(n_clusters=3, width=4, height=2, seed=1)
...     .fit(np.delete(X, [5, 17], axis=0), ids=np.delete(np.arange(400), [5, 17])).centroids_))
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fairpipe.batched_kmeans import nearest, solve_batch
from fairpipe.errors import FairpipeInputError, check_positive_int
from fairpipe.hashing import stable_hash
from fairpipe.validation import (
    IdLookup,
    check_points,
    check_points_and_ids,
    deletion_request,
)

NOT_FITTED = "This DCKMeans instance is not fitted yet. Call 'fit' first."
TOO_MANY_LEAVES = (
    "The tree of DCKMeans has width ** height = {leaves} leaves; at most {limit} are supported."
)
K_TOO_LARGE = "The 'n_clusters' parameter of DCKMeans is {k}, but the data has only {n} points."
MAX_LEAVES = 1 << 24
# Points per kernel call when solving leaves (bounds memory, not results: see batched_kmeans).
LEAF_BATCH_POINTS = 200_000


def leaf_of(ids: np.ndarray, seed: int, n_leaves: int) -> np.ndarray:
    """The leaf of each id: a hash of (seed, id) modulo the leaf count."""
    return (stable_hash(int(seed), ids, salt=0xDC) % np.uint64(n_leaves)).astype(np.int64)


def node_keys(level: int, nodes: np.ndarray, restart: int | np.ndarray = 0) -> np.ndarray:
    """Stable 64-bit key of (level, node, restart): picks the node's random numbers (restart and
    nodes broadcast together)."""
    return (
        (np.uint64(level) << np.uint64(56))
        | (np.asarray(restart).astype(np.uint64) << np.uint64(40))
        | np.asarray(nodes).astype(np.uint64)
    )


def solve_leaves(points, ids, leaf, leaves, k, iterations, seed):
    """Centroids (len(leaves), k, d) and masses of the given leaves from their points.

    ``points``, ``ids`` and ``leaf`` are the live rows of those leaves and no others, in any
    order; each leaf is solved on its rows sorted by id.
    Leaves are solved in batches of about ``LEAF_BATCH_POINTS`` points.
    """
    leaves = np.asarray(leaves, dtype=np.int64)
    order = np.lexsort((ids, leaf))  # by leaf, then id
    points, leaf = points[order], leaf[order]
    sizes = np.bincount(np.searchsorted(leaves, leaf), minlength=leaves.shape[0])
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    centroids = np.zeros((leaves.shape[0], k, points.shape[1]))
    masses = np.zeros((leaves.shape[0], k))
    a = 0
    while a < leaves.shape[0]:
        b = int(np.searchsorted(bounds, bounds[a] + LEAF_BATCH_POINTS, side="right")) - 1
        b = max(b, a + 1)
        res = solve_batch(
            points[bounds[a] : bounds[b]],
            np.ones(int(bounds[b] - bounds[a])),
            sizes[a:b],
            node_keys(0, leaves[a:b]),
            k,
            iterations,
            seed,
        )
        centroids[a:b], masses[a:b] = res.centroids, res.masses
        a = b
    return centroids, masses


def solve_parents(child_centroids, child_masses, nodes, level, width, k, iterations, n_init, seed):
    """Centroids and masses of ``nodes`` at ``level`` from their children's (best of n_init).

    ``child_centroids`` (nodes * width, k, d) and ``child_masses`` hold each node's ``width``
    children in order.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    d = child_centroids.shape[-1]
    m = width * k  # points of one node: its children's centroids
    # Restart r of node i is problem r * len(nodes) + i; restarts share their node's rows.
    sizes = np.full(nodes.shape[0] * n_init, m, dtype=np.int64)
    starts = np.tile(np.arange(nodes.shape[0], dtype=np.int64) * m, n_init)
    keys = node_keys(level, nodes[None, :], np.arange(n_init)[:, None]).ravel()
    res = solve_batch(
        child_centroids.reshape(-1, d), child_masses.ravel(), sizes, keys, k, iterations, seed,
        starts=starts,
    )  # fmt: skip
    loss = res.loss.reshape(n_init, nodes.shape[0])
    best = loss.argmin(axis=0)  # ties: the lowest restart
    pick = best * nodes.shape[0] + np.arange(nodes.shape[0])
    return res.centroids[pick], res.masses[pick]


@dataclass
class DeletionReport:
    deleted: np.ndarray  # ids removed by this call
    unknown: np.ndarray  # ids not in the model
    already_deleted: np.ndarray  # ids deleted before (a no-op)
    changed: list[np.ndarray] = field(default_factory=list)  # per level, node numbers recomputed

    @property
    def leaves_recomputed(self) -> int:
        return int(self.changed[0].shape[0]) if self.changed else 0

    @property
    def nodes_recomputed(self) -> int:
        return int(sum(c.shape[0] for c in self.changed))


class DCKMeans:
    """Divide-and-conquer k-means tree with exact (bit-identical) batch deletion.

    Parameters
    ----------
    n_clusters : int
        k, the centroids per node (and of the model, at the root).
    width, height : int
        Fan-out and number of levels below the root (``width ** height`` leaves).
    iterations : int
        Lloyd iterations after k-means++ at every node.
    n_init : int
        Restarts at the root (the best weighted loss wins).
    seed : int
        Seed of the leaf assignment and of every node's random draws.
    """

    def __init__(
        self,
        n_clusters: int = 8,
        width: int = 8,
        height: int = 1,
        iterations: int = 10,
        n_init: int = 10,
        seed: int = 0,
    ):
        self.n_clusters = n_clusters
        self.width = width
        self.height = height
        self.iterations = iterations
        self.n_init = n_init
        self.seed = seed

    # -- fitting -------------------------------------------------------------------------------
    def _check_params(self) -> None:
        owner = "DCKMeans"
        for name in ("n_clusters", "width", "height", "iterations", "n_init"):
            check_positive_int(getattr(self, name), name, owner)
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool):
            raise FairpipeInputError(
                f"The 'seed' parameter of DCKMeans must be an integer. Got {self.seed!r} instead."
            )
        leaves = int(self.width) ** int(self.height)
        if leaves > MAX_LEAVES:
            raise FairpipeInputError(TOO_MANY_LEAVES.format(leaves=leaves, limit=MAX_LEAVES))

    def fit(self, X: np.ndarray, ids: np.ndarray | None = None) -> DCKMeans:
        self._check_params()
        X, ids = check_points_and_ids(X, ids, "DCKMeans")
        if self.n_clusters > X.shape[0]:
            raise FairpipeInputError(K_TOO_LARGE.format(k=self.n_clusters, n=X.shape[0]))
        self.n_leaves_ = int(self.width) ** int(self.height)
        self.points_ = X
        self.ids_ = ids
        self._ids = IdLookup(ids)
        self.alive_ = np.ones(X.shape[0], dtype=bool)
        self.leaf_of_ = self._leaf_of(ids)
        k, d = self.n_clusters, X.shape[1]
        self.centroids_by_level_ = []
        self.masses_by_level_ = []
        for level in range(self.height + 1):
            nodes = self.n_leaves_ // self.width**level
            self.centroids_by_level_.append(np.zeros((nodes, k, d)))
            self.masses_by_level_.append(np.zeros((nodes, k)))
        self._recompute(np.arange(self.n_leaves_))
        return self

    @classmethod
    def from_arrays(cls, params: dict, points, ids, alive, centroids_by_level, masses_by_level):
        """Rebuild a fitted model from stored arrays (as written by a fit; not re-validated)."""
        model = cls(**params)
        model.n_leaves_ = int(model.width) ** int(model.height)
        model.points_ = points
        model.ids_ = np.asarray(ids)
        model._ids = IdLookup(model.ids_)
        model.alive_ = np.asarray(alive, dtype=bool).copy()
        model.leaf_of_ = model._leaf_of(model.ids_)
        model.centroids_by_level_ = [np.array(c, dtype=np.float64) for c in centroids_by_level]
        model.masses_by_level_ = [np.array(m, dtype=np.float64) for m in masses_by_level]
        return model

    def _leaf_of(self, ids: np.ndarray) -> np.ndarray:
        return leaf_of(ids, int(self.seed), self.n_leaves_)

    def params(self) -> dict:
        return {
            "n_clusters": int(self.n_clusters),
            "width": int(self.width),
            "height": int(self.height),
            "iterations": int(self.iterations),
            "n_init": int(self.n_init),
            "seed": int(self.seed),
        }

    def _check_fitted(self) -> None:
        if not hasattr(self, "centroids_by_level_"):
            raise FairpipeInputError(NOT_FITTED)

    @property
    def centroids_(self) -> np.ndarray:
        self._check_fitted()
        return self.centroids_by_level_[-1][0]

    @property
    def masses_(self) -> np.ndarray:
        self._check_fitted()
        return self.masses_by_level_[-1][0]

    # -- the tree ------------------------------------------------------------------------------
    def _recompute(self, leaves: np.ndarray) -> list[np.ndarray]:
        """Recompute these leaves, then their ancestors level by level; the nodes, per level."""
        changed = [np.unique(leaves)]
        self._solve_leaves(changed[0])
        for level in range(1, self.height + 1):
            nodes = np.unique(changed[-1] // self.width)
            self._solve_parents(level, nodes)
            changed.append(nodes)
        return changed

    def _solve_leaves(self, leaves: np.ndarray) -> None:
        if leaves.size == 0:
            return
        rows = self._live_rows(leaves)
        c, m = solve_leaves(
            self.points_[rows], self.ids_[rows], self.leaf_of_[rows], leaves,
            self.n_clusters, self.iterations, int(self.seed),
        )  # fmt: skip
        self.centroids_by_level_[0][leaves] = c
        self.masses_by_level_[0][leaves] = m

    def _live_rows(self, leaves: np.ndarray) -> np.ndarray:
        """Rows of these (sorted, distinct) leaves that are still alive, from a by-leaf index."""
        if not hasattr(self, "_by_leaf"):
            self._by_leaf = np.argsort(self.leaf_of_, kind="stable")
            self._leaf_start = np.zeros(self.n_leaves_ + 1, dtype=np.int64)
            np.cumsum(
                np.bincount(self.leaf_of_, minlength=self.n_leaves_), out=self._leaf_start[1:]
            )
        if leaves.shape[0] == self.n_leaves_:
            rows = self._by_leaf
        else:
            lo, hi = self._leaf_start[leaves], self._leaf_start[leaves + 1]
            lengths = hi - lo
            shift = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)
            rows = self._by_leaf[shift + np.arange(int(lengths.sum()))]
        return rows[self.alive_[rows]]

    def _solve_parents(self, level: int, nodes: np.ndarray) -> None:
        w = self.width
        children = (nodes[:, None] * w + np.arange(w)).ravel()
        c, m = solve_parents(
            self.centroids_by_level_[level - 1][children],
            self.masses_by_level_[level - 1][children],
            nodes, level, w, self.n_clusters, self.iterations, self.n_init, int(self.seed),
        )  # fmt: skip
        self.centroids_by_level_[level][nodes] = c
        self.masses_by_level_[level][nodes] = m

    # -- deletion and prediction ---------------------------------------------------------------
    def delete(self, ids) -> DeletionReport:
        """Delete a batch of ids: recompute their leaves, then only those leaves' ancestors."""
        self._check_fitted()
        ids, known, rows, live = deletion_request(ids, self._ids, self.alive_)
        report = DeletionReport(
            deleted=ids[known][live], unknown=ids[~known], already_deleted=ids[known][~live]
        )
        rows = rows[live]
        if rows.size == 0:
            report.changed = [np.zeros(0, np.int64) for _ in range(self.height + 1)]
            return report
        self.alive_[rows] = False
        report.changed = self._recompute(self.leaf_of_[rows])
        return report

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Index of the nearest root centroid (among those with positive mass) for each row."""
        self._check_fitted()
        X = check_points(X, where="DCKMeans.predict", n_features=self.points_.shape[1])
        return nearest(X, self.centroids_, self.masses_ > 0)[0]

    def loss(self, X: np.ndarray) -> float:
        """k-means loss of ``X`` against the root centroids (sum of squared distances)."""
        self._check_fitted()
        X = check_points(X, where="DCKMeans.loss", n_features=self.points_.shape[1])
        return float(nearest(X, self.centroids_, self.masses_ > 0)[1].sum())
