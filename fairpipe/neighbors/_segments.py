"""A table's buckets cut into segments that change independently (the stored index's layout).

Each bucket key is mixed by a bijection, ``h = key * GOLDEN mod 2**64`` (Fibonacci hashing), and
a table's buckets are split into ``2**bits`` segments by the top ``bits`` bits of h: about the
same number of rows in each, whatever the data. A deletion or an append rewrites only the segments
holding the rows it changes, and a query reads one segment per table.

A segment is one int32 array::

    [nb, h of bucket 0..nb-1 (2 int32 each), end of bucket 0..nb-1 (cumulative sizes), members]

buckets in increasing h, each bucket's members (int32 row numbers) in increasing row order: the
members of bucket j are ``members[ends[j - 1]:ends[j]]``. Packing everything in one array makes a
segment one read; int32 rows cap a store at 2**31 - 1 rows.

>>> keys = np.array([5, 3, 5, 9], dtype=np.uint64)
>>> flat, offsets = build_segments(keys, np.arange(4), bits=0)
>>> h, ends, members = decode(flat[offsets[0]:offsets[1]])
>>> sorted(unmix(h).tolist()), int(ends[-1])
([3, 5, 9], 4)
>>> bucket_members(flat, mix(np.uint64(5))).tolist()
[0, 2]
"""

from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E37_79B9_7F4A_7C15)
GOLDEN_INVERSE = np.uint64(pow(0x9E37_79B9_7F4A_7C15, -1, 1 << 64))
# Rows per segment the partition bits aim for: about 32k rows and 7k buckets at 1M rows, one
# chunk of fairpipe.storage.layers.SEGMENT_CHUNK entries. Larger segments mean fewer chunks to write (an
# index build's cost is mostly per chunk) and more bytes for a query to read per table.
TARGET_SEGMENT_ROWS = 32768
MAX_ROWS = 2**31 - 1


def mix(keys) -> np.ndarray:
    """The bijection of bucket keys that orders and partitions segments."""
    with np.errstate(over="ignore"):
        return np.asarray(keys, dtype=np.uint64) * GOLDEN


def unmix(h) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(h, dtype=np.uint64) * GOLDEN_INVERSE


def partition_bits(n_rows: int) -> int:
    """Segment bits for a table of ``n_rows`` rows: about TARGET_SEGMENT_ROWS rows per segment."""
    return max(0, int(np.ceil(np.log2(max(n_rows, 1) / TARGET_SEGMENT_ROWS))))


def segment_of(h: np.ndarray, bits: int) -> np.ndarray:
    """Segment number of each mixed key."""
    if bits == 0:
        return np.zeros(np.shape(h), dtype=np.int64)
    return (np.asarray(h, dtype=np.uint64) >> np.uint64(64 - bits)).astype(np.int64)


def build_segments(keys: np.ndarray, rows: np.ndarray, bits: int):
    """Pack one table: ``keys`` (m,) uint64 bucket keys of ``rows`` (m,) (ascending). Returns
    (flat int32, offsets (2**bits + 1,)): segment p is ``flat[offsets[p]:offsets[p + 1]]``."""
    rows = np.asarray(rows, dtype=np.int64)
    # ascending and unique (a table holds a row once): spanning their count means consecutive
    consecutive = rows.shape[0] > 0 and int(rows[-1] - rows[0]) == rows.shape[0] - 1
    return pack(mix(keys), rows, bits, sorted_rows=True, consecutive=consecutive)


# Up to this many entries a table is packed by numpy (:func:`_fill_segments`): loading the
# compiled kernels costs a process about 0.6 s once, more than numpy takes for a small append's
# delta (10k rows: 0.1 s for 100 tables); larger tables are packed by the compiled kernels.
NUMPY_PACK_ENTRIES = 65_536
# Set by :func:`fairpipe.neighbors.warm_index_kernels`: the compiled kernels are loaded in this process
# (a command line loads them while its Prefect server starts), so every batch, however small,
# is packed and folded by them (3x faster than numpy at 10k rows; the same arrays).
KERNELS_WARM = False


def pack(h: np.ndarray, rows: np.ndarray, bits: int, sorted_rows: bool = False,
         consecutive: bool = False):  # fmt: skip
    """Segments of entries (mixed key h, row), in any order unless ``sorted_rows`` (the rows of
    equal keys come in increasing order): buckets in increasing h, each bucket's rows in
    increasing order (compiled: :mod:`._pack`, or numpy for a small table: the same arrays).
    ``consecutive``: the caller promises ``rows == rows[0] + arange(len(rows))``, so the
    compiled path takes a row as its position plus rows[0] instead of a gather. (A span test
    cannot tell: a rebuild's entries, concatenated layer by layer, may span exactly their
    count without increasing, and were then given wrong rows.)"""
    h = np.ascontiguousarray(h, dtype=np.uint64)
    rows = np.asarray(rows, dtype=np.int64)
    if not sorted_rows:
        by_row = np.argsort(rows, kind="stable")
        h, rows = h[by_row], rows[by_row]
    if h.shape[0] <= NUMPY_PACK_ENTRIES and not KERNELS_WARM:
        order = np.argsort(h, kind="stable")
        return _fill_segments(h[order], rows[order], int(bits))
    from fairpipe.neighbors._pack import fill_segments, stable_key_order

    order, sorted_h = stable_key_order(h)
    if consecutive and rows.shape[0]:  # rows[i] = rows[0] + i: no gather
        return fill_segments(sorted_h, order + rows[0], int(bits))
    return fill_segments(sorted_h, rows[order], int(bits))


def pack_runs(runs: list, bits: int):
    """:func:`pack` of the entries of ``runs`` [(mixed keys, rows), ...] in increasing rows
    (every row of a run below the next run's; within a key each run's rows increase): every
    run but the last sorted by key (layers of the index read back), the last consecutive rows
    in any key order (new rows). The compiled path sorts the last run alone and merges the
    runs, newest first, instead of sorting everything again; it packs the concatenation as
    :func:`pack` does if a run is not sorted by key after all (the same arrays either way)."""
    n = sum(h.shape[0] for h, _ in runs)
    if n <= NUMPY_PACK_ENTRIES and not KERNELS_WARM or len(runs) == 1:
        h = np.concatenate([h for h, _ in runs]) if len(runs) > 1 else runs[0][0]
        rows = np.concatenate([r for _, r in runs]) if len(runs) > 1 else runs[0][1]
        return pack(h, rows, bits, sorted_rows=True, consecutive=len(runs) == 1)
    from fairpipe.neighbors._pack import fill_segments, merge_sorted, stable_key_order

    new_h, new_rows = runs[-1]
    order, h = stable_key_order(np.ascontiguousarray(new_h, dtype=np.uint64))
    rows = order + new_rows[0] if new_rows.shape[0] else new_rows.astype(np.int64)
    for old_h, old_rows in reversed(runs[:-1]):  # the smaller, newer runs first
        h, rows, ok = merge_sorted(np.ascontiguousarray(old_h, dtype=np.uint64),
                                   np.ascontiguousarray(old_rows, dtype=np.int64), h, rows)  # fmt: skip
        if not ok:
            every_h = np.concatenate([h for h, _ in runs])
            every_row = np.concatenate([r for _, r in runs])
            return pack(every_h, every_row, bits)
    return fill_segments(h, rows, int(bits))


def _fill_segments(hs: np.ndarray, rows: np.ndarray, bits: int):
    """:func:`fairpipe.neighbors._pack.fill_segments` in numpy: (flat, offsets) of the entries
    (``hs`` sorted mixed keys, ``rows``) cut into ``2**bits`` segments by the keys' top bits."""
    m, n_seg = hs.shape[0], 1 << bits
    seg = segment_of(hs, bits)
    first = np.ones(m, dtype=bool)
    first[1:] = hs[1:] != hs[:-1]  # an entry that opens a bucket
    ns = np.bincount(seg, minlength=n_seg)
    nb = np.bincount(seg[first], minlength=n_seg)
    offsets = np.zeros(n_seg + 1, dtype=np.int64)
    np.cumsum(1 + 3 * nb + ns, out=offsets[1:])
    flat = np.empty(int(offsets[-1]), dtype=np.int32)
    flat[offsets[:-1]] = nb
    if m == 0:
        return flat, offsets
    o = offsets[:-1][seg]  # each entry's segment start
    entry_in_seg = np.arange(m) - (np.cumsum(ns) - ns)[seg]
    first_bucket = np.cumsum(nb) - nb  # of each segment
    b_entries = np.flatnonzero(first)  # the entry opening each bucket
    b_seg = seg[b_entries]
    b_in_seg = np.arange(b_entries.shape[0]) - first_bucket[b_seg]
    b_pos = offsets[:-1][b_seg] + 1 + 2 * b_in_seg
    words = hs.view(np.int32).reshape(m, 2)
    flat[b_pos] = words[b_entries, 0]
    flat[b_pos + 1] = words[b_entries, 1]
    last = np.ones(m, dtype=bool)
    last[:-1] = first[1:]  # an entry that closes a bucket
    ends_at = offsets[:-1][b_seg] + 1 + 2 * nb[b_seg] + b_in_seg
    flat[ends_at] = entry_in_seg[last] + 1
    flat[o + 1 + 3 * nb[seg] + entry_in_seg] = rows
    return flat, offsets


def decode(seg: np.ndarray):
    """(mixed keys (nb,) uint64, ends (nb,), members) of one segment (empty: all empty)."""
    if seg.shape[0] == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    nb = int(seg[0])
    h = np.ascontiguousarray(seg[1 : 1 + 2 * nb]).view(np.uint64)
    return h, seg[1 + 2 * nb : 1 + 3 * nb], seg[1 + 3 * nb :]


def segment_problem(seg: np.ndarray, n_rows: int | None = None) -> str | None:
    """What makes ``seg`` impossible as a segment (of a table over ``n_rows`` rows, where
    given), or None: what :func:`decode` and the kernels after it index with, checked in a few
    vectorised passes (a segment read from storage whose bytes changed would otherwise index
    out of its bounds or name rows the store does not hold). Its bucket count fits it, its
    buckets' ends increase (none empty) up to its member count, its keys increase, and its
    members are rows in [0, n_rows).

    >>> flat, offsets = build_segments(np.array([5, 3, 5], dtype=np.uint64), np.arange(3), 0)
    >>> segment_problem(flat, 3) is None, segment_problem(flat, 2)
    (True, 'it names row 2, outside rows 0..1')
    """
    size = int(seg.shape[0])
    if size == 0:
        return None
    nb = int(seg[0])
    if nb < 0 or 1 + 3 * nb > size:
        return f"it counts {nb} buckets in {size} words"
    ends, members = seg[1 + 2 * nb : 1 + 3 * nb], seg[1 + 3 * nb :]
    if nb == 0:
        return None if members.shape[0] == 0 else f"it holds {members.shape[0]} rows in no bucket"
    if int(ends[0]) < 1 or int(ends[-1]) != members.shape[0] or (np.diff(ends) < 1).any():
        return "its buckets' ends do not increase up to the rows it holds"
    h = np.ascontiguousarray(seg[1 : 1 + 2 * nb]).view(np.uint64)
    if nb > 1 and (h[1:] <= h[:-1]).any():
        return "its bucket keys do not increase"
    if n_rows is not None and (int(members.min()) < 0 or int(members.max()) >= n_rows):
        bad = int(members[(members < 0) | (members >= n_rows)][0])
        return f"it names row {bad}, outside rows 0..{n_rows - 1}"
    return None


def entries(seg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mixed key, row) of every member of one segment."""
    h, ends, members = decode(seg)
    return np.repeat(h, np.diff(ends, prepend=0)), members.astype(np.int64)


def bucket_members(seg: np.ndarray, hq) -> np.ndarray:
    """The members of the bucket with mixed key ``hq`` in this segment (empty if none)."""
    h, ends, members = decode(seg)
    j = int(np.searchsorted(h, np.uint64(hq)))
    if j == h.shape[0] or h[j] != np.uint64(hq):
        return members[:0]
    return members[(int(ends[j - 1]) if j else 0) : int(ends[j])]


class NotInBucket(RuntimeError):
    """A row to remove is not a member of the bucket its key names (``row``)."""

    def __init__(self, row: int):
        super().__init__(f"Row {row} is not in the bucket its key names.")
        self.row = row


def _without(seg: np.ndarray, removed, removed_h=None) -> np.ndarray:
    """The segment without the rows ``removed``: the (h, row) order is kept, so no sort (the
    arrays :func:`pack` gives on the remaining entries). With ``removed_h`` (their mixed
    keys), each must be a member of that bucket (:class:`NotInBucket`)."""
    if removed_h is not None and removed is not None and len(removed):
        return _without_in_buckets(seg, np.asarray(removed, np.int64),
                                   np.asarray(removed_h, np.uint64))  # fmt: skip
    h, ends, members = decode(seg)
    removed = np.asarray(removed if removed is not None else [], np.int32)
    keep = ~np.isin(members, removed)
    if keep.all():
        return seg.copy() if seg.size else np.zeros(1, dtype=np.int32)
    sizes = np.diff(ends, prepend=0)
    left = np.bincount(np.repeat(np.arange(h.shape[0]), sizes)[keep], minlength=h.shape[0])
    nonempty = left > 0
    kept_h = h[nonempty]
    return np.concatenate([
        np.array([kept_h.shape[0]], dtype=np.int32), kept_h.view(np.int32),
        np.cumsum(left[nonempty]).astype(np.int32), members[keep],
    ])  # fmt: skip


def _without_in_buckets(seg: np.ndarray, removed: np.ndarray, removed_h: np.ndarray) -> np.ndarray:
    """:func:`_without` given each removed row's bucket (``removed_h``, its mixed key): each row
    is looked up in its own bucket (a binary search of the bucket keys, then of that bucket's
    members, which are in increasing row order) instead of testing every member of the segment
    against every row (a removal batch's cost per segment then follows its rows, plus one copy
    of the kept members; 5-10x less than the membership test at 32k members per segment). The
    same array as :func:`_without`; :class:`NotInBucket` for the first row of ``removed`` (in
    its order) that is not a member of its bucket."""
    h, ends, members = decode(seg)
    nb = h.shape[0]
    if nb == 0:
        raise NotInBucket(int(removed[0]))
    b = np.minimum(np.searchsorted(h, removed_h), nb - 1)
    # Members sorted by (bucket, row) as one int64 each (rows < 2**31): one binary search finds
    # every removed row in its own bucket.
    sizes = np.diff(ends, prepend=0)
    composite = np.repeat(np.arange(nb, dtype=np.int64) << 32, sizes) | members
    wanted = (b.astype(np.int64) << 32) | removed
    pos = np.minimum(np.searchsorted(composite, wanted), composite.shape[0] - 1)
    held = (h[b] == removed_h) & (composite[pos] == wanted)
    repeat = np.ones(pos.shape[0], dtype=bool)
    repeat[np.unique(pos, return_index=True)[1]] = False
    held &= ~repeat  # a row given twice is not in its bucket twice (as the membership test says)
    if not held.all():
        raise NotInBucket(int(removed[np.argmin(held)]))
    keep = np.ones(members.shape[0], dtype=bool)
    keep[pos] = False
    left = sizes.astype(np.int64)
    np.subtract.at(left, b, 1)
    nonempty = left > 0
    return np.concatenate([
        np.array([int(nonempty.sum())], dtype=np.int32), h[nonempty].view(np.int32),
        np.cumsum(left[nonempty]).astype(np.int32), members[keep],
    ])  # fmt: skip


def patch(seg: np.ndarray, bits: int, removed=None, added_h=None, added_rows=None,
          removed_h=None) -> np.ndarray:  # fmt: skip
    """The segment without the rows ``removed`` and with the entries (``added_h``,
    ``added_rows``): the segment a fresh build on the resulting rows gives. With
    ``removed_h`` (the removed rows' mixed keys; removals only), a removed row that is not in
    its key's bucket raises :class:`NotInBucket` instead of being left behind."""
    if added_h is None or not len(added_h):
        return _without(seg, removed, removed_h)
    h, rows = entries(seg)
    if removed is not None and len(removed):
        keep = ~np.isin(rows, removed)
        h, rows = h[keep], rows[keep]
    if added_h is not None and len(added_h):
        h = np.concatenate([h, np.asarray(added_h, np.uint64)])
        rows = np.concatenate([rows, np.asarray(added_rows, np.int64)])
    flat, _ = pack(h, rows, 0)  # an emptied segment is [0], as a fresh build gives
    return flat
