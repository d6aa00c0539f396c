"""Per-table bucket index over stored LSH keys: sorted keys, offsets and members.

For table t, ``members`` lists the row numbers of the points sorted by (key, row); the buckets of
the table are the runs of equal keys. Keys carry their table number in the top bits, so the
buckets of all tables concatenated are globally sorted and one ``searchsorted`` finds all L
buckets of a query.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairpipe.lsh import TABLE_SHIFT


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


@dataclass
class BucketIndex:
    """All tables' buckets, flattened: bucket b holds ``members[starts[b]:starts[b + 1]]``."""

    bucket_keys: np.ndarray  # (B,) uint64, globally sorted
    starts: np.ndarray  # (B + 1,) int64 into members
    members: np.ndarray  # (sum over tables of table sizes,) int64 row numbers
    n_tables: int

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

    def lookup(self, query_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start offsets into ``members`` and sizes of the buckets of each key (size 0: empty).

        ``query_keys`` has any shape; both outputs have the same shape.
        """
        q = np.asarray(query_keys, dtype=np.uint64)
        pos = np.searchsorted(self.bucket_keys, q.ravel())
        pos_c = np.minimum(pos, max(self.bucket_keys.shape[0] - 1, 0))
        if self.bucket_keys.shape[0] == 0:
            return np.zeros(q.shape, np.int64), np.zeros(q.shape, np.int64)
        found = self.bucket_keys[pos_c] == q.ravel()
        lo = self.starts[pos_c]
        size = np.where(found, self.starts[pos_c + 1] - lo, 0)
        return lo.reshape(q.shape), size.reshape(q.shape)

    def table_of_key(self, keys: np.ndarray) -> np.ndarray:
        return (np.asarray(keys, dtype=np.uint64) >> TABLE_SHIFT).astype(np.int64)
