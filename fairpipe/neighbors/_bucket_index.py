"""Per-table bucket index over stored LSH keys: sorted keys, offsets and members.

For table t, ``members`` lists the row numbers of the points sorted by (key, row); the buckets of
the table are the runs of equal keys. Keys carry their table number in the top bits, so the
buckets of all tables concatenated are globally sorted. A query finds its L buckets through a
hash directory over the sorted keys (:mod:`fairpipe.neighbors._key_directory`, built on first use, about
0.25 s per million buckets), one cache miss per key where a binary search takes ~log2(B).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from fairpipe.neighbors._key_directory import KeyDirectory
from fairpipe.neighbors._lsh import TABLE_SHIFT


def build_table(keys_column: np.ndarray, alive: np.ndarray | None = None):
    """Index one table: returns (bucket_keys, bucket_starts, members).

    ``bucket_starts`` has one more entry than ``bucket_keys``; bucket j holds
    ``members[bucket_starts[j]:bucket_starts[j + 1]]``. Rows with ``alive == False`` are left out.

    >>> build_table(np.array([5, 3, 5, 3, 9], dtype=np.uint64))
    (array([3, 5, 9], dtype=uint64), array([0, 2, 4, 5]), array([1, 3, 0, 2, 4]))
    """
    rows = np.arange(keys_column.shape[0], dtype=np.int64)
    if alive is not None:
        rows = rows[alive]
    col = keys_column[rows]
    order = np.argsort(col, kind="stable")
    members = rows[order]
    sorted_keys = col[order]
    if sorted_keys.size == 0:
        return sorted_keys, np.zeros(1, dtype=np.int64), members
    new = np.empty(sorted_keys.shape[0], dtype=bool)
    new[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=new[1:])
    starts = np.flatnonzero(new).astype(np.int64)
    bucket_starts = np.append(starts, np.int64(sorted_keys.shape[0]))
    return sorted_keys[starts], bucket_starts, members


def remove_rows(bucket_keys, bucket_starts, members, dead: np.ndarray):
    """One table's index without the rows marked in ``dead`` (a boolean mask over all rows).

    The same arrays :func:`build_table` gives on the remaining rows: members keep their (key,
    row) order, offsets drop by the members removed before them, and buckets left empty go.
    Costs one pass over the table, no sort.

    >>> k, s, m = build_table(np.array([5, 3, 5, 3, 9], dtype=np.uint64))
    >>> remove_rows(k, s, m, np.array([False, True, False, True, False]))
    (array([5, 9], dtype=uint64), array([0, 2, 3]), array([0, 2, 4]))
    """
    keep = ~dead[members]
    removed_before = np.concatenate([[0], np.cumsum(~keep)])
    starts = bucket_starts - removed_before[bucket_starts]
    nonempty = starts[1:] > starts[:-1]
    return (
        bucket_keys[nonempty],
        np.append(starts[:-1][nonempty], starts[-1]),
        members[keep],
    )


@dataclass
class BucketIndex:
    """All tables' buckets, flattened: bucket b holds ``members[starts[b]:starts[b + 1]]``."""

    bucket_keys: np.ndarray  # (B,) uint64, globally sorted
    starts: np.ndarray  # (B + 1,) int64 into members
    members: np.ndarray  # (sum over tables of table sizes,) int64 row numbers
    n_tables: int
    _directory: KeyDirectory | None = field(default=None, init=False, repr=False, compare=False)
    _table_starts: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    @classmethod
    def from_tables(cls, tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> BucketIndex:
        keys, starts, members = [], [], []
        base = 0
        for t_keys, t_starts, t_members in tables:
            keys.append(t_keys)
            starts.append(t_starts[:-1] + base)
            members.append(t_members)
            base += t_members.shape[0]
        return cls(
            bucket_keys=np.concatenate(keys) if keys else np.zeros(0, np.uint64),
            starts=np.append(np.concatenate(starts) if starts else np.zeros(0, np.int64), base),
            members=np.concatenate(members) if members else np.zeros(0, np.int64),
            n_tables=len(tables),
        )

    @classmethod
    def build(cls, keys: np.ndarray, alive: np.ndarray | None = None) -> BucketIndex:
        return cls.from_tables([build_table(keys[:, t], alive) for t in range(keys.shape[1])])

    def __getstate__(self) -> dict:
        # The directory is rebuilt on demand; a lock cannot be pickled.
        return {k: v for k, v in self.__dict__.items() if k not in ("_directory", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _directory=None, _lock=threading.Lock())

    def directory(self) -> KeyDirectory:
        """The hash directory over ``bucket_keys``, built once on first use."""
        if self._directory is None:
            with self._lock:
                if self._directory is None:
                    self._directory = KeyDirectory.build(self.bucket_keys)
        return self._directory

    def find(self, query_keys: np.ndarray) -> np.ndarray:
        """Bucket number of each key (its position in ``bucket_keys``), -1 where none holds it."""
        q = np.asarray(query_keys, dtype=np.uint64)
        return self.directory().find(q.ravel()).reshape(q.shape)

    def bounds(self, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start offsets into ``members`` and sizes of buckets given by number (-1: size 0)."""
        b = np.asarray(buckets)
        lo = self.starts[b]
        size = self.starts[b + 1] - lo
        if b.size and b.min() < 0:
            size[b < 0] = 0
        return lo, size

    def lookup(self, query_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start offsets into ``members`` and sizes of the buckets of each key (size 0: empty).

        ``query_keys`` has any shape; both outputs have the same shape.
        """
        return self.bounds(self.find(query_keys))

    def table_starts(self) -> np.ndarray:
        """(n_tables + 1,) the first bucket number of each table (buckets are grouped by table;
        computed once)."""
        if self._table_starts is None:
            tables = self.table_of_key(self.bucket_keys)
            self._table_starts = np.searchsorted(tables, np.arange(self.n_tables + 1))
        return self._table_starts

    def table_entries(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(the key of each member, the members) of table ``t``, bucket by bucket."""
        first = self.table_starts()
        b0, b1 = int(first[t]), int(first[t + 1])
        e0, e1 = int(self.starts[b0]), int(self.starts[b1])
        sizes = np.diff(self.starts[b0 : b1 + 1])
        return np.repeat(self.bucket_keys[b0:b1], sizes), self.members[e0:e1]

    def point_buckets(self, n_rows: int) -> np.ndarray:
        """(n_rows, L) bucket numbers of every indexed row in each table, -1 for rows left out.

        Row i's entry for table t is the number of the bucket holding i, so "is p in the query's
        bucket of table t" is one integer comparison, and the buckets of a query that is a stored
        row need no key lookup at all.
        """
        dtype = np.int32 if self.bucket_keys.shape[0] < 2**31 else np.int64
        return self._by_row(n_rows, dtype, -1, lambda b0, b1: np.arange(b0, b1, dtype=dtype))

    def row_keys(self, n_rows: int) -> np.ndarray:
        """(n_rows, L) uint64 key of the bucket holding every indexed row in each table, all
        ones for rows left out."""
        empty = np.iinfo(np.uint64).max
        return self._by_row(n_rows, np.uint64, empty, lambda b0, b1: self.bucket_keys[b0:b1])

    def _by_row(self, n_rows: int, dtype, fill, values) -> np.ndarray:
        """(n_rows, L): each row's entry for table t is ``values(b0, b1)`` (one per bucket of
        the table, buckets b0..b1) at the bucket holding it, ``fill`` where none does. Filled a
        few tables at a time through a small (tables, n_rows) block, so nothing the size of
        the result is made twice."""
        out = np.empty((n_rows, self.n_tables), dtype=dtype)
        first = self.table_starts()
        step = max(1, min(self.n_tables, (8 << 20) // max(n_rows * np.dtype(dtype).itemsize, 1)))
        for t0 in range(0, self.n_tables, step):
            t1 = min(t0 + step, self.n_tables)
            block = np.full((t1 - t0, n_rows), fill, dtype=dtype)
            for t in range(t0, t1):
                b0, b1 = int(first[t]), int(first[t + 1])
                e0, e1 = int(self.starts[b0]), int(self.starts[b1])
                sizes = np.diff(self.starts[b0 : b1 + 1])
                block[t - t0, self.members[e0:e1]] = np.repeat(values(b0, b1), sizes)
            out[:, t0:t1] = block.T
        return out

    def table_of_key(self, keys: np.ndarray) -> np.ndarray:
        return (np.asarray(keys, dtype=np.uint64) >> TABLE_SHIFT).astype(np.int64)
