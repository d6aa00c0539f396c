"""DC-k-means: divide-and-conquer k-means whose deletions recompute only leaf-to-root paths.

Ginart, Guan, Valiant, Zou, "Making AI Forget You: Data Deletion in Machine Learning" (NeurIPS
2019), Section 4.2, with the parents weighting their children's centroids by mass (the paper's
suggested extension) and the authors' layer bug absent.

The tree (:mod:`fairpipe.tree`) has ``height`` levels of edges and fan-out ``fanout``:
``fanout ** height`` leaves at level 0, one root at level ``height``. A point's leaf is a hash of
(seed, id) modulo the leaf count, so it depends on neither file order nor chunking. Each leaf runs
weighted k-means++ and up to ``max_iter`` Lloyd steps on its points (weight 1 each, sorted by id);
each parent does the same on its children's centroids weighted by their masses, keeping the best
of ``n_init`` restarts. All randomness is a hash of (seed, level, node, restart, step)
(:mod:`fairpipe.cluster._batched_kmeans`).

Deletion equivalence: a node's result is a function of the seed and its own inputs only, and the
batched kernel gives bit-identical results whatever the batch, so deleting ids and recomputing
their leaves and those leaves' ancestors gives exactly the arrays of a fresh fit on the remaining
points. A leaf holding at most k points keeps them as its centroids (mass 1 each) and pads the
other slots with zero-mass centroids, which its parent ignores; an empty leaf has zero mass.

The tree is assembled by :func:`fairpipe.tree.refresh` over a :class:`LevelArrays` node store
with the :class:`ParentRule`. The flows solve leaves on Dask (:func:`solve_leaves`) and hand
them to :meth:`DCKMeans.from_leaves` (a fit) or :meth:`DCKMeans.refresh_leaves` (a batch), the
path :class:`DCKMeans` takes itself, so a store's tree has the bits of the in-memory model.

>>> X = np.random.default_rng(0).normal(size=(400, 3))
>>> model = DCKMeans(n_clusters=3, fanout=4, height=2, seed=1).fit(X)
>>> report = model.delete([5, 17])
>>> fresh = DCKMeans(n_clusters=3, fanout=4, height=2, seed=1)
>>> bool(np.array_equal(model.centroids_,
...      fresh.fit(np.delete(X, [5, 17], axis=0), ids=np.delete(np.arange(400), [5, 17])).centroids_))
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fairpipe.base import DeletionReport, rows_from_arrays
from fairpipe.cluster._batched_kmeans import KMeansParameters, nearest, solve_batch
from fairpipe.errors import K_TOO_LARGE, FairpipeInputError
from fairpipe.settings import DC_KMEANS, FANOUT, HEIGHT
from fairpipe.tree import (
    NodeStore,
    check_tree,
    gather_parts,
    leaf_of,
    level_key,
    nodes_per_level,
    refresh,
)
from fairpipe.validation import check_estimator_points, check_points_and_ids

# Points per kernel call when solving leaves (bounds memory, not results: see _batched_kmeans).
LEAF_BATCH_POINTS = 200_000
BAD_TREE_ARRAYS = "DCKMeans.from_arrays: {problem}."


def node_keys(level: int, nodes: np.ndarray, restart: int | np.ndarray = 0) -> np.ndarray:
    """Stable 64-bit key of (level, node, restart): picks the node's random numbers (restart and
    nodes broadcast together)."""
    return (
        (np.uint64(level) << np.uint64(56))
        | (np.asarray(restart).astype(np.uint64) << np.uint64(40))
        | np.asarray(nodes).astype(np.uint64)
    )


def solve_leaves(points, ids, leaf, leaves, n_clusters, max_iter, seed):
    """Centroids (len(leaves), k, d) and masses of the given (sorted) leaves from their points.

    ``points``, ``ids`` and ``leaf`` are the live rows of those leaves and no others, in any
    order; each leaf is solved on its rows sorted by id. Leaves are solved in batches of about
    ``LEAF_BATCH_POINTS`` points.
    """
    leaves = np.asarray(leaves, dtype=np.int64)
    k = int(n_clusters)
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
            points[bounds[a] : bounds[b]], np.ones(int(bounds[b] - bounds[a])), sizes[a:b],
            node_keys(0, leaves[a:b]), k, max_iter, seed,
        )  # fmt: skip
        centroids[a:b], masses[a:b] = res.centroids, res.masses
        a = b
    return centroids, masses


def solve_parents(child_centroids, child_masses, nodes, level, fanout, n_clusters, max_iter,
                  n_init, seed):  # fmt: skip
    """Centroids and masses of ``nodes`` at ``level`` from their children's (best of n_init).

    ``child_centroids`` (nodes * fanout, k, d) and ``child_masses`` hold each node's ``fanout``
    children in order.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    d = child_centroids.shape[-1]
    m = fanout * n_clusters  # points of one node: its children's centroids
    # Restart r of node i is problem r * len(nodes) + i; restarts share their node's rows.
    sizes = np.full(nodes.shape[0] * n_init, m, dtype=np.int64)
    starts = np.tile(np.arange(nodes.shape[0], dtype=np.int64) * m, n_init)
    keys = node_keys(level, nodes[None, :], np.arange(n_init)[:, None]).ravel()
    res = solve_batch(
        child_centroids.reshape(-1, d), child_masses.ravel(), sizes, keys, n_clusters, max_iter,
        seed, starts=starts,
    )  # fmt: skip
    loss = res.loss.reshape(n_init, nodes.shape[0])
    best = loss.argmin(axis=0)  # ties: the lowest restart
    pick = best * nodes.shape[0] + np.arange(nodes.shape[0])
    return res.centroids[pick], res.masses[pick]


def solve_leaf_group(leaves, k, max_iter, seed, d, *given):
    """A leaf group's job: gather its rows from the chunk jobs' parts and solve its leaves."""
    X, ids, leaf, _ = gather_parts(d, given)
    mine = np.isin(leaf, leaves)
    return leaves, *solve_leaves(X[mine], ids[mine], leaf[mine], leaves, k, max_iter, seed)


@dataclass
class LevelArrays:
    """A DC-k-means tree in memory, as a node store (:class:`fairpipe.tree.NodeStore`): per
    level, leaves first, ``centroids`` (nodes, k, d) and ``masses`` (nodes, k); a batch is a
    (centroids, masses) pair."""

    centroids: list[np.ndarray]
    masses: list[np.ndarray]

    @classmethod
    def zeros(cls, fanout: int, height: int, n_clusters: int, d: int) -> LevelArrays:
        sizes = nodes_per_level(int(fanout), int(height))
        return cls([np.zeros((nodes, n_clusters, d)) for nodes in sizes],
                   [np.zeros((nodes, n_clusters)) for nodes in sizes])  # fmt: skip

    def read(self, level: int, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.centroids[level][nodes], self.masses[level][nodes]

    def write(self, level: int, nodes: np.ndarray, batch: tuple[np.ndarray, np.ndarray]) -> None:
        self.centroids[level][nodes], self.masses[level][nodes] = batch

    def empty(self, level: int, nodes: np.ndarray) -> None:
        self.centroids[level][nodes] = 0.0
        self.masses[level][nodes] = 0.0


@dataclass(frozen=True)
class ParentRule:
    """DC-k-means' parents (:class:`fairpipe.tree.NodeRule`): weighted k-means over their
    children's centroids, best of ``n_init`` restarts (:func:`solve_parents`)."""

    fanout: int
    n_clusters: int
    max_iter: int
    n_init: int
    seed: int

    def parents(self, level: int, nodes: np.ndarray, children) -> tuple[np.ndarray, np.ndarray]:
        c, m = children
        return solve_parents(c, m, nodes, level, self.fanout, self.n_clusters, self.max_iter,
                             self.n_init, self.seed)  # fmt: skip


def tree_arrays(centroids: list[np.ndarray], masses: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A tree's levels as ``to_arrays`` names them: ``level_<j>/centroids`` and ``/masses``."""
    out = {}
    for level, (c, m) in enumerate(zip(centroids, masses)):
        names = level_arrays(level)
        out[names[0]] = np.asarray(c, dtype=np.float64)
        out[names[1]] = np.asarray(m, dtype=np.float64)
    return out


def level_arrays(level: int) -> tuple[str, str]:
    """The names of one level's arrays, as :func:`tree_arrays` gives them: (centroids, masses)."""
    return level_key(level, "centroids"), level_key(level, "masses")


def tree_array_names(height: int) -> list[str]:
    """The names :func:`tree_arrays` gives a tree of ``height``, level by level."""
    return [name for j in range(int(height) + 1) for name in level_arrays(j)]


def refresh_levels(
    params: dict, levels: NodeStore, leaves, solved, centroids, masses
) -> list[np.ndarray]:
    """Bring the DC-k-means tree of parameters ``params`` that ``levels`` holds (a node store:
    :class:`LevelArrays` in memory, or a store's levels) up to date after the leaves ``leaves``
    changed: ``solved`` the leaves holding a live row (sorted), their ``centroids`` and
    ``masses`` (:func:`solve_leaves`); the other leaves of ``leaves`` become empty, then only
    their ancestors are recomputed (:func:`fairpipe.tree.refresh`, with :class:`ParentRule`).
    Returns the nodes recomputed, per level."""
    rule = ParentRule(int(params["fanout"]), int(params["n_clusters"]), int(params["max_iter"]),
                      int(params["n_init"]), int(params["seed"]))  # fmt: skip
    return refresh(int(params["fanout"]), int(params["height"]), leaves, solved,
                   (centroids, masses), rule, levels)  # fmt: skip


@dataclass(kw_only=True, repr=False, eq=False)
class DCKMeans(KMeansParameters):
    """Divide-and-conquer k-means tree with exact (bit-identical) batch deletion.

    Parameters
    ----------
    n_clusters : int
        k, the centroids per node (and of the model, at the root).
    fanout, height : int
        Children per node and levels below the root (``fanout ** height`` leaves).
    max_iter : int
        Most Lloyd iterations after k-means++ at every node.
    n_init : int
        Restarts of every internal node (the best weighted loss wins).
    seed : int
        Seed of the leaf assignment and of every node's random draws.
    """

    _fitted_attribute = "centroids_by_level_"
    _settings = DC_KMEANS

    fanout: int = FANOUT.default
    height: int = HEIGHT.default

    # -- fitting -------------------------------------------------------------------------------
    def _check_params(self) -> int:
        """Validate the parameters; returns the number of leaves."""
        self._check_kmeans_params()
        return check_tree(self.fanout, self.height, "DCKMeans", needs_root_above_leaves=True)

    def fit(self, X: np.ndarray, y=None, *, ids: np.ndarray | None = None) -> DCKMeans:
        """Build the tree on the rows of ``X`` (``ids``: one per row, default the row numbers;
        ``y`` is ignored, as by scikit-learn's clustering estimators)."""
        n_leaves = self._check_params()
        X, ids = check_points_and_ids(X, ids, "DCKMeans")
        if self.n_clusters > X.shape[0]:
            raise FairpipeInputError(
                K_TOO_LARGE.format(name="n_clusters", k=self.n_clusters, n=X.shape[0],
                                   what="points given to DCKMeans.fit")
            )  # fmt: skip
        self._set_rows(X, ids)
        self.n_leaves_ = n_leaves
        self.n_features_in_ = X.shape[1]
        self.leaf_of_ = leaf_of(ids, int(self.seed), n_leaves)
        self._empty_tree(X.shape[1])
        self._recompute(np.arange(n_leaves))
        return self

    @classmethod
    def from_leaves(cls, n_features: int, solved, centroids, masses, **params) -> DCKMeans:
        """A fitted tree from its leaves' results, solved elsewhere (the fit flow solves them on
        Dask, :func:`solve_leaves`): ``solved`` the leaves holding a live row (sorted), their
        ``centroids`` and ``masses``; every other leaf is empty. Without the rows: it predicts,
        and :meth:`refresh_leaves` keeps it up to date."""
        model = cls(**params)
        model.n_leaves_ = model._check_params()
        model._empty_tree(int(n_features))
        model.refresh_leaves(np.arange(model.n_leaves_), solved, centroids, masses)
        return model

    def _empty_tree(self, d: int) -> None:
        self.n_features_in_ = int(d)
        tree = LevelArrays.zeros(int(self.fanout), int(self.height), int(self.n_clusters), d)
        self.centroids_by_level_, self.masses_by_level_ = tree.centroids, tree.masses

    # -- persistence ---------------------------------------------------------------------------
    def to_arrays(self, data: bool = True) -> dict[str, np.ndarray]:
        """``level_<j>/centroids`` and ``level_<j>/masses`` for every level (0: the leaves), and
        with ``data`` the rows (``points``, ``ids``, ``alive``)."""
        self._check_fitted()
        return {**tree_arrays(self.centroids_by_level_, self.masses_by_level_),
                **self._row_arrays(data)}  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], **params) -> DCKMeans:
        """A fitted model from :meth:`to_arrays` output and the constructor parameters (trusted:
        written by a fit; only the tree's shape is checked)."""
        model = cls(**params)
        n_leaves = model._check_params()
        levels = int(model.height) + 1
        expected = nodes_per_level(int(model.fanout), int(model.height))
        for level in range(levels):
            for name in ("centroids", "masses"):
                key = level_key(level, name)
                if key not in arrays:
                    raise FairpipeInputError(BAD_TREE_ARRAYS.format(problem=f"{key!r} is missing"))
                if np.shape(arrays[key])[0] != expected[level]:
                    raise FairpipeInputError(BAD_TREE_ARRAYS.format(
                        problem=f"{key!r} has {np.shape(arrays[key])[0]} nodes; a tree of fanout "
                        f"{model.fanout} and height {model.height} has {expected[level]}"))  # fmt: skip
        model.centroids_by_level_ = [
            np.array(arrays[level_key(j, "centroids")], dtype=np.float64) for j in range(levels)
        ]
        model.masses_by_level_ = [
            np.array(arrays[level_key(j, "masses")], dtype=np.float64) for j in range(levels)
        ]
        model.n_leaves_ = n_leaves
        model.n_features_in_ = int(model.centroids_by_level_[0].shape[2])
        rows = rows_from_arrays(arrays)
        if rows is not None:
            model._set_rows(rows["points"], rows["ids"], rows.get("alive"))
            model.leaf_of_ = leaf_of(model.ids_, int(model.seed), n_leaves)
        return model

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
        """Recompute these leaves from their live rows, then their ancestors level by level;
        the nodes, per level."""
        leaves = np.unique(leaves)
        rows = self._live_rows(leaves)
        c, m = solve_leaves(
            self.points_[rows], self.ids_[rows], self.leaf_of_[rows], leaves,
            self.n_clusters, self.max_iter, int(self.seed),
        )  # fmt: skip
        return self.refresh_leaves(leaves, leaves, c, m)

    def refresh_leaves(self, leaves, solved, centroids, masses) -> list[np.ndarray]:
        """Bring the tree up to date after the leaves ``leaves`` changed, from their results
        solved elsewhere (:func:`solve_leaves` on the live rows of ``leaves``): ``solved`` the
        leaves holding a live row (sorted), their ``centroids`` and ``masses``; the other leaves
        of ``leaves`` become empty. Then only their ancestors are recomputed
        (:func:`fairpipe.tree.refresh`). Returns the nodes recomputed, per level."""
        self._check_fitted()
        tree = LevelArrays(self.centroids_by_level_, self.masses_by_level_)
        return refresh_levels(self.get_params(), tree, leaves, solved, centroids, masses)

    def _live_rows(self, leaves: np.ndarray) -> np.ndarray:
        """Rows of these (sorted, distinct) leaves that are still alive, from a by-leaf index."""
        if "_by_leaf" not in self.__dict__:
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

    # -- deletion and prediction ---------------------------------------------------------------
    def delete(self, ids) -> DeletionReport:
        """Delete a batch of ids: recompute their leaves, then only those leaves' ancestors."""
        report, rows = self._start_deletion(ids)
        if rows.size == 0:
            report.changed = [np.zeros(0, np.int64) for _ in range(int(self.height) + 1)]
            return report
        report.changed = self._recompute(self.leaf_of_[rows])
        return report

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Index of the nearest root centroid (among those with positive mass) for each row."""
        self._check_fitted()
        X = check_estimator_points(X, "DCKMeans", "predict", self.n_features_in_)
        return nearest(X, self.centroids_, self.masses_ > 0)[0]

    def loss(self, X: np.ndarray) -> float:
        """k-means loss of ``X`` against the root centroids (sum of squared distances)."""
        self._check_fitted()
        X = check_estimator_points(X, "DCKMeans", "loss", self.n_features_in_)
        return float(nearest(X, self.centroids_, self.masses_ > 0)[1].sum())
