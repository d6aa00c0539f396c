"""A query's LSH buckets as the samplers draw from them: their members and active sizes (outliers
removed from a bucket's active prefix), distances to the query, each row's degree, the buckets
flattened into entries (:class:`FlatBuckets`), and the neighbourhood M(q) they hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class QueryBuckets:
    """The non-empty buckets of one query, with active sizes for outlier removal.

    ``active`` is ``size`` itself until a removal first shrinks a bucket (copy on write), and
    ``tables`` is None when the query has a bucket in every table (then bucket i is in table i).
    """

    __slots__ = ("lo", "size", "buckets", "tables", "active", "local", "cum", "base")

    def __init__(self, lo, size, buckets, tables=None):
        self.lo = lo  # (g,) start offsets into members
        self.size = size  # (g,) original sizes
        self.buckets = buckets  # (g,) bucket numbers
        self.tables = tables  # (g,) table of each bucket (a column of the point-bucket matrix)
        self.active = size  # (g,) active sizes
        self.local: dict = {}  # bucket position -> private copy of its members (after removals)
        self.refresh()

    def refresh(self) -> None:
        """Recompute the running totals after the active sizes changed."""
        self.cum = self.active.cumsum()  # running total of the active sizes
        self.base = self.lo - self.cum + self.active  # draw v in bucket b: members[base[b] + v]

    def writable_active(self) -> np.ndarray:
        if self.active is self.size:
            self.active = self.size.copy()
        return self.active

    def table_columns(self) -> np.ndarray:
        return np.arange(self.size.shape[0]) if self.tables is None else self.tables


# Above this, a distance's square is no float: any radius this large holds every point.
_SQUARABLE = 1e154


def squared(distance: float) -> float:
    """``distance ** 2``, or infinity for a distance whose square no float holds (a radius of
    1e308 holds every point; Python's ``**`` would raise OverflowError)."""
    return float(distance) ** 2 if abs(distance) < _SQUARABLE else math.inf


def query_buckets(index, q_buckets: np.ndarray, complete: bool = False) -> QueryBuckets:
    """The query's non-empty buckets, from its bucket number in each table (-1: none).

    ``complete``: the caller knows every bucket is there and non-empty (the query is a live row).
    """
    lo = index.starts[q_buckets]
    size = index.starts[q_buckets + 1] - lo  # <= 0 for -1 (starts[-1] >= starts[0] = 0)
    if complete or (size.shape[0] and size.min() > 0):
        return QueryBuckets(lo, size, q_buckets)
    nz = np.flatnonzero(size > 0)
    return QueryBuckets(lo[nz], size[nz], q_buckets[nz], nz)


def sq_distances(points, rows: np.ndarray, query: np.ndarray, thresholds: tuple) -> np.ndarray:
    """Squared distances from ``query`` to ``points[rows]``, used only through comparisons with
    ``thresholds`` (squared). ``points`` is an array, or an object with its own
    ``sq_distances(rows, query, thresholds)`` that may return, for rows it can decide without
    the point, any value on the same side of every threshold as the exact one (a store reader
    deciding from a sketch of the points)."""
    own = getattr(points, "sq_distances", None)
    if own is not None:
        return own(rows, query, thresholds)
    dtype = np.result_type(points.dtype, query.dtype)
    if rows.shape[0] <= DISTANCE_BLOCK or dtype != points.dtype:
        diff = points[rows] - query
        return np.einsum("ij,ij->i", diff, diff)
    # Many rows (M(q) enumerated): a block at a time in one buffer that stays in the cache,
    # twice as fast as the whole gather at 95k rows; each row's arithmetic is the same.
    out = np.empty(rows.shape[0], dtype=dtype)
    buf = np.empty((DISTANCE_BLOCK, points.shape[1]), dtype=dtype)
    for a in range(0, rows.shape[0], DISTANCE_BLOCK):
        part = buf[: min(DISTANCE_BLOCK, rows.shape[0] - a)]
        np.take(points, rows[a : a + DISTANCE_BLOCK], axis=0, out=part)
        np.subtract(part, query, out=part)
        out[a : a + part.shape[0]] = np.einsum("ij,ij->i", part, part)
    return out


DISTANCE_BLOCK = 4096  # rows of points whose distances are computed at once


def _members_at(index, qb: QueryBuckets, b: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Members of draws ``v`` (positions in the concatenated active prefixes), in buckets ``b``."""
    rows = index.members[qb.base[b] + v]
    if qb.local:
        pos = v - (qb.cum[b] - qb.active[b])
        for j, arr in qb.local.items():
            hit = b == j
            if hit.any():
                rows[hit] = arr[pos[hit]]
    return rows


def _remove_outliers(index, qb: QueryBuckets, b: np.ndarray, rows: np.ndarray) -> int:
    """Swap each (bucket, outlier) to the end of the bucket's active prefix and shrink it."""
    removed = 0
    active = qb.writable_active()
    pairs = np.unique(np.stack([b, rows], axis=1), axis=0)
    for j, row in pairs:
        arr = qb.local.get(int(j))
        if arr is None:
            arr = index.members[qb.lo[j] : qb.lo[j] + qb.size[j]].copy()
            qb.local[int(j)] = arr
        n_active = active[j]
        where = np.flatnonzero(arr[:n_active] == row)
        if where.size:
            p = where[0]
            arr[p], arr[n_active - 1] = arr[n_active - 1], arr[p]
            active[j] = n_active - 1
            removed += 1
    qb.refresh()
    return removed


def _filter_all_outliers(index, qb: QueryBuckets, points, q, far2: float) -> None:
    """Remove every point farther than sqrt(far2) from every bucket at once."""
    active = qb.writable_active()
    for j in range(qb.lo.shape[0]):
        arr = qb.local.get(j)
        if arr is None:
            arr = index.members[qb.lo[j] : qb.lo[j] + qb.size[j]]
        arr = arr[: active[j]]
        keep = arr[sq_distances(points, arr, q, (far2,)) <= far2]
        full = np.empty(qb.size[j], dtype=np.int64)
        full[: keep.shape[0]] = keep
        qb.local[j] = full
        active[j] = keep.shape[0]
    qb.refresh()


def degree_of(point_buckets: np.ndarray, rows: np.ndarray, q_buckets: np.ndarray):
    """Exact degree: in how many of the query's buckets each row lies (L comparisons each).

    ``point_buckets`` is :meth:`BucketIndex.point_buckets`; a row's bucket number in table t equals
    the query's exactly when their keys of table t are equal.
    """
    return (point_buckets[rows] == q_buckets).sum(axis=1)


@dataclass
class FlatBuckets:
    """The query's buckets flattened once: one entry per (bucket, member) still active.

    Used when a query needs more draws than its buckets hold (many samples, or a low acceptance
    rate): one pass computes every member's distance once and its degree as the number of the
    query's buckets it occurs in (the same number the L key comparisons give), so a draw costs a
    few array lookups instead of a d-dimensional distance and L comparisons. Drawing from this
    state has the same output distribution as the lazy path: it is the state the Section 3.5
    outlier removals converge to, and rejection of draws outside the neighbourhood is unchanged.
    """

    rows: np.ndarray  # (m',) member rows, bucket by bucket
    bucket: np.ndarray  # (m',) position of each entry's bucket in the query's bucket list
    degree: np.ndarray  # (m',) degree of each entry's row
    near: np.ndarray | None  # (m',) within r (exact mode), None when every entry counts
    starts: np.ndarray  # (g,) first entry of each bucket
    counts: np.ndarray  # (g,) entries of each bucket
    removed: int  # outlier entries dropped


def _flatten(index, qb: QueryBuckets, points, query, mode: str, far2: float, near2: float,
             exclude: int = -1):  # fmt: skip
    rows = np.concatenate([index.members[a : a + s] for a, s in zip(qb.lo, qb.size)])
    bucket = np.repeat(np.arange(qb.lo.shape[0]), qb.size)
    uniq, inv = unique_inverse_ints(rows)
    deg = np.bincount(inv, minlength=uniq.shape[0])
    near = None
    removed = 0
    if mode != "buckets":
        d2 = sq_distances(points, uniq, query, (far2, near2) if mode == "exact" else (far2,))
        keep = (d2 <= far2)[inv]
        removed = int(keep.size - np.count_nonzero(keep))
        rows, bucket, inv = rows[keep], bucket[keep], inv[keep]
        if mode == "exact":
            near = (d2 <= near2)[inv]
    if exclude >= 0:  # the query's own row: kept as an entry (its buckets' sizes), never drawn
        kept = rows != exclude
        near = kept if near is None else near & kept
    counts = np.bincount(bucket, minlength=qb.lo.shape[0])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return FlatBuckets(rows, bucket, deg[inv], near, starts, counts, removed)


def unique_ints(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of non-negative integers: by a mask over 0..max where that is cheaper
    (numpy's hashing unique takes 0.14 s for 500k rows below 1M on this machine; the mask 1 ms),
    else by a sort. The same sorted values and dtype."""
    if values.size < 1024:
        return np.unique(values)
    top = int(values.max()) + 1
    if top > 32 * values.size or int(values.min()) < 0:
        ordered = np.sort(values)
        first = np.empty(ordered.shape[0], dtype=bool)
        first[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
        return ordered[first]
    mask = np.zeros(top, dtype=bool)
    mask[values] = True
    return np.flatnonzero(mask).astype(values.dtype, copy=False)


def unique_inverse_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of non-negative integers, by a mask and a
    position table over 0..max where that is cheaper than a sort (the inverse is then int32
    where the values allow: half the table's pages)."""
    if values.size >= 1024 and int(values.min()) >= 0:
        top = int(values.max()) + 1
        if top <= 32 * values.size:
            mask = np.zeros(top, dtype=bool)
            mask[values] = True
            uniq = np.flatnonzero(mask)
            position = np.empty(top, dtype=np.int32 if top < 2**31 else np.int64)
            position[uniq] = np.arange(uniq.shape[0], dtype=position.dtype)
            return uniq.astype(values.dtype, copy=False), position[values]
    found = np.unique(values, return_inverse=True)
    return found[0], np.asarray(found[1], dtype=np.int64).reshape(-1)


def enumerate_neighbourhood(index, qb: QueryBuckets, points, query, mode: str, radius: float,
                            c: float) -> np.ndarray:  # fmt: skip
    """M(q): the unique rows of the query's buckets (as the index holds them), filtered by the
    neighbourhood mode (within ``radius``: ``exact``; within ``c * radius``: ``approximate``),
    sorted. Drawing uniformly from it is the ``exact`` sampler's distribution."""
    if qb.lo.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    members = index.members
    rows = unique_ints(np.concatenate([members[a : a + s] for a, s in zip(qb.lo, qb.size)]))
    if mode == "buckets":
        return rows
    limit2 = squared(radius if mode == "exact" else c * radius)
    return rows[sq_distances(points, rows, query, (limit2,)) <= limit2]


def neighbourhood(index, points, query, q_buckets, mode: str, radius: float, c: float,
                  exclude: int = -1):  # fmt: skip
    """Unique rows in the union of the query's buckets, filtered by the neighbourhood mode,
    without the row ``exclude`` (-1: none)."""
    qb = query_buckets(index, q_buckets)
    rows = enumerate_neighbourhood(index, qb, points, query, mode, radius, c)
    return rows[rows != exclude] if exclude >= 0 else rows
