"""Deletion-efficient k-means (Ginart et al., NeurIPS 2019).

- :class:`DCKMeans`: the divide-and-conquer tree; a deletion recomputes leaf-to-root paths and
  gives the bits of a fresh fit on the remaining points.
- :class:`QKMeans`: quantised Lloyd's whose deletions are usually certified without retraining.
- :func:`choose_model`: which of the two suits a data set.
- The tree's pieces, used by the flows to run it on Dask with the same bits:
  :func:`solve_leaves` (the leaves' results, from their rows), then
  :meth:`DCKMeans.from_leaves` (a fit) or :meth:`DCKMeans.refresh_leaves` (a batch): the tree
  assembled by :func:`fairpipe.tree.refresh` over :class:`LevelArrays` with the
  :class:`ParentRule` (:func:`solve_parents`); :func:`refresh_levels` runs the same over any node
  store (a store's levels, named by :func:`level_arrays`).
- :func:`expected_failed_checks`: the scikit-learn estimator checks a model cannot pass, and why.
- The batched compiled kernels: :func:`solve_batch`, :func:`nearest`, :func:`kmeans_plus_plus`,
  :func:`cluster_sums`.
"""

from fairpipe.cluster._batched_kmeans import (
    BatchResult,
    cluster_sums,
    kmeans_plus_plus,
    n_trials,
    nearest,
    solve_batch,
)
from fairpipe.cluster._dc_kmeans import (
    LEAF_BATCH_POINTS,
    DCKMeans,
    LevelArrays,
    ParentRule,
    level_arrays,
    node_keys,
    refresh_levels,
    solve_leaf_group,
    solve_leaves,
    solve_parents,
    tree_array_names,
    tree_arrays,
)
from fairpipe.cluster._q_kmeans import Q_STATE, QKMeans, choose_model, quantise
from fairpipe.cluster._sklearn_checks import expected_failed_checks
from fairpipe.settings import MAX_N_INIT

__all__ = [
    "MAX_N_INIT",
    "LEAF_BATCH_POINTS", "Q_STATE", "BatchResult", "DCKMeans", "QKMeans", "choose_model",
    "cluster_sums", "expected_failed_checks", "kmeans_plus_plus", "n_trials", "nearest", "node_keys", "quantise",
    "LevelArrays", "ParentRule", "level_arrays", "refresh_levels", "solve_batch", "solve_leaf_group", "solve_leaves", "solve_parents", "tree_array_names",
    "tree_arrays",
]  # fmt: skip
