"""Fair (and deliberately unfair) sampling from the union of a query's LSH buckets.

Har-Peled & Mahabadi, "Near Neighbor: Who is the Fairest of Them All?" (NeurIPS 2019):

- ``uniform``: a bucket uniformly, then a point uniformly in it (biased toward small buckets).
- ``weighted``: a bucket with probability size/m, then a point uniformly (p drawn w.p. d(p)/m).
- ``exact``: weighted, then accept p with probability 1/d(p) (Lemma 3.1): uniform on the union.
- ``approx``: weighted, then probe the query's buckets uniformly with replacement until one holds p;
  after i probes accept with probability i / (g * Delta), reject after g * Delta probes
  (Section 3.4, Lemmas 3.6-3.7). E[i] = g / d(p), so acceptance is proportional to 1/d(p); the
  papers' experiment code used 1 / (L // i) instead, which is biased.

Neighbourhood modes: ``buckets`` (every bucket-mate), ``approximate`` (points farther than c*r are
outliers: when one is drawn it is removed from that bucket's active prefix, as in Section 3.5),
``exact`` (as approximate, then outputs farther than r are rejected, Lemma 4.9). When more than
``max_outliers`` outliers are met, the query's buckets are filtered by distance in one pass (the
state Section 3.5's removals would converge to) instead of failing; the result reports it.

The kernel here works on one query and vectorises over its draws; ``FairNN`` validates inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

METHODS = ("exact", "approx", "uniform", "weighted", "rank")
MODES = ("buckets", "approximate", "exact")


@dataclass
class QueryStats:
    draws: int = 0
    rounds: int = 0
    outliers: int = 0
    outlier_scan: bool = False
    probes: int = 0
    extra: dict = field(default_factory=dict)


@dataclass
class QueryBuckets:
    """The non-empty buckets of one query, with active sizes for outlier removal."""

    lo: np.ndarray  # (g,) start offsets into members
    size: np.ndarray  # (g,) original sizes
    keys: np.ndarray  # (g,) the query's keys of these buckets
    active: np.ndarray  # (g,) active sizes
    local: dict  # bucket position -> private copy of its members (after removals)


def query_buckets(index, query_keys: np.ndarray) -> QueryBuckets:
    lo, size = index.lookup(query_keys)
    nz = size > 0
    return QueryBuckets(lo[nz], size[nz], query_keys[nz], size[nz].copy(), {})


def _members_at(index, qb: QueryBuckets, b: np.ndarray, pos: np.ndarray) -> np.ndarray:
    rows = index.members[qb.lo[b] + pos]
    if qb.local:
        for j, arr in qb.local.items():
            hit = b == j
            if hit.any():
                rows[hit] = arr[pos[hit]]
    return rows


def _remove_outliers(index, qb: QueryBuckets, b: np.ndarray, rows: np.ndarray) -> int:
    """Swap each (bucket, outlier) to the end of the bucket's active prefix and shrink it."""
    removed = 0
    pairs = np.unique(np.stack([b, rows], axis=1), axis=0)
    for j, row in pairs:
        arr = qb.local.get(int(j))
        if arr is None:
            arr = index.members[qb.lo[j] : qb.lo[j] + qb.size[j]].copy()
            qb.local[int(j)] = arr
        n_active = qb.active[j]
        where = np.flatnonzero(arr[:n_active] == row)
        if where.size:
            p = where[0]
            arr[p], arr[n_active - 1] = arr[n_active - 1], arr[p]
            qb.active[j] = n_active - 1
            removed += 1
    return removed


def _filter_all_outliers(index, qb: QueryBuckets, points, q, far2: float) -> None:
    """Remove every point farther than sqrt(far2) from every bucket at once."""
    for j in range(qb.lo.shape[0]):
        arr = qb.local.get(j)
        if arr is None:
            arr = index.members[qb.lo[j] : qb.lo[j] + qb.size[j]]
        arr = arr[: qb.active[j]]
        diff = points[arr] - q
        keep = arr[np.einsum("ij,ij->i", diff, diff) <= far2]
        full = np.empty(qb.size[j], dtype=np.int64)
        full[: keep.shape[0]] = keep
        qb.local[j] = full
        qb.active[j] = keep.shape[0]


def degree_of(point_keys: np.ndarray, rows: np.ndarray, query_keys: np.ndarray) -> np.ndarray:
    """Exact degree: in how many of the query's buckets each row lies (L comparisons each)."""
    return np.count_nonzero(point_keys[rows] == query_keys, axis=1)


def _approx_accept(
    point_keys, rows, qb: QueryBuckets, gamma: float, rng: np.random.Generator, stats: QueryStats
) -> np.ndarray:
    g = qb.keys.shape[0]
    delta = math.ceil(math.log(1.0 / gamma)) + 4
    cap = g * delta
    tables = (qb.keys >> np.uint64(48)).astype(np.int64)
    probes = np.zeros(rows.shape[0], dtype=np.int64)
    found = np.zeros(rows.shape[0], dtype=bool)
    todo = np.arange(rows.shape[0])
    block = max(4, min(64, g))
    while todo.size:
        t = rng.integers(0, g, size=(todo.size, block))
        hit = point_keys[rows[todo][:, None], tables[t]] == qb.keys[t]
        first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, block + 1)
        got = first <= block
        found[todo[got]] = True
        probes[todo[got]] += first[got]
        probes[todo[~got]] += block
        todo = todo[~got]
        over = probes[todo] >= cap
        todo = todo[~over]
    stats.probes += int(np.minimum(probes, cap).sum())
    ok = found & (probes <= cap)
    u = rng.random(rows.shape[0])
    return ok & (u * cap < probes)


def sample_query(
    index,
    point_keys: np.ndarray,
    points: np.ndarray,
    query: np.ndarray,
    query_keys: np.ndarray,
    n_samples: int,
    method: str,
    mode: str,
    radius: float,
    c: float,
    rng: np.random.Generator,
    max_outliers: int,
    gamma: float = 0.01,
    max_draws: int = 50_000_000,
) -> tuple[np.ndarray, QueryStats]:
    """Draw ``n_samples`` rows for one query (fewer only if its neighbourhood is empty)."""
    stats = QueryStats()
    qb = query_buckets(index, query_keys)
    out = np.empty(n_samples, dtype=np.int64)
    filled = 0
    far2 = (c * radius) ** 2
    near2 = radius**2
    rate = 0.5
    while filled < n_samples and stats.draws < max_draws:
        m = int(qb.active.sum())
        if m == 0:
            break
        need = n_samples - filled
        n_draw = int(min(max(need / max(rate, 1e-4) * 1.1 + 16, 16), 4_000_000))
        stats.rounds += 1
        stats.draws += n_draw
        if method == "uniform":
            nonempty = np.flatnonzero(qb.active > 0)
            b = nonempty[rng.integers(0, nonempty.size, size=n_draw)]
            pos = np.floor(rng.random(n_draw) * qb.active[b]).astype(np.int64)
        else:
            cum = np.cumsum(qb.active)
            v = rng.integers(0, m, size=n_draw)
            b = np.searchsorted(cum, v, side="right")
            pos = v - (cum[b] - qb.active[b])
        rows = _members_at(index, qb, b, pos)
        accept = np.ones(n_draw, dtype=bool)
        if mode != "buckets":
            diff = points[rows] - query
            d2 = np.einsum("ij,ij->i", diff, diff)
            outlier = d2 > far2
            if outlier.any():
                stats.outliers += _remove_outliers(index, qb, b[outlier], rows[outlier])
                if stats.outliers > max_outliers and not stats.outlier_scan:
                    _filter_all_outliers(index, qb, points, query, far2)
                    stats.outlier_scan = True
                accept &= ~outlier
            if mode == "exact":
                accept &= d2 <= near2
        if method == "exact":
            deg = degree_of(point_keys, rows, query_keys)
            accept &= rng.random(n_draw) * deg < 1.0
        elif method == "approx":
            accept &= _approx_accept(point_keys, rows, qb, gamma, rng, stats)
        got = rows[accept][:need]
        out[filled : filled + got.shape[0]] = got
        filled += got.shape[0]
        rate = max(0.5 * rate, accept.mean()) if accept.any() else rate / 4
    return out[:filled], stats


def neighbourhood(index, points, query, query_keys, mode: str, radius: float, c: float):
    """Unique rows in the union of the query's buckets, filtered by the neighbourhood mode."""
    qb = query_buckets(index, query_keys)
    if qb.lo.size == 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.unique(np.concatenate([index.members[a : a + s] for a, s in zip(qb.lo, qb.size)]))
    if mode == "buckets":
        return rows
    diff = points[rows] - query
    d2 = np.einsum("ij,ij->i", diff, diff)
    limit = radius if mode == "exact" else c * radius
    return rows[d2 <= limit**2]
