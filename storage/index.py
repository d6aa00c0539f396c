"""The LSH index read whole: every table's buckets over all its layers, as a fresh build gives
them (:func:`load_index`, :func:`load_compact_index`), the in-memory sampler over the store's
rows and index (:func:`load_sampler`), and the index's content (:func:`index_entries`,
:func:`read_segments`). The index's layers are described in :mod:`fairpipe.storage.layers`, their
segments in :mod:`fairpipe.storage.segments`."""

from __future__ import annotations

import ctypes
import sys

import numpy as np

from fairpipe.neighbors import HASH_MASK, TABLE_SHIFT, BucketIndex, FairNN, Scale, decode, unmix
from fairpipe.storage.arrays import open_group, read_array, read_arrays
from fairpipe.storage.damage import DamagedPartError
from fairpipe.storage.formats import load_format1_index, store_format
from fairpipe.storage.layers import layer_arrays, layer_bits, load_lsh
from fairpipe.storage.names import current_names
from fairpipe.storage.segments import indexed_entries, read_tables_segments, table_runs


def load_index(session, attrs: dict) -> BucketIndex:
    """Every table's buckets, concatenated (a table's buckets in increasing mixed key, the
    deltas' members of a bucket after the main layer's, in row order: as a fresh build)."""
    if store_format(attrs) == 1:
        return load_format1_index(session, int(attrs["n_alive"]))
    names = list(layer_bits(attrs))
    got = read_arrays(session, [f"lsh/{layer_arrays(name)[1]}" for name in names])
    given = list(zip(names, got))
    tables = []
    for parts in indexed_entries(session, 0, got[0].shape[0], given, int(attrs["n"])):
        h = np.concatenate([p[0] for p in parts])
        r = np.concatenate([p[1] for p in parts])
        if len(parts) > 1:
            # Equal keys keep increasing rows under a stable sort: each layer's bucket is in
            # row order and the layers are in row order (as in index_tables).
            order = np.argsort(h, kind="stable")
            h, r = h[order], r[order]
        new = np.ones(h.shape[0], dtype=bool)
        if h.shape[0]:
            np.not_equal(h[1:], h[:-1], out=new[1:])
        starts = np.flatnonzero(new)
        tables.append((unmix(h[starts]), np.append(starts, h.shape[0]).astype(np.int64), r))
    return BucketIndex.from_tables(tables)


def load_sampler(session, attrs: dict, scale: Scale | None = None) -> FairNN:
    """A :class:`FairNN` over the store's rows and index, everything read into memory (the hot
    path of a long-lived process). It holds the points, ids and alive flags, and the index as
    :func:`load_compact_index` reads it (members int32): about n x (4 d + 4 L + 9) bytes plus
    16 bytes a bucket; each row's keys are made from the index only if asked for
    (``FairNN.keys_``). ``scale``: only that scale's tables, an index of them alone (its
    tables numbered from 0; what the queries at a radius of that scale read)."""
    lsh = load_lsh(session, attrs)
    if store_format(attrs) == 1:
        index = load_index(session, attrs)
    elif scale is not None and scale.n_tables < int(lsh.n_tables):
        index = load_compact_index(session, attrs, (scale.first, scale.last))
        lsh = lsh.tables(scale.first, scale.last, renumbered=True)
    else:
        index = load_compact_index(session, attrs)
    release_free_memory()
    points = read_array(session, "points")
    release_free_memory()
    ids, alive = read_array(session, "ids"), read_array(session, "alive")
    for name, values in (("points", points), ("ids", ids), ("alive", alive)):
        if values.shape[0] != int(attrs["n"]):  # (the index's members were checked against n)
            why = f"it holds {values.shape[0]} rows where the store holds {int(attrs['n'])}"
            raise DamagedPartError(f"Array '{name}'", why)
    arrays = {
        **lsh.to_arrays(),
        "points": points,
        "ids": ids,
        "alive": alive,
        "bucket_keys": index.bucket_keys,
        "bucket_starts": index.starts,
        "members": index.members,
    }
    return FairNN.from_arrays(arrays, **lsh.get_params())


def release_free_memory() -> None:
    """Give the C heap's free pages back to the operating system (glibc's ``malloc_trim``; a
    no-op elsewhere): a load that decodes thousands of chunks leaves tens of MB of freed
    buffers in the heap, which the large arrays allocated after it (mapped on their own) never
    reuse, so they would stay resident beside them."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def load_compact_index(session, attrs: dict, tables: tuple[int, int] | None = None) -> BucketIndex:
    """:func:`load_index` (the same buckets, keys and members, in the same order) for a format 2
    store, built bucket by bucket from the segments rather than entry by entry: members stay
    int32 and nothing the size of all entries is made but the three arrays it returns (each
    allocated at an upper bound, filled from the start, then shrunk in place: the pages never
    written are never committed). ``tables``: (first, last), those tables alone, numbered from
    0 in the keys."""
    names = list(layer_bits(attrs))
    lengths = read_arrays(session, [f"lsh/{layer_arrays(name)[1]}" for name in names])
    first, last_table = (0, int(lengths[0].shape[0])) if tables is None else tables
    lengths = [v[first:last_table] for v in lengths]
    n_tables = last_table - first
    upper = int(sum(int(v.sum()) for v in lengths))  # segment words: at least the entries
    members = np.empty(max(upper, 1), dtype=np.int32)
    keys = np.empty(max(upper, 1), dtype=np.uint64)
    starts = np.empty(max(upper, 1) + 1, dtype=np.int64)
    n_entries = n_buckets = 0
    held = sum((v.sum(axis=1) for v in lengths), np.zeros(n_tables, np.int64))
    for j, last in table_runs(held):
        per_layer = [read_tables_segments(session, name, first + j, v[j:last], int(attrs["n"]))
                     for name, v in zip(names, lengths)]  # fmt: skip
        for i in range(last - j):
            h, sizes, rows = _table_buckets([layer[i] for layer in per_layer])
            nb, ne = h.shape[0], rows.shape[0]
            keys[n_buckets : n_buckets + nb] = unmix(h)
            if first:  # the table numbered from 0: its number in the keys' top bits
                part = keys[n_buckets : n_buckets + nb]
                part &= HASH_MASK
                part |= np.uint64(j + i) << TABLE_SHIFT
            starts[n_buckets] = n_entries
            np.cumsum(sizes, out=starts[n_buckets + 1 : n_buckets + nb + 1])
            starts[n_buckets + 1 : n_buckets + nb + 1] += n_entries
            members[n_entries : n_entries + ne] = rows
            n_buckets += nb
            n_entries += ne
    members.resize(n_entries, refcheck=False)
    keys.resize(n_buckets, refcheck=False)
    starts.resize(n_buckets + 1, refcheck=False)
    return BucketIndex(keys, starts, members, n_tables)


def _table_buckets(layers: list[list[np.ndarray]]):
    """(mixed keys, sizes, members int32) of one table's buckets, in increasing key, from each
    layer's segments (main layer first): a key held by several layers is one bucket, its
    members the main layer's then each delta's (the order a fresh build gives)."""
    parts = [decode(seg) for segments in layers for seg in segments]
    if not parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int32)
    h = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([np.diff(p[1], prepend=0) for p in parts]).astype(np.int64)
    rows = np.concatenate([p[2] for p in parts])
    if len(layers) == 1:
        return h, sizes, rows  # segments in increasing key: already in order
    order = np.argsort(h, kind="stable")  # equal keys: the earlier layer first
    first = np.zeros(h.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=first[1:])
    h, sizes, first = h[order], sizes[order], first[:-1][order]
    # Each bucket's members gathered from where its layer holds them, in the new order.
    ends = np.cumsum(sizes)
    where = np.repeat(first - (ends - sizes), sizes) + np.arange(rows.shape[0])
    rows = rows[where]
    new = np.ones(h.shape[0], dtype=bool)
    np.not_equal(h[1:], h[:-1], out=new[1:])
    heads = np.flatnonzero(new)
    return h[heads], np.add.reduceat(sizes, heads), rows


def index_entries(session) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every table's (bucket keys, member ids) pairs sorted by (key, id): the index's content
    independent of row numbers and layout (what a fresh build on the live rows must equal)."""
    attrs = current_names(dict(open_group(session).attrs))
    index = load_index(session, attrs)
    ids = read_array(session, "ids")
    out = []
    for t in range(int(attrs["lsh"]["n_tables"])):
        k, members = index.table_entries(t)
        i = ids[members]
        order = np.lexsort((i, k))
        out.append((k[order], i[order]))
    return out


def read_segments(session) -> tuple[np.ndarray, np.ndarray]:
    """(segment lengths (L, P), every segment (L, P, longest)): the stored index as arrays."""
    lengths = read_array(session, "lsh/segment_lengths")
    width = int(lengths.max(initial=0))
    return lengths, read_array(
        session, "lsh/segments", (slice(None), slice(0, lengths.shape[1]), slice(0, width))
    )
