"""The rows of a dataset and their LSH bucket index in the store.

Layout (store format 2):

- ``points`` float32 (n, d) in chunks of ``POINT_BLOCK`` rows (dividing ``chunk_rows``, the unit
  one writer owns), so a query reads the few rows it needs; ``ids`` int64 (n,), ``groups`` int32
  (n,), ``alive`` bool (n,), chunked by ``chunk_rows``; group names and parameters in the root
  attributes;
- ``id_ranges`` int64 (chunks of ``ids``, 2): the smallest and largest id of each chunk of ``ids``
  (its attribute ``rows``: the rows it covers), so that finding ids reads only the chunks that
  may hold them (:class:`StoredIds`); stores made before it have none and read every id;
- ``sketch`` uint8 (n, d + 12) in chunks of ``SKETCH_BLOCK`` rows: a byte per coordinate of each
  point plus its range and error bound (:func:`fairpipe.neighbors.sketch_points`), written with
  the points and erased with them; a query decides most candidates' distances from it
  (:mod:`storage.reader`). Root attribute ``point_sketch`` true; stores made before it have none
  and are read without it;
- ``sketch_residual`` uint8 (n, d + 4), chunked as the sketch: a signed byte per coordinate
  refining it (:func:`fairpipe.neighbors.sketch_levels`), written and erased with it; a query
  reads it only for the candidates the sketch leaves open. Root attribute
  ``point_sketch_residual`` true; stores made before it have none;
- ``lsh/projections`` (d, L*k), ``lsh/offsets`` (L*k,), ``lsh/multipliers`` (k,): the hash
  functions (:meth:`fairpipe.neighbors.E2LSH.to_arrays`); their parameters in the root attribute
  ``lsh`` as ``{"k", "n_tables", "width", "seed", "segment_bits"}`` (the library's ``n_hashes``
  and ``bucket_width`` are stored as ``k`` and ``width``);
- ``lsh/segments`` int32 (L, 2**segment_bits, S): each table's buckets cut into segments by a
  hash of their key (:mod:`fairpipe.neighbors._segments`), one segment per (table, segment) row,
  in chunks of ``SEGMENT_CHUNK`` entries; ``lsh/segment_lengths`` int32 (L, 2**segment_bits):
  the used length of each; ``lsh/bucket_counts`` int64 (L,). A deletion rewrites the segments
  it changes; a query reads one segment per table. Nothing is stored per (row, table) beyond the
  member entry itself (about 4 bytes, plus 12 per bucket): a row's keys are recomputed from its
  point when needed.
- the **deltas**: the rows appended since the last build, in layers of consecutive rows, each
  with the same layout as the main one (``lsh/delta_<start>``, ``lsh/delta_<start>_lengths``,
  ``lsh/delta_<start>_bucket_counts``; its own segment bits), listed oldest first in the ``lsh``
  attribute ``deltas`` as ``[name, first row, segment bits]`` (``delta_start``: the first row of
  the oldest; both absent when there is no delta). An append writes its rows as a new layer,
  merged with the newest layers while they hold no more rows than it (a binary counter, as in
  Bentley and Saxe's logarithmic method: a row is rewritten about log2 of the deltas' rows over
  an append's times before the next build, and there are at most ``MAX_DELTAS`` layers), so
  its cost follows the appended rows, not n; the append that would take the deltas past
  1/``DELTA_SHARE`` of the live rows rebuilds the main layer from every layer and drops the
  deltas. A query reads a bucket from every layer. (A store made before the layers has one
  delta named ``delta`` with the attributes ``delta_bits`` and ``delta_start``: read as such,
  and merged into the layers by later appends.)

A forgotten row keeps its place (row numbers are stable) but is erased: points and sketches zeroed,
group -1, ``alive`` false, and it leaves every bucket. Format 1 stores (uint64 ``lsh/keys`` and (L, n)
padded index arrays) are read as they are and upgraded to format 2 by the next write.
"""

from __future__ import annotations

import ctypes
import math
import sys
from dataclasses import dataclass

import numpy as np

from fairpipe.datasets import apply_scaler
from fairpipe.neighbors import (
    E2LSH,
    LSH_ARRAYS,
    RESIDUAL_EXTRA,
    ROW_BLOCK,
    SKETCH_EXTRA,
    BucketIndex,
    FairNN,
    NotInBucket,
    build_segments,
    decode,
    entries,
    mix,
    pack_runs,
    partition_bits,
    patch,
    segment_of,
    segment_problem,
    sketch_levels,
    unmix,
)
from fairpipe.validation import IdLookup
from storage.damage import DamagedPartError
from storage.names import current_names
from storage.staging import STAGING_MARK, Staging, stale_staging  # noqa: F401 (re-exported)
from storage.store import (
    FORMAT,
    create_array,
    open_array,
    open_group,
    read_array,
    read_arrays,
    read_many,
    read_rows_at,
    rewrite_rows_at,
    write_chunks,
    write_rows,
    zarr_checked,
)

TARGET_CHUNK_BYTES = 16 << 20
EMPTY_KEY = np.iinfo(np.uint64).max
POINT_BLOCK = 2048  # rows per chunk of points (1 MB at d = 128): what a query reads for one row
SKETCH_BLOCK = 4096  # rows per chunk of the point sketch (0.5 MB at d = 128)
SKETCH_ATTR = "point_sketch"  # root attribute: the store keeps a sketch of every row's point
RESIDUAL_ATTR = "point_sketch_residual"  # root attribute: and its residual
SEGMENT_CHUNK = 65536  # int32 entries per chunk of a segment: most segments are one chunk
SEGMENT_CAPACITY = 1 << 34  # the segments' last dimension: larger than any segment can be
MAX_SEGMENTS = 1 << 20  # segments per table at most (2**31 rows at 2048 rows per segment)
INDEX_BLOCK_BYTES = 256 << 20  # index entries one job holds at most
WRITE_BLOCK_BYTES = 64 << 20  # segments of several tables written in one call, at most
# Appended rows stay in the deltas while at most 1/DELTA_SHARE of the live rows (and no layer
# would hold more than 3/4 of that: plan_layers). A rebuild of the main layer costs about 0.6
# of a build at 1M (reading every entry back), so rebuilding rarely pays: with the deltas'
# binary merges, 1/4 costs about 1.3% of a build less per 1% append than 1/8 (a model of the
# measured costs over 100 appends: 5.5% against 6.8%); larger shares need more layers for the
# same merge cost, and a query reads a bucket from each.
DELTA_SHARE = 4
MAX_DELTAS = 4  # delta layers at most (a query reads a segment per table from each)
ID_RANGES = "id_ranges"
LIVE_PER_GROUP = "live_per_group"  # root attribute: live rows per group
ID_RANGE_BLOCK = 65536  # chunks of ids per chunk of their ranges (1 MB)
MAIN = "main"  # the index's main layer (the others are deltas, named ``delta_<first row>``)
# E2LSH's parameters, kept under their own names in the store's ``lsh`` attribute.
LSH_PARAMS = ("n_hashes", "n_tables", "bucket_width", "seed")


def choose_chunk_rows(d: int) -> int:
    """Rows per chunk: about 16 MB of points, a multiple of the hashing block."""
    rows = TARGET_CHUNK_BYTES // max(4 * d, 1)
    return int(min(max(rows // ROW_BLOCK * ROW_BLOCK, ROW_BLOCK), 65536))


def store_format(attrs: dict) -> int:
    return int(attrs.get("fairpipe_format", FORMAT))


# -- the hash functions ---------------------------------------------------------------------------
def lsh_attrs(lsh: E2LSH, layout: dict) -> dict:
    """The ``lsh`` root attribute of a store for these hash functions and index ``layout``
    (``segment_bits``, and ``deltas``/``delta_start`` when there are deltas)."""
    params = lsh.get_params()
    layout = {k: v if k == "deltas" else int(v) for k, v in layout.items()}
    return {**{name: params[name] for name in LSH_PARAMS},
            "projection": lsh.projection, **layout}  # fmt: skip


def layer_arrays(layer: str) -> tuple[str, str, str]:
    """The arrays under ``lsh/`` of an index layer: (segments, segment lengths, bucket counts)."""
    if layer == MAIN:
        return ("segments", "segment_lengths", "bucket_counts")
    return (layer, f"{layer}_lengths", f"{layer}_bucket_counts")


def deltas_of(attrs: dict) -> list[tuple[str, int, int]]:
    """The store's delta layers, oldest first: (name, first row, segment bits); a layer holds
    the rows from its first row to the next layer's (the last: to ``n``)."""
    lsh = attrs["lsh"]
    if lsh.get("deltas") is not None:
        return [(str(name), int(start), int(bits)) for name, start, bits in lsh["deltas"]]
    if lsh.get("delta_bits") is not None:  # a store made before the layers: one delta
        return [("delta", int(lsh["delta_start"]), int(lsh["delta_bits"]))]
    return []


def layer_starts(attrs: dict) -> list[tuple[str, int, int]]:
    """Every layer as (name, first row, segment bits), in row order (the main layer first)."""
    return [(MAIN, 0, int(attrs["lsh"]["segment_bits"])), *deltas_of(attrs)]


def layer_bits(attrs: dict) -> dict[str, int]:
    """Segment bits of each layer of the store's index, in row order (the main layer first)."""
    return {name: bits for name, _, bits in layer_starts(attrs)}


@dataclass(frozen=True)
class LayerPlan:
    """Where an append's rows go in the index: the layers whose entries are read back
    (``sources``, in row order), the layer written (``target``, holding the rows from
    ``start``; ``bits``: its segment bits), the store's deltas afterwards and the main
    layer's segment bits afterwards."""

    sources: tuple[str, ...]
    target: str
    start: int
    bits: int
    deltas: tuple[tuple[str, int, int], ...]
    main_bits: int

    @property
    def dropped(self) -> list[str]:
        """Layers merged into the target (their arrays are removed)."""
        return [name for name in self.sources if name != self.target]

    def layout(self) -> dict:
        """The index layout for the ``lsh`` attribute."""
        if not self.deltas:
            return {"segment_bits": self.main_bits}
        return {"segment_bits": self.main_bits, "deltas": [list(d) for d in self.deltas],
                "delta_start": self.deltas[0][1]}  # fmt: skip


def delta_bits(rows: int) -> int:
    """Segment bits of a delta layer of ``rows`` rows: as many as a main layer's, or more, so
    that a segment fits in one chunk even when every bucket holds one row (4 entries a row: the
    buckets of a small layer are mostly singletons; a main layer's 32k rows per segment would
    make such segments 2-3 chunks, all read by every query)."""
    worst = 4 * rows + 1
    fits = max(0, math.ceil(math.log2(worst / (0.75 * SEGMENT_CHUNK))))
    return max(partition_bits(rows), fits)


def plan_layers(attrs: dict | None, base: int, n_total: int, n_alive: int) -> LayerPlan:
    """Where the rows [base, n_total) appended to a store (root attributes ``attrs``; None for a
    new store) go: a new store's main layer; else a new delta layer, merged with the newest
    layers while they hold no more rows than the layer being made (or while there would be more
    than MAX_DELTAS); else, when the deltas would hold more than 1/DELTA_SHARE of the
    ``n_alive`` live rows, or that layer more than 3/4 of that, a rebuild of the main layer
    from every layer and no delta. (A merge into a layer of most of the deltas' allowance costs
    a good part of a rebuild and is followed by one within a few appends: measured at 1M, the
    32nd 1% append merged 32% of the rows in 6.1 s, the 34th rebuilt in 10.3 s. Half the
    allowance was too early: the 16th append rebuilt, so a cycle of 16 appends cost 8.7% of a
    build per append, against 7.0% for the 34.)"""
    rebuilt = partition_bits(n_alive)  # the main layer's bits when this builds it
    if attrs is None:
        return LayerPlan((), MAIN, 0, rebuilt, (), rebuilt)
    deltas = deltas_of(attrs)
    rebuild = LayerPlan((MAIN, *(name for name, _, _ in deltas)), MAIN, 0, rebuilt, (), rebuilt)
    first = deltas[0][1] if deltas else base
    if (n_total - first) * DELTA_SHARE > n_alive:
        return rebuild
    kept, start, merged = list(deltas), base, list[str]()
    while kept and (start - kept[-1][1] <= n_total - start or len(kept) >= MAX_DELTAS):
        name, start, _ = kept.pop()
        merged.insert(0, name)
    if (n_total - start) * DELTA_SHARE * 4 > 3 * n_alive:
        return rebuild
    bits = delta_bits(n_total - start)
    target = f"delta_{start}"
    after = (*kept, (target, start, bits))
    return LayerPlan(tuple(merged), target, start, bits, after, int(attrs["lsh"]["segment_bits"]))


def load_lsh(session, attrs: dict) -> E2LSH:
    """The store's hash functions (``attrs``: the root attributes)."""
    arrays = read_arrays(session, [f"lsh/{name}" for name in LSH_ARRAYS])
    return lsh_from_arrays(dict(zip(LSH_ARRAYS, arrays)), attrs)


def key_projection(attrs: dict) -> str:
    """The definition the store's keys were made with: ``"exact"``, or ``"float32"`` for stores
    made before it (their ``lsh`` attribute has no ``projection``)."""
    return attrs["lsh"].get("projection", "float32")


def lsh_from_arrays(arrays: dict, attrs: dict) -> E2LSH:
    """The hash functions from their stored arrays and the root attributes."""
    params = {name: attrs["lsh"][name] for name in LSH_PARAMS}
    # Stores made before the exact projection keep the float32 one their keys were made by.
    params["projection"] = key_projection(attrs)
    return E2LSH.from_arrays(arrays, **params)


# -- writing rows ---------------------------------------------------------------------------------
def has_sketch(attrs) -> bool:
    """Whether the store keeps the point sketch (stores made before it do not; they are read
    without it)."""
    return bool(attrs.get(SKETCH_ATTR, False))


def has_residual(attrs) -> bool:
    """Whether the store keeps the sketch's residual (stores made before it do not)."""
    return has_sketch(attrs) and bool(attrs.get(RESIDUAL_ATTR, False))


def sketch_arrays(attrs) -> list[str]:
    """The per-row sketch arrays the store keeps: none, ``sketch``, or it and its residual."""
    return ["sketch", "sketch_residual"][: has_sketch(attrs) + has_residual(attrs)]


def write_points(session, start: int, X: np.ndarray, sketches: list[str]) -> None:
    """Write new rows' points at ``start``, and the sketch arrays ``sketches`` the store keeps
    (:func:`sketch_arrays`)."""
    write_rows(session, "points", start, X)
    if sketches:
        sketch, residual = sketch_levels(X, residual="sketch_residual" in sketches)
        write_rows(session, "sketch", start, sketch)
        if residual is not None:
            write_rows(session, "sketch_residual", start, residual)


def create_layout(root, d: int, lsh: E2LSH, chunk_rows: int) -> None:
    """The empty arrays of a new store, and its hash functions."""
    # Points in chunks of POINT_BLOCK rows (dividing chunk_rows, so a writer of chunk_rows rows
    # owns whole chunks): a query reads the few it needs. (Zarr sharding with smaller inner
    # chunks was measured 10x slower to read whole, at about 0.65 ms per inner chunk.) Stored
    # uncompressed: a query reads a chunk for each of its candidates' rows, which spread over
    # nearly every chunk, and decoding was half of that read's time (float32 features rarely
    # compress: 3% on gaussian data).
    block = math.gcd(chunk_rows, POINT_BLOCK)
    create_array(root, "points", shape=(0, d), chunks=(block, d), dtype="float32",
                 compressors=None)  # fmt: skip
    # The sketch (fairpipe.neighbors.sketch_points, d + 12 bytes a row): a query decides most
    # candidates' distances from it and reads the points of the few it cannot (a quarter of
    # the bytes of the points; a cold query's read of the candidates was most of its time).
    block = math.gcd(chunk_rows, SKETCH_BLOCK)
    create_array(root, "sketch", shape=(0, d + SKETCH_EXTRA), chunks=(block, d + SKETCH_EXTRA),
                 dtype="uint8", compressors=None)  # fmt: skip
    root.attrs[SKETCH_ATTR] = True
    # Its residual (d + 4 bytes a row), read only for the candidates the sketch leaves open:
    # where they are many (a radius where candidates are dense) it replaces reading their points.
    create_array(root, "sketch_residual", shape=(0, d + RESIDUAL_EXTRA),
                 chunks=(block, d + RESIDUAL_EXTRA), dtype="uint8", compressors=None)  # fmt: skip
    root.attrs[RESIDUAL_ATTR] = True
    create_array(root, "ids", shape=(0,), chunks=(chunk_rows,), dtype="int64")
    create_array(root, ID_RANGES, shape=(0, 2), chunks=(ID_RANGE_BLOCK, 2), dtype="int64")
    root[ID_RANGES].attrs["rows"] = 0
    create_array(root, "groups", shape=(0,), chunks=(chunk_rows,), dtype="int32")
    create_array(root, "alive", shape=(0,), chunks=(chunk_rows,), dtype="bool")
    root.create_group("lsh")
    for name, arr in lsh.to_arrays().items():
        create_array(root, f"lsh/{name}", shape=arr.shape, dtype=arr.dtype)[...] = arr


def grow(root, n_total: int) -> None:
    """Make room for ``n_total`` rows."""
    names = ["points", "ids", "groups", "alive"] + sketch_arrays(root.attrs)
    for name in names:
        arr = root[name]
        arr.resize((n_total, *arr.shape[1:]))
    if ID_RANGES in root:
        root[ID_RANGES].resize((-(-n_total // root["ids"].chunks[0]), 2))


def row_chunks(base: int, n_total: int, chunk_rows: int) -> list[tuple[int, int]]:
    """Row ranges of new rows [base, n_total), relative to ``base``, aligned to the store's row
    chunks so that no two writers share a Zarr chunk."""
    edges = list(range(base, n_total, chunk_rows))
    if base % chunk_rows:
        first = (base // chunk_rows + 1) * chunk_rows
        edges = [base, *range(first, n_total, chunk_rows)]
    edges.append(n_total)
    return [(a - base, b - base) for a, b in zip(edges[:-1], edges[1:])]


def write_new_rows(session, start: int, ids, groups) -> None:
    """Write new (live) rows' ids and groups at ``start`` (13 bytes a row: the flow writes them
    itself; the chunk jobs write the points, :func:`storage.store.write_rows`)."""
    write_rows(session, "ids", start, ids)
    write_rows(session, "groups", start, groups)
    write_rows(session, "alive", start, np.ones(ids.shape[0], dtype=bool))
    write_id_ranges(session, start, np.asarray(ids, dtype=np.int64))


def write_id_ranges(session, start: int, ids: np.ndarray) -> None:
    """``id_ranges`` of the chunks of ``ids`` that rows [start, start + len(ids)) fall in (the
    first merged with the rows it held before ``start``), and the rows it now covers. A store
    without it is left so (it reads every id)."""
    root = open_group(session, mode="a")
    if ID_RANGES not in root or ids.size == 0:
        return
    arr, chunk = root[ID_RANGES], root["ids"].chunks[0]
    if int(arr.attrs.get("rows", -1)) != start:  # written by a version that did not keep it
        return
    end = start + ids.size
    c0, c1 = start // chunk, (end - 1) // chunk + 1
    cuts = np.clip(np.arange(c0, c1) * chunk, start, end) - start
    ranges = np.stack([np.minimum.reduceat(ids, cuts), np.maximum.reduceat(ids, cuts)], axis=1)
    if start % chunk:  # the first chunk held rows before
        old = read_array(session, ID_RANGES, slice(c0, c0 + 1))[0]
        ranges[0] = min(ranges[0, 0], old[0]), max(ranges[0, 1], old[1])
    write_rows(session, ID_RANGES, c0, ranges)
    arr.attrs["rows"] = end


class StoredIds:
    """Rows of stored ids, found by reading only the chunks of ``ids`` whose range of ids may
    hold one asked for (``id_ranges``); ids assigned as row numbers, or increasing in the
    source, fall in one chunk each, so finding a few costs a few chunks, not n. Where the store
    keeps no ranges (made before them, or appended by a version that did not keep them), or
    more than half the chunks may hold one, every id is read once. ``rows`` is
    :meth:`fairpipe.validation.IdLookup.rows`."""

    def __init__(self, session, n: int):
        self.session, self.n = session, n
        self._all: IdLookup | None = None
        self._chunks: dict[int, IdLookup] = {}
        self.ranges: np.ndarray | None = None
        try:
            arr = open_array(session, ID_RANGES)
        except (KeyError, FileNotFoundError):  # zarr's ArrayNotFoundError is a FileNotFoundError
            return
        self.chunk = int(open_array(session, "ids").chunks[0])
        if int(arr.attrs.get("rows", -1)) == n and arr.shape[0] == -(-n // self.chunk):
            self.ranges = read_array(session, ID_RANGES)

    def rows(self, wanted) -> tuple[np.ndarray, np.ndarray]:
        wanted = np.asarray(wanted, dtype=np.int64)
        if self._all is None and self.ranges is not None and self.ranges.shape[0]:
            ordered = np.sort(wanted)
            lo, hi = self.ranges[:, 0], self.ranges[:, 1]
            holds = np.searchsorted(ordered, hi, "right") > np.searchsorted(ordered, lo, "left")
            hit = np.flatnonzero(holds)
            if 2 * hit.size <= self.ranges.shape[0]:
                return self._from_chunks(wanted, hit.tolist())
        if self._all is None:
            self._all = IdLookup(read_array(self.session, "ids"))
        return self._all.rows(wanted)

    def _from_chunks(self, wanted: np.ndarray, chunks: list[int]):
        missing = [c for c in chunks if c not in self._chunks]
        sels = [slice(c * self.chunk, min((c + 1) * self.chunk, self.n)) for c in missing]
        for c, values in zip(missing, read_many(self.session, "ids", [(s,) for s in sels])):
            self._chunks[c] = IdLookup(values)
        row = np.full(wanted.shape[0], -1, dtype=np.int64)
        for c in chunks:
            found, known = self._chunks[c].rows(wanted)
            row[known] = found + c * self.chunk
        known = row >= 0
        return row[known], known


def erase_rows(session, root, rows: np.ndarray) -> None:
    """Erase the live ``rows`` (sorted) in place, chunk by chunk: points (and sketches) zeroed,
    groups -1, alive false; the root's ``n_alive`` drops by their number. Each array's chunks
    that hold none of the rows are neither read nor written."""
    before = dict(root.attrs)
    per_group = counts_of(before)
    root.attrs["n_alive"] = int(before["n_alive"]) - int(rows.size)
    erased: list[tuple[str, object]] = [("points", 0.0), ("groups", -1), ("alive", False)]
    erased += [(name, 0) for name in sketch_arrays(before)]
    if "keys" in root["lsh"]:  # a format 1 store not yet upgraded
        erased.append(("lsh/keys", EMPTY_KEY))
    for name, value in erased:
        # Only the chunks holding an erased row are read and written (a point chunk holds
        # POINT_BLOCK rows, a sketch chunk SKETCH_BLOCK): a one-id forget rewrites 1 MB of
        # points at d = 128, not the writer's whole chunk_rows block (16 MB).

        def edit(chunk: np.ndarray, local: np.ndarray, name=name, value=value) -> None:
            nonlocal per_group
            if name == "groups" and per_group is not None:
                per_group -= np.bincount(chunk[local], minlength=per_group.size)[: per_group.size]
            chunk[local] = value

        rewrite_rows_at(session, name, rows, edit)
    if per_group is not None:
        root.attrs[LIVE_PER_GROUP] = {"rows": int(before["n"]), "counts": per_group.tolist()}


def write_dataset_attrs(root, before: dict, *, n: int, per_group: list[int], d: int, seed: int,
                        chunk_rows: int, group_names: list[str], lsh: E2LSH, layout: dict,
                        suggested_radius: float, source: str,
                        tuning: dict | None = None, scale: dict | None = None,
                        feature_names: list[str] | None = None) -> dict:  # fmt: skip
    """The root attributes after an ingest (``before``: those it started from); returns them.
    ``tuning``: what the parameters promise, kept in the ``lsh`` attribute (``radius``,
    ``recall_target``, ``expected_recall``, ``expected_candidates``: flows.parameters);
    ``scale``: a new store's scaling (:func:`scaler_of`), None to keep the store's;
    ``feature_names``: a new store's feature columns (a table's), None to keep the store's."""
    meta = {
        "fairpipe_format": FORMAT,
        "n": n,
        "n_alive": sum(per_group),
        LIVE_PER_GROUP: {"rows": n, "counts": per_group},
        "d": d,
        "seed": seed,
        "chunk_rows": chunk_rows,
        "group_names": group_names,
        "lsh": {**lsh_attrs(lsh, layout), **(tuning or {})},
        "suggested_radius": suggested_radius,
        "sources": [*before.get("sources", []), source],
    }
    if scale is not None:
        meta[SCALE] = scale
    if feature_names:
        meta[FEATURE_NAMES] = list(feature_names)
    root.attrs.update(meta)
    return meta


# The root attribute naming a table's feature columns, in the order of the points' columns.
FEATURE_NAMES = "feature_names"


def feature_names(attrs: dict) -> list[str]:
    """The names of the store's feature columns: a table's own, else x0, x1, ..."""
    names = attrs.get(FEATURE_NAMES)
    d = int(attrs["d"])
    return list(names) if names and len(names) == d else [f"x{j}" for j in range(d)]


# -- scaling ---------------------------------------------------------------------------------------
# The root attribute of the scaling ingest applied to the points: ``method`` (none, standard,
# robust) and, when scaled, ``center`` and ``scale`` per column (float64) and the rows they were
# fitted on. A store without it holds its points as they came.
SCALE = "scale"


def scale_method(attrs: dict) -> str:
    """How the store's points are scaled: ``none``, ``standard`` or ``robust``."""
    return str(attrs.get(SCALE, {}).get("method", "none"))


def scaler_of(attrs: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """The store's scaler (center, scale), None where its points are unscaled."""
    kept = attrs.get(SCALE, {})
    if "center" not in kept:
        return None
    return (np.asarray(kept["center"], dtype=np.float64),
            np.asarray(kept["scale"], dtype=np.float64))  # fmt: skip


def scale_points(attrs: dict, X: np.ndarray) -> np.ndarray:
    """Points given in the source's units, scaled as the store's points were (a query by
    value); as they are for an unscaled store."""
    scaler = scaler_of(attrs)
    return X if scaler is None else apply_scaler(X, *scaler)


def unscale_points(attrs: dict, X: np.ndarray) -> np.ndarray:
    """Stored points back in the source's units (float64; up to float32 rounding): what a
    user reads of a row of a scaled store."""
    scaler = scaler_of(attrs)
    X = np.asarray(X, dtype=np.float64)
    return X if scaler is None else X * scaler[1] + scaler[0]


# -- the bucket index -----------------------------------------------------------------------------
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
    delta and any format 1 arrays too). Its shape is the largest any store needs; only the
    chunks written exist."""
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
    may change)."""
    name = layer_arrays(layer)[1]
    drop_arrays(root, [name])
    create_array(root, f"lsh/{name}", shape=lengths.shape, chunks=lengths.shape,
                 dtype="int32", fill_value=0)[...] = lengths  # fmt: skip


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
    :class:`storage.damage.DamagedPartError` naming it, never an index out of bounds."""
    name = f"lsh/{layer_arrays(layer)[0]}"
    got = read_many(session, name, sels)
    for (t, p, _), seg in zip(sels, got):
        problem = segment_problem(seg, n_rows)
        if problem is not None:
            raise DamagedPartError(f"Segment ({t}, {p}) of array '{name}'", problem)
    return got


def read_tables_entries(session, t0: int, lengths: np.ndarray, layer: str = MAIN,
                        n_rows: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """(mixed keys, rows) of every entry of tables ``t0, t0 + 1, ...`` in ``layer``
    (``lengths``: their segment lengths there, a row per table), their segments fetched
    together (a read per table cost about 4 ms for a small delta, mostly opening the array
    again) and checked (:func:`read_checked_segments`)."""
    sels = [(t0 + j, int(p), slice(0, int(v[p])))
            for j, v in enumerate(lengths) for p in np.flatnonzero(v)]  # fmt: skip
    got = iter(read_checked_segments(session, layer, sels, n_rows))
    out = []
    for v in lengths:
        parts = [entries(next(got)) for _ in np.flatnonzero(v)]
        out.append((np.concatenate([h for h, _ in parts]), np.concatenate([r for _, r in parts]))
                   if parts else (np.zeros(0, np.uint64), np.zeros(0, np.int64)))  # fmt: skip
    return out


READ_AHEAD_ENTRIES = 4_000_000  # indexed entries read ahead at once (64 MB decoded)


def _table_runs(held: np.ndarray):
    """Runs [j, last) of consecutive tables holding at most READ_AHEAD_ENTRIES entries together
    (or one table), ``held``: the entries each table holds (what a reader keeps at once)."""
    j = 0
    while j < held.shape[0]:
        last = j + 1
        while last < held.shape[0] and held[j : last + 1].sum() <= READ_AHEAD_ENTRIES:
            last += 1
        yield j, last
        j = last


def _indexed_entries(session, t0: int, t1: int, given: list, n_rows: int | None = None):
    """Per table of [t0, t1), the (mixed keys, rows) each layer of ``given`` ((layer, its
    segment lengths of those tables)) holds, read ahead in runs of tables holding at most
    READ_AHEAD_ENTRIES entries (or one table)."""
    held = sum((lengths.sum(axis=1) for _, lengths in given), np.zeros(t1 - t0, np.int64))
    for j, last in _table_runs(held):
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
    for j, parts in enumerate(_indexed_entries(session, t0, t1, given)):
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
    and their chunks put back concurrently (:func:`storage.store.write_chunks`); a segment that
    shrank into fewer chunks has its emptied chunks deleted.

    ``exact``: the store's keys have the exact definition, so a row that is not in the bucket
    its recomputed key names is an error. A store made before it (float32 keys) may have keys
    that depend on where a row sat in a BLAS block (docs/architecture.md, Determinism): there a
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
    for j, last in _table_runs(held):
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


def load_index(session, attrs: dict) -> BucketIndex:
    """Every table's buckets, concatenated (a table's buckets in increasing mixed key, the
    deltas' members of a bucket after the main layer's, in row order: as a fresh build)."""
    if store_format(attrs) == 1:
        return _load_format1_index(session, int(attrs["n_alive"]))
    names = list(layer_bits(attrs))
    got = read_arrays(session, [f"lsh/{layer_arrays(name)[1]}" for name in names])
    given = list(zip(names, got))
    tables = []
    for parts in _indexed_entries(session, 0, got[0].shape[0], given, int(attrs["n"])):
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


def _load_format1_index(session, n_alive: int) -> BucketIndex:
    counts = read_array(session, "lsh/bucket_counts")
    keys = read_array(session, "lsh/bucket_keys")
    starts = read_array(session, "lsh/bucket_starts")
    members = read_array(session, "lsh/members")
    tables = [
        (keys[t, : counts[t]], starts[t, : counts[t] + 1], members[t, :n_alive])
        for t in range(counts.shape[0])
    ]
    return BucketIndex.from_tables(tables)


def upgrade_format1(session, root, attrs: dict) -> dict:
    """The root attributes of a store whose index is format 2: a format 1 store's index is
    rebuilt as segments (from its stored keys) and its old arrays dropped, in the caller's
    transaction (a store already in format 2 is left as it is)."""
    if store_format(attrs) != 1:
        return attrs
    keys = read_array(session, "lsh/keys")
    alive = read_array(session, "alive")
    rows = np.flatnonzero(alive)
    n_tables = keys.shape[1]
    bits = partition_bits(rows.shape[0])
    create_index(root, n_tables)  # drops keys, members, bucket_* as well
    lengths = np.zeros((n_tables, 1 << bits), dtype=np.int32)
    counts = np.zeros(n_tables, dtype=np.int64)
    for t in range(n_tables):
        flat, offsets = build_segments(keys[rows, t], rows, bits)
        lengths[t] = write_tables(session, t, [(flat, offsets)], [np.zeros(0, np.int32)])[0]
        counts[t] = bucket_count(flat, offsets)
    write_segment_lengths(root, lengths)
    write_bucket_counts(root, counts)
    root.attrs.update({"fairpipe_format": FORMAT, "lsh": {**attrs["lsh"], "segment_bits": bits}})
    return dict(root.attrs)


def load_sampler(session, attrs: dict) -> FairNN:
    """A :class:`FairNN` over the store's rows and index, everything read into memory (the hot
    path of a long-lived process). It holds the points, ids and alive flags, and the index as
    :func:`load_compact_index` reads it (members int32): about n x (4 d + 4 L + 9) bytes plus
    16 bytes a bucket; each row's keys are made from the index only if asked for
    (``FairNN.keys_``)."""
    lsh = load_lsh(session, attrs)
    if store_format(attrs) == 1:
        index = load_index(session, attrs)
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


def load_compact_index(session, attrs: dict) -> BucketIndex:
    """:func:`load_index` (the same buckets, keys and members, in the same order) for a format 2
    store, built bucket by bucket from the segments rather than entry by entry: members stay
    int32 and nothing the size of all entries is made but the three arrays it returns (each
    allocated at an upper bound, filled from the start, then shrunk in place: the pages never
    written are never committed)."""
    names = list(layer_bits(attrs))
    lengths = read_arrays(session, [f"lsh/{layer_arrays(name)[1]}" for name in names])
    n_tables = int(lengths[0].shape[0])
    upper = int(sum(int(v.sum()) for v in lengths))  # segment words: at least the entries
    members = np.empty(max(upper, 1), dtype=np.int32)
    keys = np.empty(max(upper, 1), dtype=np.uint64)
    starts = np.empty(max(upper, 1) + 1, dtype=np.int64)
    n_entries = n_buckets = 0
    held = sum((v.sum(axis=1) for v in lengths), np.zeros(n_tables, np.int64))
    for j, last in _table_runs(held):
        per_layer = [_read_segments(session, name, j, v[j:last], int(attrs["n"]))
                     for name, v in zip(names, lengths)]  # fmt: skip
        for i in range(last - j):
            h, sizes, rows = _table_buckets([layer[i] for layer in per_layer])
            nb, ne = h.shape[0], rows.shape[0]
            keys[n_buckets : n_buckets + nb] = unmix(h)
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


def _read_segments(session, layer: str, t0: int, lengths: np.ndarray,
                   n_rows: int | None = None) -> list[list[np.ndarray]]:  # fmt: skip
    """The non-empty segments of tables ``t0, t0 + 1, ...`` of ``layer``, per table in
    segment order (increasing mixed keys), fetched together and checked
    (:func:`read_checked_segments`)."""
    sels = [(t0 + j, int(p), slice(0, int(v[p])))
            for j, v in enumerate(lengths) for p in np.flatnonzero(v)]  # fmt: skip
    got = iter(read_checked_segments(session, layer, sels, n_rows))
    return [[next(got) for _ in np.flatnonzero(v)] for v in lengths]


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


# -- reading rows ---------------------------------------------------------------------------------
def n_features(session) -> int:
    return int(read_array(session, "points", slice(0, 1)).shape[1])


def read_live_rows(session, a: int, b: int, rows: np.ndarray | None = None):
    """(points, ids, groups) of the live rows of [a, b) (only those in ``rows`` if given)."""
    ids = read_array(session, "ids", slice(a, b))
    keep = read_array(session, "alive", slice(a, b))
    if rows is not None:
        keep &= np.isin(np.arange(a, b), rows)
    if not keep.any():
        return np.zeros((0, n_features(session)), np.float32), ids[:0], np.zeros(0, np.int32)
    X = read_array(session, "points", slice(a, b))[keep]
    return X, ids[keep], read_array(session, "groups", slice(a, b))[keep]


def read_all_live(session):
    """(points, ids) of every live row (memory n x d: for the global Q-k-means model)."""
    alive = read_array(session, "alive")
    return read_array(session, "points")[alive], read_array(session, "ids")[alive]


def points_and_groups_of(session, lookup, ids: np.ndarray):
    """(points float64, groups int64) of the stored rows holding ``ids`` (sorted, all known);
    only the chunks holding them are read."""
    rows, _ = lookup.rows(ids)
    order = np.argsort(rows)
    X = np.empty((ids.shape[0], n_features(session)), dtype=np.float64)
    groups = np.empty(ids.shape[0], dtype=np.int64)
    X[order] = read_rows_at(session, "points", rows[order])
    groups[order] = read_rows_at(session, "groups", rows[order])
    return X, groups


def live_group_counts(session, n_groups: int) -> list[int]:
    """Live rows per group (a forgotten row's group is -1), counted from every row."""
    groups = read_array(session, "groups")[read_array(session, "alive")]
    return np.bincount(groups, minlength=max(n_groups, 1)).tolist()


def counts_of(attrs: dict) -> np.ndarray | None:
    """The live rows per group the root attributes keep (``live_per_group``: the counts and the
    ``n`` they were kept at, by every ingest and forget of stores made with them), or None
    where they keep none, or another version wrote since (``n`` moved: it appended; the counts
    no longer sum to ``n_alive``: it forgot): then they are counted from every row
    (:func:`live_group_counts`)."""
    kept = attrs.get(LIVE_PER_GROUP)
    if not isinstance(kept, dict) or kept.get("rows") != attrs.get("n"):
        return None
    counts = np.asarray(kept.get("counts", []), dtype=np.int64)
    return counts if int(counts.sum()) == int(attrs.get("n_alive", -1)) else None


def read_segments(session) -> tuple[np.ndarray, np.ndarray]:
    """(segment lengths (L, P), every segment (L, P, longest)): the stored index as arrays."""
    lengths = read_array(session, "lsh/segment_lengths")
    width = int(lengths.max(initial=0))
    return lengths, read_array(
        session, "lsh/segments", (slice(None), slice(0, lengths.shape[1]), slice(0, width))
    )
