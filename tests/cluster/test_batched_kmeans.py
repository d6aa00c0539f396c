"""The compiled k-means kernel against a plain-Python reference written from its definition."""

import math

import numpy as np
import pytest

from fairpipe.cluster import (
    cluster_sums,
    kmeans_plus_plus,
    n_trials,
    nearest,
    solve_batch,
)
from fairpipe.hashing import seed_key, splitmix64


def uniform(seed: int, key: int, step: int) -> float:
    """The kernel's draw in [0, 1): the top 53 bits of a SplitMix64 hash."""
    h = splitmix64(np.array([key], np.uint64) ^ seed_key(seed, 0x6B6D + step))
    return float((h >> np.uint64(11)).astype(np.float64)[0] / 9007199254740992.0)


def sq(x, c) -> float:
    acc = 0.0
    for a, b in zip(x, c):
        acc += (a - b) * (a - b)
    return acc


def draw(values, u) -> int:
    """First index whose running sum exceeds u * total."""
    cum, acc = [], 0.0
    for v in values:
        acc += v
        cum.append(acc)
    target = u * acc
    return min(next((i for i, c in enumerate(cum) if c > target), len(cum)), len(cum) - 1)


def reference(X, w, key, k, iterations, seed):
    """Greedy weighted k-means++ then Lloyd until no assignment changes, one problem, in Python."""
    n, d = X.shape
    X = [list(map(float, row)) for row in X]
    w = list(map(float, w))
    live = [i for i in range(n) if w[i] > 0]
    if len(live) <= k:
        C = [X[i] for i in live] + [[0.0] * d] * (k - len(live))
        n_live = len(live)
    else:
        C = [X[draw(w, uniform(seed, key, 0))]]
        d2 = [sq(x, C[0]) for x in X]
        for j in range(1, k):
            best = None
            for t in range(n_trials(k)):
                vals = [w[i] * d2[i] for i in range(n)]
                cand = X[draw(vals, uniform(seed, key, 64 * j + t))] if sum(vals) > 0 else C[0]
                new = [min(d2[i], sq(X[i], cand)) for i in range(n)]
                pot = 0.0
                for i in range(n):
                    pot += w[i] * new[i]
                if best is None or pot < best[0]:
                    best = (pot, cand, new)
            C.append(best[1])
            d2 = best[2]
        label = [-1] * n
        for _ in range(iterations):
            new_label = [min(range(k), key=lambda c: (sq(X[i], C[c]), c)) for i in range(n)]
            if new_label == label:
                break
            label = new_label
            sums = [[0.0] * d for _ in range(k)]
            mass = [0.0] * k
            for i in range(n):
                mass[label[i]] += w[i]
                for j in range(d):
                    sums[label[i]][j] += w[i] * X[i][j]
            C = [[s / mass[c] for s in sums[c]] if mass[c] > 0 else C[c] for c in range(k)]
        n_live = k
    masses, loss = [0.0] * k, 0.0
    if n_live:
        for i in range(n):
            c = min(range(n_live), key=lambda c: (sq(X[i], C[c]), c))
            masses[c] += w[i]
            loss += w[i] * sq(X[i], C[c])
    return np.array(C), np.array(masses), loss


@pytest.mark.parametrize("d, k", [(2, 3), (7, 5), (13, 4)])
def test_kernel_gives_the_reference_bits(d, k):
    rng = np.random.default_rng(d)
    sizes = np.array([40, 2, 0, 90, 5, 33])
    X = rng.normal(size=(sizes.sum(), d)) * rng.uniform(0.5, 3, size=d)
    X[10:14] = X[9]  # duplicated points
    w = rng.integers(0, 4, size=sizes.sum()).astype(float)
    keys = np.arange(sizes.size) * 7 + 3
    res = solve_batch(X, w, sizes, keys, k, max_iter=8, seed=11)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for p in range(sizes.size):
        a, b = starts[p], starts[p + 1]
        C, masses, loss = reference(X[a:b], w[a:b], int(keys[p]), k, 8, 11)
        assert np.array_equal(res.centroids[p], C), p
        assert np.array_equal(res.masses[p], masses), p
        assert res.loss[p] == loss, p


def test_problems_may_share_rows_through_starts():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(30, 3))
    w = rng.uniform(0.1, 2, size=30)
    shared = solve_batch(X, w, np.array([30, 30]), np.array([5, 6]), 4, 6, 0, starts=[0, 0])
    for p, key in enumerate([5, 6]):
        alone = solve_batch(X, w, np.array([30]), np.array([key]), 4, 6, 0)
        assert np.array_equal(shared.centroids[p], alone.centroids[0])


def test_kmeans_plus_plus_seeds_are_rows_of_the_data():
    X = np.random.default_rng(2).normal(size=(200, 4))
    C, rows = kmeans_plus_plus(X, 6, key=1, seed=3)
    assert (rows >= 0).all() and np.unique(rows).size == 6
    assert np.array_equal(C, X[rows])


def test_nearest_matches_a_direct_argmin():
    rng = np.random.default_rng(3)
    X, C = rng.normal(size=(500, 6)), rng.normal(size=(7, 6))
    live = np.array([True, False, True, True, False, True, True])
    label, dist = nearest(X, C, live)
    d2 = ((X[:, None, :] - C[None]) ** 2).sum(axis=2)
    d2[:, ~live] = np.inf
    assert np.array_equal(label, d2.argmin(axis=1))
    assert np.allclose(dist, d2.min(axis=1))
    assert math.isinf(nearest(X[:2], C, np.zeros(7, bool))[1][0])


def test_cluster_sums_are_the_bits_of_bincount():
    rng = np.random.default_rng(5)
    X, label = rng.normal(size=(1000, 4)) * 1e3, rng.integers(0, 6, size=1000)
    sums, sizes = cluster_sums(X, label, 7)
    ref = np.stack([np.bincount(label, weights=X[:, j], minlength=7) for j in range(4)], 1)
    assert np.array_equal(sums, ref)
    assert np.array_equal(sizes, np.bincount(label, minlength=7))


def test_a_batch_split_over_threads_gives_the_same_bits(monkeypatch):
    import fairpipe.cluster._batched_kmeans as bk

    rng = np.random.default_rng(6)
    sizes = rng.integers(0, 80, size=60)
    X = rng.normal(size=(sizes.sum(), 5))
    w = rng.uniform(0, 2, size=sizes.sum())
    keys = np.arange(60)
    monkeypatch.setattr(bk, "THREADS", 1)
    one = solve_batch(X, w, sizes, keys, 4, 6, 1)
    monkeypatch.setattr(bk, "THREADS", 4)  # four ranges (on the pool's threads, however many)
    monkeypatch.setattr(bk, "_WORK_PER_THREAD", 10)
    many = solve_batch(X, w, sizes, keys, 4, 6, 1)
    for name in ("centroids", "masses", "loss", "seeds"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
