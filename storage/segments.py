"""The LSH index's segments in the store: a layer's tables built from staged keys and the
entries of the layers it merges, read back checked, and patched to remove rows.

- ``lsh/segments`` int32 (L, 2**segment_bits, S): each table's buckets cut into segments by a
  hash of their key (:mod:`fairpipe.neighbors._segments`), one segment per (table, segment) row,
  in chunks of ``SEGMENT_CHUNK`` entries, S the longest segment rounded up to whole chunks (the
  array's shape is its real extent: reading all of it reads every segment, zero-padded; while a
  layer is written its shape is room for any segment, :func:`make_room`, and the segments'
  lengths fit it again, :func:`write_segment_lengths`); ``lsh/segment_lengths`` int32 (L, 2**segment_bits):
  the used length of each; ``lsh/bucket_counts`` int64 (L,). A delta layer has the same arrays
  under its own names (:func:`fairpipe.storage.layers.layer_arrays`). A deletion rewrites the segments it
  changes; a query reads one segment per table. Nothing is stored per (row, table) beyond the
  member entry itself (about 4 bytes, plus 12 per bucket): a row's keys are recomputed from its
  point when needed (:func:`keys_of_rows`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fairpipe.neighbors import (
    E2LSH,
    NotInBucket,
    decode,
    entries,
    mix,
    pack_runs,
    patch,
    segment_of,
    segment_problem,
)
from fairpipe.storage.arrays import (
    create_array,
    open_array,
    open_group,
    read_array,
    read_arrays,
    read_many,
    read_rows_at,
    set_shape,
    zarr_checked,
)
from fairpipe.storage.damage import DamagedPartError
from fairpipe.storage.layers import (
    MAIN,
    SEGMENT_CHUNK,
    key_projection,
    layer_arrays,
    layer_starts,
    plan_layers,
)
from fairpipe.storage.staging import Staging
from fairpipe.storage.writes import write_chunks

SEGMENT_CAPACITY = 1 << 34  # the segments' last dimension: larger than any segment can be
MAX_SEGMENTS = 1 << 20  # segments per table at most (2**31 rows at 2048 rows per segment)
INDEX_BLOCK_BYTES = 256 << 20  # index entries one job holds at most
WRITE_BLOCK_BYTES = 64 << 20  # segments of several tables written in one call, at most


def even_blocks(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) in at most ``parts`` contiguous blocks of sizes differing by at most one (none
    empty; one empty block where n is 0)."""
    parts = max(1, min(int(parts), n))
    cuts = [n * i // parts for i in range(parts + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def table_blocks(n_tables: int, n_rows: int) -> list[tuple[int, int]]:
    """Blocks of tables [t0, t1) small enough that a job holds about 256 MB of index at most
    (and at least 8 blocks where there are that many tables, to spread the work)."""
    per_job = int(max(1, min(n_tables, INDEX_BLOCK_BYTES // max(40 * n_rows, 1),
                             -(-n_tables // 8))))  # fmt: skip
    return [(t, min(t + per_job, n_tables)) for t in range(0, n_tables, per_job)]


def create_index(root, n_tables: int, layer: str = MAIN) -> None:
    """An empty segment array for ``layer``, replacing any there (a new main layer drops every
    delta and any format 1 arrays too). Its shape is room for any segment until the layer's
    lengths are written (:func:`write_segment_lengths`); only the chunks written exist."""
    names = list(layer_arrays(layer))
    if layer == MAIN:
        names += [name for name in root["lsh"].array_keys() if name.startswith("delta")]
        names += ["keys", "members", "bucket_keys", "bucket_starts"]
    drop_arrays(root, names)
    create_array(root, f"lsh/{layer_arrays(layer)[0]}", shape=(n_tables, MAX_SEGMENTS, SEGMENT_CAPACITY),
                 chunks=(1, 1, SEGMENT_CHUNK), dtype="int32", fill_value=0,
                 compressors=segment_codec())  # fmt: skip


def segment_codec():
    """Blosc's byte shuffle then LZ4: a segment's sorted rows and bucket ends differ little in
    their high bytes. Measured on the segments of 1M-row tables against zarr's default (zstd
    without shuffle): 15% fewer bytes, 35% less CPU to write and 20% less to read. (Blosc with
    zstd level 1 saves another 5% of the bytes for 45% more CPU than LZ4.)"""
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="lz4", clevel=1, shuffle="shuffle")


def drop_arrays(root, names) -> None:
    for name in names:
        if name in root["lsh"]:
            del root[f"lsh/{name}"]


def write_bucket_counts(root, counts: np.ndarray, layer: str = MAIN) -> None:
    """Buckets per table of ``layer`` (``lsh/bucket_counts`` int64 (L,) for the main one)."""
    name = layer_arrays(layer)[2]
    drop_arrays(root, [name])
    create_array(root, f"lsh/{name}", shape=counts.shape, dtype="int64")[...] = counts


def write_segment_lengths(root, lengths: np.ndarray, layer: str = MAIN) -> None:
    """The used length of every segment of ``layer`` (replacing the array: the segment count
    may change), and the segments' shape fitted to them: (tables, segments, the longest rounded
    up to whole chunks). No chunk lies beyond it: a segment's chunks past its length are
    deleted as it shrinks."""
    segments, name = layer_arrays(layer)[:2]
    drop_arrays(root, [name])
    create_array(root, f"lsh/{name}", shape=lengths.shape, chunks=lengths.shape,
                 dtype="int32", fill_value=0)[...] = lengths  # fmt: skip
    width = _padded(int(np.max(lengths, initial=0)))
    set_shape(root, f"lsh/{segments}", (*lengths.shape, width))


def make_room(root, n_tables: int, layer: str, sources: tuple) -> None:
    """Make ``layer``'s segments ready to be written: a new array (:func:`create_index`) where
    the layer is not among the ``sources`` it is built from, else the existing one's shape made
    room for any segment (its lengths fit it again once written)."""
    if layer not in sources:
        create_index(root, n_tables, layer)
    else:
        set_shape(root, f"lsh/{layer_arrays(layer)[0]}", (n_tables, MAX_SEGMENTS, SEGMENT_CAPACITY))


def read_lengths(session, layer: str, sel=slice(None)) -> np.ndarray | None:
    """Segment lengths of ``layer`` (tables ``sel``), None when the store has no such layer."""
    name = layer_arrays(layer)[1]
    return read_array(session, f"lsh/{name}", sel) if name in open_group(session)["lsh"] else None


def buckets_per_table(session, layers) -> float:
    """Mean buckets per table of the index ``layers`` (a bucket with members in several layers
    counts once in each)."""
    names = [f"lsh/{layer_arrays(layer)[2]}" for layer in layers]
    return float(np.sum(read_arrays(session, names), axis=0).mean())


def bucket_count(flat: np.ndarray, offsets: np.ndarray) -> int:
    """Buckets in a table packed by :func:`pack` (each segment starts with its count)."""
    return int(flat[offsets[:-1]].sum())


def _padded(length: int) -> int:
    return -(-length // SEGMENT_CHUNK) * SEGMENT_CHUNK


def read_checked_segments(session, layer: str, sels: list,
                          n_rows: int | None = None) -> list[np.ndarray]:  # fmt: skip
    """Segments ``sels`` ((table, segment, slice of its length) each) of ``layer``, fetched
    together, each checked before anything indexes with it (:func:`fairpipe.neighbors.
    _segments.segment_problem`; its members against ``n_rows`` where given): one whose bytes
    changed yet passed their checksum (a store without checksums) is a
    :class:`fairpipe.storage.damage.DamagedPartError` naming it, never an index out of bounds."""
    name = f"lsh/{layer_arrays(layer)[0]}"
    got = read_many(session, name, sels)
    for (t, p, _), seg in zip(sels, got):
        problem = segment_problem(seg, n_rows)
        if problem is not None:
            raise DamagedPartError(f"Segment ({t}, {p}) of array '{name}'", problem)
    return got


def read_tables_segments(session, layer: str, t0: int, lengths: np.ndarray,
                         n_rows: int | None = None) -> list[list[np.ndarray]]:  # fmt: skip
    """The non-empty segments of tables ``t0, t0 + 1, ...`` of ``layer`` (``lengths``: their
    segment lengths there, a row per table), per table in segment order (increasing mixed keys),
    fetched together (a read per table costs about 4 ms for a small delta, mostly opening the
    array again) and checked (:func:`read_checked_segments`)."""
    sels = [(t0 + j, int(p), slice(0, int(v[p])))
            for j, v in enumerate(lengths) for p in np.flatnonzero(v)]  # fmt: skip
    got = iter(read_checked_segments(session, layer, sels, n_rows))
    return [[next(got) for _ in np.flatnonzero(v)] for v in lengths]


def read_tables_entries(session, t0: int, lengths: np.ndarray, layer: str = MAIN,
                        n_rows: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """(mixed keys, rows) of every entry of tables ``t0, t0 + 1, ...`` in ``layer``
    (:func:`read_tables_segments`)."""
    out = []
    for segments in read_tables_segments(session, layer, t0, lengths, n_rows):
        parts = [entries(s) for s in segments]
        out.append((np.concatenate([h for h, _ in parts]), np.concatenate([r for _, r in parts]))
                   if parts else (np.zeros(0, np.uint64), np.zeros(0, np.int64)))  # fmt: skip
    return out


READ_AHEAD_ENTRIES = 4_000_000  # indexed entries read ahead at once (64 MB decoded)


def table_runs(held: np.ndarray):
    """Runs [j, last) of consecutive tables holding at most READ_AHEAD_ENTRIES entries together
    (or one table), ``held``: the entries each table holds (what a reader keeps at once)."""
    j = 0
    while j < held.shape[0]:
        last = j + 1
        while last < held.shape[0] and held[j : last + 1].sum() <= READ_AHEAD_ENTRIES:
            last += 1
        yield j, last
        j = last


def indexed_entries(session, t0: int, t1: int, given: list, n_rows: int | None = None):
    """Per table of [t0, t1), the (mixed keys, rows) each layer of ``given`` ((layer, its
    segment lengths of those tables)) holds, read ahead in runs of tables holding at most
    READ_AHEAD_ENTRIES entries (or one table)."""
    held = sum((lengths.sum(axis=1) for _, lengths in given), np.zeros(t1 - t0, np.int64))
    for j, last in table_runs(held):
        per_layer = [read_tables_entries(session, t0 + j, lengths[j:last], name, n_rows)
                     for name, lengths in given]  # fmt: skip
        for i in range(last - j):
            yield [layer[i] for layer in per_layer]


def _block_shape(lengths: list, old_lengths: list) -> tuple[int, int]:
    """(segments, padded width) of the block :func:`write_tables` writes for tables with these
    new and old segment lengths."""
    pairs = list(zip(lengths, old_lengths))
    n_seg = max((max(v.shape[0], len(o)) for v, o in pairs), default=0)
    longest = max((max(v.max(initial=0), np.max(o, initial=0)) for v, o in pairs), default=0)
    return n_seg, _padded(int(longest))


def write_tables(session, t0: int, packed: list, old_lengths: list,
                 layer: str = MAIN) -> list[np.ndarray]:  # fmt: skip
    """Write tables ``t0, t0 + 1, ...``'s segments of ``layer`` (``packed``: each table's
    (flat, offsets) from :func:`pack`) over the old ones (their ``old_lengths``, zeroed where
    the new ones are shorter), in one Zarr call (its chunks written concurrently; a call per
    table cost about a millisecond each for a small delta). Returns each table's new lengths."""
    lengths = [np.diff(offsets).astype(np.int32) for _, offsets in packed]
    n_seg, width = _block_shape(lengths, old_lengths)
    if width == 0:
        return lengths
    # The chunks of the (tables, n_seg, width) block, zero-padded, made one at a time in one
    # buffer (each encoded before the next is made): a block of fresh zeroed pages cost a small
    # delta's tables 0.05-0.09 s in page faults alone (100 chunks of 256 KB for a few rows).
    scratch = np.zeros((1, 1, SEGMENT_CHUNK), dtype=np.int32)

    def chunks():
        for j, ((flat, offsets), v) in enumerate(zip(packed, lengths)):
            for p in range(n_seg):
                segment = flat[offsets[p] : offsets[p + 1]] if p < v.shape[0] else flat[:0]
                for c in range(width // SEGMENT_CHUNK):
                    piece = segment[c * SEGMENT_CHUNK : (c + 1) * SEGMENT_CHUNK]
                    scratch[0, 0, : piece.shape[0]] = piece
                    scratch[0, 0, piece.shape[0] :] = 0
                    yield (t0 + j, p, c), scratch

    write_chunks(session, f"lsh/{layer_arrays(layer)[0]}", chunks())
    return lengths


def index_tables(session, staging: Staging, t0: int, t1: int, bits: int, sources: tuple,
                 target: str) -> dict[int, tuple[np.ndarray, int]]:  # fmt: skip
    """Build tables [t0, t1) of layer ``target`` with ``2**bits`` segments from the staged keys
    of the new rows and every entry of the layers ``sources`` (in row order: a new store has
    none; a delta, the newest deltas it merges; a rebuild of the main layer, every layer).
    Returns each table's segment lengths and bucket count."""
    new_keys = staging.read(t0, t1)  # (tables, rows)
    new_rows = np.arange(staging.base, staging.n_total, dtype=np.int64)
    old = {name: read_lengths(session, name, slice(t0, t1)) for name in sources}
    prior = old.get(target)  # the target's old segments are written over
    out: dict[int, tuple[np.ndarray, int]] = {}
    # (packed table, its old segment lengths) not yet written: written together, one call of
    # write_chunks; ``shape``: the group's segments and longest segment so far (the group's
    # padded chunks stay within WRITE_BLOCK_BYTES)
    group: list = []
    shape = (0, 0)

    def flush() -> None:
        g0 = t0 + len(out)
        packed = [p for p, _ in group]
        written = write_tables(session, g0, packed, [before for _, before in group], target)
        for i, (lengths, (flat, offsets)) in enumerate(zip(written, packed)):
            out[g0 + i] = (lengths, bucket_count(flat, offsets))
        group.clear()

    given = [(name, lengths) for name, lengths in old.items() if lengths is not None]
    for j, parts in enumerate(indexed_entries(session, t0, t1, given)):
        # Each layer's entries come sorted by key, its buckets in row order; the layers are in
        # row order, the staged rows (consecutive) above them all: so the staged rows sorted
        # alone and merged with the layers' give every bucket in row order.
        runs = [*parts, (mix(new_keys[j]), new_rows)]
        table = (pack_runs(runs, bits), prior[j] if prior is not None else np.zeros(0, np.int32))
        (_, offsets), before = table
        seg, longest = _block_shape([np.diff(offsets)], [before])
        grown = (max(shape[0], seg), max(shape[1], longest))
        if group and (len(group) + 1) * grown[0] * grown[1] * 4 > WRITE_BLOCK_BYTES:
            flush()
            grown = (seg, longest)
        group.append(table)
        shape = grown
    if group:
        flush()
    return out


def index_staged_rows(txn, staging: Staging, n_tables: int, n_alive: int, attrs: dict | None,
                      build) -> tuple[dict, int]:  # fmt: skip
    """Put the staged new rows in the index, where :func:`fairpipe.storage.layers.plan_layers`
    says: a new store's main layer; a new delta layer (merged with the newest ones it
    outgrows); or a rebuild of the main layer from every layer, with the segment count the live
    rows call for, and no delta. ``build(plan)`` builds the layer's tables and returns
    [(a fork to merge into ``txn`` or None, {table: (segment lengths, buckets)})]: here
    (:func:`build_tables_here`) or by the caller's jobs over blocks of tables
    (:func:`index_tables` each). ``attrs``: the store's root attributes (None for a new store).
    Returns (the index layout for the ``lsh`` attribute, segments written)."""
    plan = plan_layers(attrs, staging.base, staging.n_total, n_alive)
    make_room(txn.root, n_tables, plan.target, plan.sources)
    results = build(plan)
    txn.merge([fork for fork, _ in results if fork is not None])
    lengths = np.zeros((n_tables, 1 << plan.bits), dtype=np.int32)
    counts = np.zeros(n_tables, dtype=np.int64)
    for _, part in results:
        for t, (v, c) in part.items():
            lengths[t], counts[t] = v, c
    write_segment_lengths(txn.root, lengths, plan.target)
    write_bucket_counts(txn.root, counts, plan.target)
    for layer in plan.dropped:
        drop_arrays(txn.root, layer_arrays(layer))
    return plan.layout(), n_tables << plan.bits


def build_tables_here(session, staging: Staging, n_tables: int, plan, threads: int) -> list:
    """A layer's tables built in this process, in ``threads`` blocks at once (the kernels
    release the GIL; a table's chunks are its own, so the blocks write disjoint objects)."""

    def one(block: tuple[int, int]) -> dict:
        return index_tables(session, staging, *block, plan.bits, plan.sources, plan.target)

    blocks = even_blocks(n_tables, threads)
    with ThreadPoolExecutor(max_workers=len(blocks), thread_name_prefix="fairpipe-index") as pool:
        return [(None, built) for built in pool.map(one, blocks)]


def update_index(session, root, attrs: dict, rows: np.ndarray, keys: np.ndarray) -> int:
    """Remove the ``rows`` (sorted; their keys (r, L) given) from their buckets, rewriting only
    the segments holding them (each row in the layer holding its row number). Gives the segments
    a fresh build on the remaining rows gives. Returns the segments rewritten.
    (:func:`remove_from_tables` on blocks of tables, in forks, then :func:`write_removal`, is
    the same spread over jobs.)"""
    part = remove_from_tables(session, attrs, rows, keys, 0, int(attrs["lsh"]["n_tables"]))
    return write_removal(session, root, [part])


def remove_from_tables(session, attrs: dict, rows: np.ndarray, keys: np.ndarray, t0: int,
                       t1: int) -> dict:  # fmt: skip
    """:func:`update_index`'s segment rewrites for tables [t0, t1) only (a fork is fine;
    ``keys`` (r, t1 - t0): the rows' keys in those tables): their new segment lengths and
    bucket counts per layer, for :func:`write_removal`."""
    layers = layer_starts(attrs)
    cuts = [*np.searchsorted(rows, [start for _, start, _ in layers[1:]]).tolist(), rows.shape[0]]
    out: dict = {"tables": (t0, t1), "layers": {}, "rewritten": 0}
    exact = key_projection(attrs) == "exact"
    for (layer, _, bits), a, b in zip(layers, [0, *cuts[:-1]], cuts):
        if a == b and layer != MAIN:
            continue
        lengths, counts, rewritten = _remove_rows(session, layer, bits, rows[a:b], keys[a:b],
                                                  t0, exact)  # fmt: skip
        out["layers"][layer] = (lengths, counts)
        out["rewritten"] += rewritten
    return out


def write_removal(session, root, parts: list[dict]) -> int:
    """Write the segment lengths and bucket counts of :func:`remove_from_tables`'s ``parts``
    (blocks of tables; the other tables keep theirs). Returns the segments rewritten."""
    for layer in sorted({name for part in parts for name in part["layers"]}):
        _, lengths_name, counts_name = layer_arrays(layer)
        lengths = read_array(session, f"lsh/{lengths_name}")
        counts = read_array(session, f"lsh/{counts_name}")
        for part in parts:
            if layer in part["layers"]:
                t0, t1 = part["tables"]
                lengths[t0:t1], counts[t0:t1] = part["layers"][layer]
        write_segment_lengths(root, lengths, layer)
        root[f"lsh/{counts_name}"][...] = counts
    return sum(part["rewritten"] for part in parts)


NOT_IN_BUCKET = (
    "Row {row} is not in the bucket of table {table} ({layer} layer) that its key, recomputed "
    "from its point, names: the index and the hash disagree. Nothing was written."
)


def _remove_rows(session, layer: str, bits: int, rows: np.ndarray, keys: np.ndarray, t0: int,
                 exact: bool = True):  # fmt: skip
    """Rewrite the segments of tables [t0, t0 + keys.shape[1]) of ``layer`` without ``rows``.
    Returns those tables' (segment lengths, bucket counts, segments rewritten).

    Only the segments holding a row are read and written: fetched straight from the store, a
    run of tables at a time (at most READ_AHEAD_ENTRIES entries held, or one table), patched,
    and their chunks put back concurrently (:func:`fairpipe.storage.writes.write_chunks`); a segment that
    shrank into fewer chunks has its emptied chunks deleted.

    ``exact``: the store's keys have the exact definition, so a row that is not in the bucket
    its recomputed key names is an error. A store made before it (float32 keys) may have keys
    that depend on where a row sat in a BLAS block (docs/design/determinism.md): there a
    table where a row is not found has its removed rows' stored keys read from the table's
    segments instead (a scan of one table, rare: a cell within a float32 rounding of an
    integer), so the row leaves the bucket it is in."""
    name, lengths_name, counts_name = layer_arrays(layer)
    name = f"lsh/{name}"
    t1 = t0 + keys.shape[1]
    lengths = read_array(session, f"lsh/{lengths_name}", slice(t0, t1))
    counts = read_array(session, f"lsh/{counts_name}", slice(t0, t1))
    h_all = mix(keys)
    seg_all = segment_of(h_all, bits)  # (rows, tables)
    touched = [np.unique(seg_all[:, j]) for j in range(t1 - t0)]
    held = np.array([int(lengths[j, p].sum()) for j, p in enumerate(touched)], dtype=np.int64)
    rewritten = 0
    for j, last in table_runs(held):
        sels = [(t0 + i, int(p), slice(0, int(lengths[i, p])))
                for i in range(j, last) for p in touched[i] if lengths[i, p]]  # fmt: skip
        got = iter(read_many(session, name, sels))
        chunks: list = []
        for i in range(j, last):
            old = {int(p): next(got) if lengths[i, p] else np.zeros(0, np.int32)
                   for p in touched[i]}  # fmt: skip
            try:  # each row must be where its key, recomputed from its point, says
                new, added = _patched(old, seg_all[:, i], bits, rows, h_all[:, i])
            except NotInBucket as e:  # never leave a row number behind in another bucket
                if exact:
                    raise RuntimeError(NOT_IN_BUCKET.format(row=e.row, table=t0 + i,
                                                            layer=layer)) from e  # fmt: skip
                segs = open_array(session, name)
                h = _stored_keys(segs, t0 + i, lengths[i], rows, layer)
                seg_of = segment_of(h, bits)
                old = {int(p): read_array(session, name, (t0 + i, int(p),
                                                          slice(0, int(lengths[i, p]))))
                       for p in np.unique(seg_of)}  # fmt: skip
                try:
                    new, added = _patched(old, seg_of, bits, rows, h)
                except NotInBucket as again:
                    message = NOT_IN_BUCKET.format(row=again.row, table=t0 + i, layer=layer)
                    raise RuntimeError(message) from again
            counts[i] += added
            rewritten += len(new)
            for p, seg in new.items():
                chunks += _segment_chunks(t0 + i, p, seg, int(lengths[i, p]))
                lengths[i, p] = seg.shape[0]
        write_chunks(session, name, chunks)
    return lengths, counts, rewritten


def _patched(old: dict, seg_of: np.ndarray, bits: int, rows: np.ndarray, h: np.ndarray):
    """The segments ``old`` (by number) patched without the ``rows`` they hold (mixed keys ``h``,
    segments ``seg_of``): (new segments by number, change of the bucket count). Raises
    :class:`NotInBucket` for a row that is not in the bucket ``h`` names."""
    new, added = {}, 0
    for p, seg in old.items():
        mine = seg_of == p
        patched = patch(seg, bits, rows[mine], removed_h=h[mine])
        added += (int(patched[0]) if patched.size else 0) - (int(seg[0]) if seg.size else 0)
        new[p] = patched
    return new, added


def _segment_chunks(t: int, p: int, seg: np.ndarray, old_length: int) -> list:
    """The chunks of segment (t, p) holding ``seg`` (zero-padded), and zeroed chunks where its
    old length reached further (written as zeros, they are deleted)."""
    n_chunks = -(-max(seg.shape[0], old_length) // SEGMENT_CHUNK)
    padded = np.zeros(n_chunks * SEGMENT_CHUNK, dtype=np.int32)
    padded[: seg.shape[0]] = seg
    return [((t, p, c), padded[c * SEGMENT_CHUNK : (c + 1) * SEGMENT_CHUNK].reshape(1, 1, -1))
            for c in range(n_chunks)]  # fmt: skip


def _stored_keys(segs, t: int, lengths: np.ndarray, rows: np.ndarray, layer: str) -> np.ndarray:
    """The mixed keys of the buckets of table ``t`` (of this layer) that hold ``rows``, read from
    all its segments; an error naming the first row that is in none."""
    width = _padded(int(lengths.max()))
    sel = (t, slice(0, lengths.shape[0]), slice(0, width))
    with zarr_checked(segs, sel):
        block = np.asarray(segs[sel]) if width else None
    h = np.zeros(rows.shape[0], dtype=np.uint64)
    found = np.zeros(rows.shape[0], dtype=bool)
    order = np.argsort(rows, kind="stable")
    for p in np.flatnonzero(lengths):
        assert block is not None
        problem = segment_problem(block[p, : int(lengths[p])])
        if problem is not None:
            raise DamagedPartError(f"Segment ({t}, {p}) of array '{segs.path}'", problem)
        bucket_h, ends, members = decode(block[p, : int(lengths[p])])
        pos = np.flatnonzero(np.isin(members, rows))
        at = order[np.searchsorted(rows[order], members[pos])]
        h[at] = bucket_h[np.searchsorted(ends, pos, side="right")]
        found[at] = True
    if not found.all():
        row = int(rows[np.argmin(found)])
        raise RuntimeError(
            f"Row {row} is in no bucket of table {t} ({layer} layer): the index and the rows "
            "disagree. Nothing was written."
        )
    return h


def keys_of_rows(session, lsh: E2LSH, rows: np.ndarray) -> np.ndarray:
    """The bucket keys (r, L) of stored ``rows`` (sorted), recomputed from their points."""
    X = read_rows_at(session, "points", rows)
    return lsh.hash_validated(X) if rows.size else np.zeros((0, lsh.n_tables), np.uint64)
