"""Compiles every kernel of fairpipe into numba's on-disk cache, once, before the first real work.

numba compiles a kernel on its first call for each combination of argument types (a float32 or
float64 array, a writable one or one read from a file) and caches the result beside the module
(or under ``NUMBA_CACHE_DIR``). Left to the first real work, every process that meets a kernel
first compiles it at once: the two processes of a test run and each worker of a new Dask cluster
spend up to a minute doing so. ``python -m fairpipe.warm`` runs each estimator and kernel on a few
rows of each kind the commands pass, in one process (about 30 s on 2 cores), so that they all
load from the cache instead: run it where a cluster's image or a checkout is built (``make test``
runs it beside the linters).
"""

from __future__ import annotations

import time

import numpy as np

from fairpipe.cluster import DCKMeans, QKMeans, nearest
from fairpipe.neighbors import FairNN, warm_index_kernels
from fairpipe.ranking import ranking_metrics, rerank
from fairpipe.settings import ALGORITHMS, RULES, SAMPLERS, UTILITIES
from fairpipe.summary import FairSummary, fair_greedy


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` as an array read from a file or a store arrives: not writable (a type of its own)."""
    a = a.copy()
    a.setflags(write=False)
    return a


def warm_kernels() -> float:
    """Call every kernel for the argument types the estimators and flows pass; returns seconds."""
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    groups = np.arange(240) % 2
    for dtype in (np.float32, np.float64):
        X = rng.normal(size=(240, 4)).astype(dtype)
        for rows in (X, read_only(X)):
            nn = FairNN(n_hashes=2, n_tables=3, bucket_width=2.0, seed=0).fit(rows)
            for sampler in SAMPLERS:
                nn.sample(query_rows=[0, 1], radius=1.0, n_samples=5, sampler=sampler)
            dc = DCKMeans(n_clusters=2, fanout=2, height=1, seed=0).fit(rows)
            dc.delete([0, 1])
            dc.predict(rows)
            nearest(rows, read_only(dc.centroids_))  # a model read from a store
            QKMeans(n_clusters=2, seed=0).fit(rows).delete([0, 1])
            for utility in UTILITIES:
                for rule in RULES:
                    FairSummary(k=6, lower=[1, 1], upper=[5, 5], fanout=2, height=1, seed=0,
                                utility=utility, rule=rule).fit(rows, groups=groups)  # fmt: skip
                fair_greedy(rows, groups, [1, 1], [5, 5], 6, utility=utility)
    scores, labels = rng.random((3, 8)), rng.integers(0, 2, (3, 8))
    for p in (np.array([0.5, 0.5]), read_only(np.full((3, 2), 0.5))):
        for s in (scores, read_only(scores)):
            for algorithm in ALGORITHMS:
                top = rerank(s, labels, p, 4, algorithm=algorithm)
            ranking_metrics(np.take_along_axis(labels, np.maximum(top, 0), 1), p, k=4)
    warm_index_kernels()
    return time.perf_counter() - start


if __name__ == "__main__":
    print(f"fairpipe's kernels compiled or loaded from numba's cache in {warm_kernels():.1f} s")
