"""The rows of a dataset in the store: their points, sketches, ids, groups and liveness, written,
erased and read (also by leaf: a block's live rows split by leaf group for the Dask shuffle, or
the rows of a few leaves read here); their blocks (:class:`RowBlocks`); and the dataset's root
attributes (its parameters, feature names, scaling, live rows per group).

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
  (:mod:`fairpipe.storage.reader`). Root attribute ``point_sketch`` true; stores made before it have none
  and are read without it;
- ``sketch_residual`` uint8 (n, d + 4), chunked as the sketch: a signed byte per coordinate
  refining it (:func:`fairpipe.neighbors.sketch_levels`), written and erased with it; a query
  reads it only for the candidates the sketch leaves open. Root attribute
  ``point_sketch_residual`` true; stores made before it have none.

A forgotten row keeps its place (row numbers are stable) but is erased: points and sketches zeroed,
group -1, ``alive`` false, and it leaves every bucket (:mod:`fairpipe.storage.segments`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fairpipe.datasets import apply_scaler
from fairpipe.neighbors import E2LSH, RESIDUAL_EXTRA, ROW_BLOCK, SKETCH_EXTRA, sketch_levels
from fairpipe.storage.arrays import (
    create_array,
    open_array,
    open_group,
    read_array,
    read_many,
    read_rows_at,
)
from fairpipe.storage.layers import lsh_attrs
from fairpipe.storage.store import FORMAT
from fairpipe.storage.writes import rewrite_rows_at, write_rows
from fairpipe.tree import gather_parts, leaf_of
from fairpipe.validation import IdLookup

TARGET_CHUNK_BYTES = 16 << 20
EMPTY_KEY = np.iinfo(np.uint64).max
POINT_BLOCK = 2048  # rows per chunk of points (1 MB at d = 128): what a query reads for one row
SKETCH_BLOCK = 4096  # rows per chunk of the point sketch (0.5 MB at d = 128)
SKETCH_ATTR = "point_sketch"  # root attribute: the store keeps a sketch of every row's point
RESIDUAL_ATTR = "point_sketch_residual"  # root attribute: and its residual
ID_RANGES = "id_ranges"
LIVE_PER_GROUP = "live_per_group"  # root attribute: live rows per group
ID_RANGE_BLOCK = 65536  # chunks of ids per chunk of their ranges (1 MB)


def choose_chunk_rows(d: int) -> int:
    """Rows per chunk: about 16 MB of points, a multiple of the hashing block."""
    rows = TARGET_CHUNK_BYTES // max(4 * d, 1)
    return int(min(max(rows // ROW_BLOCK * ROW_BLOCK, ROW_BLOCK), 65536))


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


def create_layout(root, d: int, lsh: E2LSH, blocks: RowBlocks) -> None:
    """The empty arrays of a new store, and its hash functions."""
    chunk_rows = blocks.size
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


@dataclass(frozen=True)
class RowBlocks:
    """A dataset's rows [0, ``n``) in blocks of ``size`` rows (the store's ``chunk_rows``): the
    unit one writer owns (no two writers share a Zarr chunk) and one Dask job reads. Flows hand
    it around; only this module does its arithmetic."""

    n: int
    size: int

    @classmethod
    def of(cls, attrs: dict) -> RowBlocks:
        """The blocks of a store's rows (its root attributes)."""
        return cls(int(attrs["n"]), int(attrs["chunk_rows"]))

    @classmethod
    def new(cls, d: int, size: int | None = None) -> RowBlocks:
        """An empty dataset's blocks: ``size`` rows each (``ingest --chunk-rows``) or about
        16 MB of points (:func:`choose_chunk_rows`)."""
        return cls(0, int(size) if size else choose_chunk_rows(d))

    def grown(self, n: int) -> RowBlocks:
        """The blocks once the rows reach ``n``."""
        return replace(self, n=int(n))

    def ranges(self, rows: np.ndarray | None = None) -> list[tuple[int, int]]:
        """The blocks' row ranges [a, b); with ``rows``, only those holding one of them."""
        if rows is None:
            starts = range(0, self.n, self.size)
        else:
            starts = (np.unique(np.asarray(rows, np.int64) // self.size) * self.size).tolist()
        return [(int(a), min(int(a) + self.size, self.n)) for a in starts]

    def since(self, base: int) -> list[tuple[int, int]]:
        """Row ranges of the rows [base, n) added since ``base``, relative to ``base``, cut at
        the blocks' edges."""
        if base >= self.n:
            return []
        edges = [base, *range((base // self.size + 1) * self.size, self.n, self.size), self.n]
        return [(a - base, b - base) for a, b in zip(edges[:-1], edges[1:])]


def write_new_rows(session, start: int, ids, groups) -> None:
    """Write new (live) rows' ids and groups at ``start`` (13 bytes a row: the flow writes them
    itself; the chunk jobs write the points, :func:`fairpipe.storage.writes.write_rows`)."""
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


def write_dataset_attrs(root, before: dict, *, blocks: RowBlocks, per_group: list[int], d: int,
                        seed: int, group_names: list[str], lsh: E2LSH, layout: dict,
                        suggested_radius: float, source: str,
                        tuning: dict | None = None, scale: dict | None = None,
                        feature_names: list[str] | None = None) -> dict:  # fmt: skip
    """The root attributes after an ingest (``before``: those it started from); returns them.
    ``tuning``: what the parameters promise, kept in the ``lsh`` attribute (``radius``,
    ``recall_target``, ``expected_recall``, ``expected_candidates``: fairpipe.flows.parameters);
    ``scale``: a new store's scaling (:func:`scaler_of`), None to keep the store's;
    ``feature_names``: a new store's feature columns (a table's), None to keep the store's."""
    meta = {
        "fairpipe_format": FORMAT,
        "n": blocks.n,
        "n_alive": sum(per_group),
        LIVE_PER_GROUP: {"rows": blocks.n, "counts": per_group},
        "d": d,
        "seed": seed,
        "chunk_rows": blocks.size,
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


# -- reading rows ---------------------------------------------------------------------------------
def n_features(session) -> int:
    """The points' dimension, from the array's metadata (no chunk is read)."""
    return int(open_array(session, "points").shape[1])


def read_ids(session) -> np.ndarray:
    """Every row's id (int64; forgotten rows keep theirs)."""
    return read_array(session, "ids")


def read_alive(session) -> np.ndarray:
    """Whether each row is live (bool)."""
    return read_array(session, "alive")


def read_groups(session) -> np.ndarray:
    """Every row's group code (int32; -1 for a forgotten row)."""
    return read_array(session, "groups")


def read_points_at(session, rows: np.ndarray) -> np.ndarray:
    """The stored points of ``rows`` (in any order), reading only the chunks holding them."""
    return read_rows_at(session, "points", rows)


def read_alive_at(session, rows: np.ndarray) -> np.ndarray:
    """Whether each of ``rows`` is live, reading only the chunks holding them."""
    return read_rows_at(session, "alive", rows)


def read_groups_at(session, rows: np.ndarray) -> np.ndarray:
    """The group codes of ``rows``, reading only the chunks holding them."""
    return read_rows_at(session, "groups", rows)


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


def split_by_leaf_group(session, a: int, b: int, seed: int, n_leaves: int, edges: np.ndarray,
                        rows=None) -> dict:  # fmt: skip
    """Live rows of [a, b) (or only ``rows`` of it) split by leaf group:
    {group: (X, ids, leaf, groups)}."""
    X, ids, groups = read_live_rows(session, a, b, rows)
    if ids.size == 0:
        return {}
    leaf = leaf_of(ids, seed, n_leaves)
    group = np.searchsorted(edges, leaf, side="right") - 1
    return {
        int(g): (X[group == g], ids[group == g], leaf[group == g], groups[group == g])
        for g in np.unique(group)
    }


def read_leaf_rows(session, rows: np.ndarray, blocks: RowBlocks, seed: int, n_leaves: int, d: int):
    """(X, ids, leaf, groups) of the stored ``rows`` read in this process, block by block: the
    local twin of the shuffle, for a few leaves."""
    one_group = np.zeros(1, np.int64)
    parts = [
        split_by_leaf_group(session, a, b, seed, n_leaves, one_group, rows).get(0)
        for a, b in blocks.ranges(rows)
    ]
    return gather_parts(d, parts)


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
