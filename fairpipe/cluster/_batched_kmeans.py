"""Many small weighted k-means problems solved in one compiled call: k-means++ then Lloyd.

The DC-k-means tree (:mod:`fairpipe.cluster._dc_kmeans`) has many small problems: each leaf clusters its
points, each parent clusters its children's centroids weighted by their masses. A deletion
re-solves one leaf and its ancestors, a few hundred points each, so the cost of a solve is its
fixed overhead: in numpy it is ~400 calls on tiny arrays (~3 ms). Here a batch of problems laid
end to end is solved by one compiled (numba) loop over the problems, ~50 us for a leaf of 100
points.

Bit-identical results whatever the batch: the tree's deletion contract is that recomputing a few
problems gives exactly the bits a fresh fit gives, where the same problems sat in a different
batch. Each problem is solved on its own rows only, every sum runs in a fixed order (distances over
the coordinates in order; centroid sums and masses over the problem's rows in order), the compiled
code allows no reassociation or fused multiply-add (numba's default: no ``fastmath``), and the
random numbers are hashes of (seed, problem key, step), never a shared stream.

Seeding is scikit-learn's greedy k-means++ (``2 + log k`` D^2 candidates per step, the one that
lowers the weighted potential most kept). Lloyd steps stop early when no assignment changes (a
fixed point: further steps would give the same bits).

A problem with at most k points of positive weight keeps those points as its centroids (masses =
their weights) and fills the other slots with zero-mass centroids at the origin; zero-mass points
are never drawn as seeds and add nothing to any sum, so a parent ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np

from fairpipe.base import BaseEstimator
from fairpipe.hashing import seed_key
from fairpipe.parallel import THREADS, compiled, splitmix64_one, thread_pool
from fairpipe.settings import (
    DC_N_INIT,
    MAX_ITER,
    N_CLUSTERS,
    SEED,
    Setting,
    check_settings,
)

_S11 = np.uint64(11)
_TO_UNIT = 1.0 / 9007199254740992.0


@dataclass
class BatchResult:
    centroids: np.ndarray  # (P, k, d) float64
    masses: np.ndarray  # (P, k) float64: total weight assigned to each centroid
    loss: np.ndarray  # (P,) weighted sum of squared distances to the nearest centroid
    seeds: np.ndarray  # (P, k) int64: rows of X chosen by k-means++ (-1: none, small problem)


def n_trials(k: int) -> int:
    """k-means++ candidates per seed after the first (scikit-learn's choice)."""
    return 2 + int(np.log(k))


@lru_cache(maxsize=64)
def _salts(seed: int, k: int) -> np.ndarray:
    """The 64-bit salt of every random step of a solve: step 0 draws the first seed, step
    ``64 * j + t`` the t-th candidate for seed j (so each step's stream is fixed by the seed)."""
    trials = n_trials(k)
    steps = [0] + [64 * j + t for j in range(1, k) for t in range(trials)]
    return np.array([seed_key(seed, 0x6B6D + s) for s in steps], dtype=np.uint64)


@compiled
def _uniform(key, salt):
    """SplitMix64 of (key XOR salt), top 53 bits as a float in [0, 1) (as fairpipe.hashing)."""
    return np.float64(splitmix64_one(key ^ salt) >> _S11) * _TO_UNIT


@compiled
def _d2(X, i, C, c):
    """Squared distance from row i of X to row c of C, summed over the coordinates in order."""
    acc = 0.0
    for j in range(X.shape[1]):
        diff = X[i, j] - C[c, j]
        acc += diff * diff
    return acc


@compiled
def _row_d2(X, i, C, n_c, out):
    """Squared distances from row i of X to the first ``n_c`` rows of C, into ``out``.

    Four centroids share each pass over the coordinates (four independent running sums, so the
    loop is not latency-bound), but each distance is still its own sum over j in order: the same
    bits as :func:`_d2`.
    """
    d = X.shape[1]
    c = 0
    while c + 4 <= n_c:
        a0 = a1 = a2 = a3 = 0.0
        for j in range(d):
            x = X[i, j]
            e0 = x - C[c, j]
            e1 = x - C[c + 1, j]
            e2 = x - C[c + 2, j]
            e3 = x - C[c + 3, j]
            a0 += e0 * e0
            a1 += e1 * e1
            a2 += e2 * e2
            a3 += e3 * e3
        out[c], out[c + 1], out[c + 2], out[c + 3] = a0, a1, a2, a3
        c += 4
    while c < n_c:
        out[c] = _d2(X, i, C, c)
        c += 1


@compiled
def _nearest_one(X, i, C, n_live, scratch):
    """(index, squared distance) of the nearest of the first ``n_live`` rows of C; ties: lowest."""
    _row_d2(X, i, C, n_live, scratch)
    best, best_d = 0, np.inf
    for c in range(n_live):
        if scratch[c] < best_d:
            best, best_d = c, scratch[c]
    return best, best_d


@compiled
def _pick(cum, n, target):
    """First index whose running sum exceeds ``target`` (clipped to n - 1), by bisection."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if cum[mid] <= target:
            lo = mid + 1
        else:
            hi = mid
    return min(lo, n - 1)


@compiled
def _seed(X, w, a, n, key, salts, k, trials, C, chosen, d2, cum, cand_d2):
    """Greedy weighted k-means++ on rows a..a+n of X (more than k positive weights) into C."""
    cand = np.empty((trials, X.shape[1]))
    rows = np.empty(trials, dtype=np.int64)
    pots = np.empty(trials)
    scratch = np.empty(trials)
    acc = 0.0
    for i in range(n):
        acc += w[a + i]
        cum[i] = acc
    first = a + _pick(cum, n, _uniform(key, salts[0]) * acc)
    chosen[0] = first
    C[0, :] = X[first, :]
    for i in range(n):
        d2[i] = _d2(X, a + i, C, 0)
    s = 1
    for j in range(1, k):
        acc = 0.0
        for i in range(n):
            acc += w[a + i] * d2[i]
            cum[i] = acc
        # All mass already at distance 0 (fewer distinct points than k): repeat the first seed.
        for t in range(trials):
            row = a + _pick(cum, n, _uniform(key, salts[s + t]) * acc) if acc > 0 else -1
            rows[t] = row
            cand[t, :] = X[row, :] if row >= 0 else C[0, :]
        for t in range(trials):
            pots[t] = 0.0
        for i in range(n):
            _row_d2(X, a + i, cand, trials, scratch)
            for t in range(trials):
                v = min(d2[i], scratch[t])
                cand_d2[t, i] = v
                pots[t] += w[a + i] * v
        best_t, best_pot, best_row = 0, np.inf, -1
        for t in range(trials):
            if pots[t] < best_pot:
                best_t, best_pot, best_row = t, pots[t], rows[t]
        s += trials
        chosen[j] = best_row
        if best_row >= 0:
            C[j, :] = X[best_row, :]
        else:
            C[j, :] = C[0, :]
        for i in range(n):
            d2[i] = cand_d2[best_t, i]


@compiled
def _add_by_label(X, w, a, n, label, sums, mass):
    """Add w_i x_i to ``sums[label_i]`` and w_i to ``mass[label_i]`` for rows a..a+n, in row
    order (label is indexed from 0 for row a)."""
    for i in range(n):
        c = label[i]
        wi = w[a + i]
        mass[c] += wi
        for j in range(X.shape[1]):
            sums[c, j] += wi * X[a + i, j]


@compiled
def _lloyd(X, w, a, n, k, max_iter, C, label, sums, mass):
    """Up to ``max_iter`` Lloyd steps on rows a..a+n, stopping when no assignment changes."""
    d = X.shape[1]
    scratch = np.empty(k)
    for i in range(n):
        label[i] = -1
    for _ in range(max_iter):
        moved = False
        for i in range(n):
            c, _d = _nearest_one(X, a + i, C, k, scratch)
            if c != label[i]:
                moved = True
                label[i] = c
        if not moved:
            return
        sums[:, :] = 0.0
        mass[:] = 0.0
        _add_by_label(X, w, a, n, label, sums, mass)
        for c in range(k):
            if mass[c] > 0:
                for j in range(d):
                    C[c, j] = sums[c, j] / mass[c]


@compiled
def _solve(X, w, starts, sizes, keys, salts, k, trials, max_iter, C, M, loss, seeds):
    """Solve every problem of the batch in turn (see :func:`solve_batch`)."""
    P, d = sizes.shape[0], X.shape[1]
    width = 1
    for p in range(P):
        width = max(width, sizes[p])
    d2 = np.empty(width)
    cum = np.empty(width)
    cand_d2 = np.empty((trials, width))
    label = np.empty(width, dtype=np.int64)
    sums = np.empty((k, d))
    mass = np.empty(k)
    scratch = np.empty(k)
    for p in range(P):
        a, n = starts[p], sizes[p]
        positive = 0
        for i in range(n):
            if w[a + i] > 0:
                positive += 1
        if positive <= k:
            # Small problem: its points of positive weight are the centroids, in order.
            slot = 0
            for i in range(n):
                if w[a + i] > 0:
                    C[p, slot, :] = X[a + i, :]
                    slot += 1
            n_live = positive
        else:
            _seed(X, w, a, n, keys[p], salts, k, trials, C[p], seeds[p], d2, cum, cand_d2)
            _lloyd(X, w, a, n, k, max_iter, C[p], label, sums, mass)
            n_live = k
        total = 0.0
        if n_live > 0:
            for i in range(n):
                c, dc = _nearest_one(X, a + i, C[p], n_live, scratch)
                M[p, c] += w[a + i]
                total += w[a + i] * dc
        loss[p] = total


@compiled
def _nearest_rows(X, C, live, label, dist):
    scratch = np.empty(C.shape[0])
    for i in range(X.shape[0]):
        _row_d2(X, i, C, C.shape[0], scratch)
        best, best_d = 0, np.inf
        for c in range(C.shape[0]):
            if live[c] and scratch[c] < best_d:
                best, best_d = c, scratch[c]
        label[i] = best
        dist[i] = best_d


def cluster_sums(X: np.ndarray, label: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(sums (k, d), sizes (k,)) of the rows of X per label, each added in row order (the bits of
    ``np.bincount(label, weights=X[:, j])`` for every column j, in one pass)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    sums = np.zeros((k, X.shape[1]))
    sizes = np.zeros(k)
    # Weight 1: 1.0 * x is x exactly, so these are plain sums.
    label = np.ascontiguousarray(label, dtype=np.int64)
    _add_by_label(X, np.ones(X.shape[0]), 0, X.shape[0], label, sums, sizes)
    return sums, sizes


def solve_batch(
    X: np.ndarray,
    weights: np.ndarray,
    sizes: np.ndarray,
    keys: np.ndarray,
    k: int,
    max_iter: int,
    seed: int,
    starts: np.ndarray | None = None,
) -> BatchResult:
    """Weighted k-means++ then up to ``max_iter`` Lloyd steps for each problem of a batch.

    ``X`` (M, d) and ``weights`` (M,) hold the problems end to end, problem p having ``sizes[p]``
    rows in its canonical order; ``keys`` (P,) are stable problem keys (they pick the random
    numbers). ``starts`` (P,), if given, places the problems instead (they may share rows: the
    restarts of one problem). Inputs are assumed valid (finite, weights >= 0).
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    keys = np.ascontiguousarray(keys).astype(np.uint64)
    P, d = sizes.shape[0], X.shape[1]
    if starts is None:
        starts = np.zeros(P, dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
    else:
        starts = np.ascontiguousarray(starts, dtype=np.int64)
    C = np.zeros((P, k, d))
    M = np.zeros((P, k))
    loss = np.zeros(P)
    seeds = np.full((P, k), -1, dtype=np.int64)
    salts = _salts(int(seed), int(k))

    def run(a: int, b: int) -> None:
        _solve(X, w, starts[a:b], sizes[a:b], keys[a:b], salts, int(k), n_trials(k),
               int(max_iter), C[a:b], M[a:b], loss[a:b], seeds[a:b])  # fmt: skip

    # Problems are independent, so a large batch is split into contiguous ranges of about equal
    # work solved on threads at once (the kernel releases the GIL); the bits do not change.
    threads = min(THREADS, P, int(sizes.sum() * d) // _WORK_PER_THREAD)
    if threads <= 1:
        run(0, P)
    else:
        cut = np.searchsorted(np.cumsum(sizes), sizes.sum() * np.arange(1, threads) / threads)
        bounds = [0, *sorted(set(int(c) for c in cut) - {0, P}), P]
        list(thread_pool().map(run, bounds[:-1], bounds[1:]))
    return BatchResult(C, M, loss, seeds)


_WORK_PER_THREAD = 100_000  # points x dimensions below which one thread does it all


def nearest(X: np.ndarray, C: np.ndarray, live: np.ndarray | None = None):
    """Nearest of the centroids ``C`` (only those marked ``live``; ties: the lowest index) and
    its squared distance, for each row of ``X``."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    C = np.ascontiguousarray(C, dtype=np.float64)
    live_ = np.ones(C.shape[0], bool) if live is None else np.ascontiguousarray(live, dtype=bool)
    label = np.empty(X.shape[0], dtype=np.int64)
    dist = np.empty(X.shape[0])
    _nearest_rows(X, C, live_, label, dist)
    return label, dist


def kmeans_plus_plus(X: np.ndarray, k: int, key: int, seed: int):
    """Greedy k-means++ seeds of one unweighted problem (more than k points): (centroids, rows)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    n = X.shape[0]
    C = np.zeros((k, X.shape[1]))
    rows = np.full(k, -1, dtype=np.int64)
    trials = n_trials(k)
    _seed(X, np.ones(n), 0, n, np.uint64(key), _salts(int(seed), int(k)), int(k), trials, C, rows,
          np.empty(n), np.empty(n), np.empty((trials, n)))  # fmt: skip
    return C, rows


@dataclass(kw_only=True, repr=False, eq=False)
class KMeansParameters(BaseEstimator):
    """The parameters DC-k-means and Q-k-means share: k, the Lloyd steps, restarts, the seed."""

    _estimator_type = "clusterer"

    n_clusters: int = N_CLUSTERS.default
    max_iter: int = MAX_ITER.default
    n_init: int = DC_N_INIT.default
    seed: int = SEED.default

    # scikit-learn's KMeans attributes, over the rows the model holds (forgotten rows: label -1)
    @property
    def cluster_centers_(self) -> np.ndarray:
        """The model's centroids, (n_clusters, n_features) (scikit-learn's name)."""
        return self.centroids_  # type: ignore[attr-defined]

    @property
    def labels_(self) -> np.ndarray:
        """Each held row's nearest centroid (:meth:`predict`); -1 for a forgotten row."""
        self._check_fitted()
        labels = np.full(self.ids_.shape[0], -1, dtype=np.int64)  # type: ignore[attr-defined]
        alive = self.alive_  # type: ignore[attr-defined]
        if alive.any():
            labels[alive] = self.predict(self.points_[alive])  # type: ignore[attr-defined]
        return labels

    @property
    def inertia_(self) -> float:
        """The k-means loss of the live rows: the sum of their squared distances to the
        nearest centroid."""
        self._check_fitted()
        alive = self.alive_  # type: ignore[attr-defined]
        return self.loss(self.points_[alive]) if alive.any() else 0.0  # type: ignore[attr-defined]

    def fit_predict(self, X: np.ndarray, y=None, *, ids: np.ndarray | None = None) -> np.ndarray:
        """:meth:`fit`, then each row's nearest centroid."""
        return self.fit(X, ids=ids).predict(X)  # type: ignore[attr-defined]

    # Every parameter's declaration (fairpipe.settings): each model names its own.
    _settings: ClassVar[tuple[Setting, ...]] = ()

    def _check_kmeans_params(self) -> None:
        check_settings(type(self).__name__, self._settings, self)
