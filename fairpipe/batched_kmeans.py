"""Many small weighted k-means problems solved together: k-means++ seeding, then Lloyd iterations.

The DC-k-means tree (:mod:`fairpipe.dc_kmeans`) has many small problems: each leaf clusters its
points, each parent clusters its children's centroids weighted by their masses. Solving them one
Python call at a time would spend most of the time in call overhead, so this kernel takes a batch
of problems laid end to end and works on all of them in each numpy call.

Bit-identical results whatever the batch: the tree's deletion contract is that recomputing a few
problems gives exactly the bits a fresh fit gives, where the same problems sat in a different
batch. So every floating-point reduction here runs within one problem, in the problem's own order:

- distances: a sum over the d coordinates of one (point, centroid) pair;
- centroid sums and masses: ``np.bincount`` over labels numbered (problem, cluster), which adds
  each bin's values one by one in array order;
- k-means++ draws: a running sum (``np.add.accumulate``, strictly sequential) along each problem's
  own row of a padded matrix;
- random numbers: hashes of (seed, problem key, step), never a shared stream.

Seeding is scikit-learn's greedy k-means++ (several D^2 candidates per step, the best kept).

A problem with at most k points of positive weight keeps those points as its centroids (masses =
their weights) and fills the other slots with zero-mass centroids at the origin; zero-mass points
are never drawn as seeds and add nothing to any sum, so a parent ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairpipe.hashing import seed_key, splitmix64, unit_uniform

# Largest number of point-centroid-coordinate differences held at once (float64: 8 bytes each).
_DIFF_BUDGET = 4_000_000


@dataclass
class BatchResult:
    centroids: np.ndarray  # (P, k, d) float64
    masses: np.ndarray  # (P, k) float64: total weight assigned to each centroid
    loss: np.ndarray  # (P,) weighted sum of squared distances to the nearest centroid


def _uniforms(seed: int, keys: np.ndarray, step: int) -> np.ndarray:
    """One uniform in [0, 1) per problem key, for this step of this seed."""
    salt = seed_key(seed, 0x6B6D + step)
    return unit_uniform(splitmix64(keys.astype(np.uint64) ^ salt))


def _sq_dist(X: np.ndarray, C: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """(M, k) squared distances from each point to each centroid of its own problem."""
    M, d = X.shape
    k = C.shape[1]
    out = np.empty((M, k), dtype=np.float64)
    step = max(1, _DIFF_BUDGET // max(k * d, 1))
    for a in range(0, M, step):
        b = min(a + step, M)
        diff = X[a:b, None, :] - C[owner[a:b]]
        out[a:b] = (diff * diff).sum(axis=2)
    return out


def _sq_dist_one(X: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(M,) squared distance from each point to one centre per point (c is (M, d))."""
    diff = X - c
    return (diff * diff).sum(axis=1)


def _cum_grid(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray):
    """Each problem's running sum of ``values`` along its own row of a padded matrix."""
    P = sizes.shape[0]
    width = int(sizes.max()) if P else 0
    grid = np.zeros((P, max(width, 1)), dtype=np.float64)
    col = np.arange(values.shape[0]) - np.repeat(starts, sizes)
    grid[np.repeat(np.arange(P), sizes), col] = values
    cum = np.add.accumulate(grid, axis=1)
    total = cum[np.arange(P), np.maximum(sizes - 1, 0)]
    return cum, total


def _pick(cum, total, starts, sizes, u: np.ndarray):
    """Indices drawn with probability proportional to the values behind ``cum``: one per
    problem and column of ``u`` (P, T). Returns (index (P, T), ok (P,): the values sum > 0)."""
    target = u * total[:, None]
    pos = (cum[:, None, :] <= target[:, :, None]).sum(axis=2)
    pos = np.minimum(pos, np.maximum(sizes - 1, 0)[:, None])
    return starts[:, None] + pos, (total > 0) & (sizes > 0)


def _draw(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray, u: np.ndarray):
    """Per problem, an index drawn with probability proportional to ``values`` (global index).

    Returns (index, ok): ok is False where the problem's values sum to zero.
    """
    cum, total = _cum_grid(values, starts, sizes)
    idx, ok = _pick(cum, total, starts, sizes, u[:, None])
    return idx[:, 0], ok


def solve_batch(
    X: np.ndarray,
    weights: np.ndarray,
    sizes: np.ndarray,
    keys: np.ndarray,
    k: int,
    iterations: int,
    seed: int,
) -> BatchResult:
    """Weighted k-means++ then ``iterations`` Lloyd steps for each problem of a batch.

    ``X`` (M, d) and ``weights`` (M,) hold the problems end to end, problem p having ``sizes[p]``
    rows in its canonical order; ``keys`` (P,) are stable problem keys (they pick the random
    numbers). Inputs are assumed valid (finite, weights >= 0).
    """
    X = np.asarray(X, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.int64)
    P, d = sizes.shape[0], X.shape[1]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    owner = np.repeat(np.arange(P), sizes)
    positive = np.bincount(owner, weights=(w > 0).astype(np.float64), minlength=P)
    C = np.zeros((P, k, d), dtype=np.float64)

    # Problems with at most k points of positive weight: those points are the centroids.
    small = positive <= k
    big = ~small
    if small.any():
        keep = small[owner] & (w > 0)
        slot = _rank_within(owner[keep], P)
        C[owner[keep], slot] = X[keep]

    if big.any():
        _seed_plus_plus(X, w, owner, starts, sizes, keys, k, seed, C, big)
        # A problem whose assignment did not change is at a fixed point: further steps would
        # recompute the same centroids bit for bit, so it drops out (same result, less work).
        active = big.copy()
        label = np.full(X.shape[0], -1, dtype=np.int64)
        for _ in range(iterations):
            if not active.any():
                break
            active &= _lloyd_step(X, w, owner, P, k, C, active, label)

    d2 = _sq_dist(X, C, owner)
    label = _argmin_live(d2, C, owner, w, k, small)
    bins = owner * k + label
    masses = np.bincount(bins, weights=w, minlength=P * k).reshape(P, k)
    best = d2[np.arange(X.shape[0]), label]
    loss = np.bincount(owner, weights=w * best, minlength=P)
    return BatchResult(C, masses, loss)


def nearest(X: np.ndarray, C: np.ndarray, live: np.ndarray | None = None, block: int = 65536):
    """Nearest of the centroids ``C`` (only those marked ``live``) and its squared distance, for
    each row of ``X`` (direct differences, in row blocks of bounded memory)."""
    X = np.asarray(X, dtype=np.float64)
    label = np.empty(X.shape[0], dtype=np.int64)
    dist = np.empty(X.shape[0])
    for a in range(0, X.shape[0], block):
        diff = X[a : a + block, None, :] - C[None]
        d2 = (diff * diff).sum(axis=2)
        if live is not None:
            d2[:, ~live] = np.inf
        label[a : a + block] = d2.argmin(axis=1)
        dist[a : a + block] = d2[np.arange(d2.shape[0]), label[a : a + block]]
    return label, dist


def kmeans_plus_plus(X: np.ndarray, k: int, key: int, seed: int):
    """Greedy k-means++ seeds of one unweighted problem (more than k points): (centroids, rows)."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    C = np.zeros((1, k, X.shape[1]))
    rows = _seed_plus_plus(
        X, np.ones(n), np.zeros(n, dtype=np.int64), np.zeros(1, dtype=np.int64),
        np.array([n]), np.array([key], dtype=np.uint64), k, seed, C, np.array([True]),
    )  # fmt: skip
    return C[0], rows[0]


def _rank_within(owner: np.ndarray, P: int) -> np.ndarray:
    """0, 1, 2, ... within each run of equal ``owner`` values (owner is sorted)."""
    counts = np.bincount(owner, minlength=P)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.arange(owner.shape[0]) - np.repeat(starts, counts)


def _argmin_live(d2, C, owner, w, k, small) -> np.ndarray:
    """Nearest centroid; in small problems only the occupied slots count (the rest are padding)."""
    if not small.any():
        return d2.argmin(axis=1)
    positive = np.bincount(owner, weights=(w > 0).astype(np.float64), minlength=C.shape[0])
    n_live = np.where(small, positive, k).astype(np.int64)
    masked = np.where(np.arange(k)[None, :] < n_live[owner][:, None], d2, np.inf)
    label = masked.argmin(axis=1)
    # A problem with no positive weight at all: every point goes to slot 0 (mass 0 anyway).
    return np.where(n_live[owner] > 0, label, 0)


def _seed_plus_plus(X, w, owner, starts, sizes, keys, k, seed, C, big) -> np.ndarray:
    """Greedy weighted D^2 seeding of the problems marked ``big`` (each has > k positive weights).

    As scikit-learn's k-means++: each step draws ``2 + log(k)`` candidates with probability
    proportional to weight x D^2 and keeps the one that lowers the weighted potential most.
    Returns the rows of ``X`` chosen as seeds, (number of big problems, k); -1 where a seed
    repeats the first one because no mass was left.
    """
    pb = np.flatnonzero(big)
    sel = big[owner]
    Xb, wb = X[sel], w[sel]
    ob = np.searchsorted(pb, owner[sel])  # problem position within pb
    sizes_b = sizes[pb]
    starts_b = np.concatenate([[0], np.cumsum(sizes_b)[:-1]]).astype(np.int64)
    rows_b = np.flatnonzero(sel)
    first, _ = _draw(wb, starts_b, sizes_b, _uniforms(seed, keys[pb], 0))
    chosen = np.full((pb.shape[0], k), -1, dtype=np.int64)
    chosen[:, 0] = rows_b[first]
    C[pb, 0] = Xb[first]
    d2 = _sq_dist_one(Xb, C[pb, 0][ob])
    trials = 2 + int(np.log(k))
    seg = starts_b[sizes_b > 0]  # problem starts in Xb, for per-problem sums by reduceat
    for j in range(1, k):
        u = np.stack([_uniforms(seed, keys[pb], 64 * j + t) for t in range(trials)], axis=1)
        cum, total = _cum_grid(wb * d2, starts_b, sizes_b)
        idx, ok = _pick(cum, total, starts_b, sizes_b, u)  # (P, trials)
        # All mass already at distance 0 (fewer distinct points than k): repeat the first seed.
        cand = np.where(ok[:, None, None], Xb[idx], C[pb, 0][:, None, :])  # (P, trials, d)
        diff = Xb[:, None, :] - cand[ob]
        cand_d2 = np.minimum(d2[:, None], (diff * diff).sum(axis=2))  # (M, trials)
        pot = np.zeros((pb.shape[0], trials))
        if seg.size:
            pot[sizes_b > 0] = np.add.reduceat(wb[:, None] * cand_d2, seg, axis=0)
        best = pot.argmin(axis=1)  # ties: the first trial
        rows_p = np.arange(pb.shape[0])
        C[pb, j] = cand[rows_p, best]
        chosen[:, j] = np.where(ok, rows_b[idx[rows_p, best]], -1)
        d2 = cand_d2[np.arange(Xb.shape[0]), best[ob]]
    return chosen


def _bin_sums(values: np.ndarray, bins: np.ndarray, n_bins: int) -> np.ndarray:
    """Row sums of ``values`` per bin, each bin's rows added one by one in their array order.

    A stable sort by bin keeps each bin's rows in order; ``np.add.reduceat`` over axis 0 then
    accumulates them row after row, so a bin's sum depends on its own rows only.
    """
    order = np.argsort(bins, kind="stable")
    sorted_bins = bins[order]
    start = np.searchsorted(sorted_bins, np.arange(n_bins))
    out = np.zeros((n_bins, values.shape[1]))
    present = np.flatnonzero(np.bincount(bins, minlength=n_bins))
    if present.size:
        out[present] = np.add.reduceat(values[order], start[present], axis=0)
    return out


def _lloyd_step(X, w, owner, P, k, C, active, label) -> np.ndarray:
    """One Lloyd step for the ``active`` problems (in place); returns which of them moved."""
    sel = np.flatnonzero(active[owner])
    Xb, wb, ob = X[sel], w[sel], owner[sel]
    new = _sq_dist(Xb, C, ob).argmin(axis=1)
    moved = np.bincount(ob, weights=(new != label[sel]), minlength=P) > 0
    label[sel] = new
    bins = ob * k + new
    mass = np.bincount(bins, weights=wb, minlength=P * k)
    sums = _bin_sums(wb[:, None] * Xb, bins, P * k)
    live = (mass > 0) & np.repeat(active & moved, k)
    flat = C.reshape(P * k, -1)
    flat[live] = sums[live] / mass[live][:, None]
    return moved
