"""New scales added to a store's index: the radii above its largest, each a family of tables
built over the live rows, the tables already there left as they are.

An index answers every radius up to its largest scale's (:meth:`fairpipe.neighbors.E2LSH.scale_for`).
:func:`add_scales` extends that range to a new largest radius: it chooses each new scale's
``n_tables`` and ``bucket_width`` for the store's recall target (the store's ``n_hashes``; the
distance profile of its width sample of live rows), draws their hash functions (each scale's
its own draw: the old tables' functions do not change), hashes every live row with the new
functions only, and writes the new tables into every layer of the index (each layer's rows into
its own tables, as a build puts them). One commit; a busy store is refused (exit 3) as for any
write. It runs in the calling process, on its threads: its time follows the live rows times the
new tables, and its memory a layer's points (the main layer's: 512 MB at 1M x 128) and the keys
of ``TABLE_BLOCK`` tables.
"""

from __future__ import annotations

import os

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.neighbors import (
    DEFAULT_RECALL,
    RADIUS_TOLERANCE,
    DistanceProfile,
    UnreachableRecall,
    check_projection_size,
    max_radius_of,
    mix,
    pack,
    scales_above,
    width_sample_rows,
)
from fairpipe.storage.arrays import create_array, open_group, read_array, read_rows_at, set_shape
from fairpipe.storage.formats import store_format
from fairpipe.storage.layers import layer_arrays, layer_starts, load_lsh
from fairpipe.storage.lineage import record
from fairpipe.storage.segments import (
    MAX_SEGMENTS,
    SEGMENT_CAPACITY,
    bucket_count,
    write_bucket_counts,
    write_segment_lengths,
    write_tables,
)
from fairpipe.storage.store import FairpipeStore

# Tables hashed and written at once: their keys take 8 bytes a row each.
TABLE_BLOCK = 8
FLOW_THREADS = min(os.cpu_count() or 1, 8)  # threads hashing the rows
NO_RANGE = (
    "{url} records no radius its index was built for (a store made before the choice of "
    "parameters): its radius range cannot be extended. Ingest its source into a new store "
    "with --max-radius."
)
FORMAT1 = (
    "{url} keeps its index in format 1: append to it once (fairpipe ingest, which rewrites "
    "the index in the current format), then extend its radius range."
)
UNREACHABLE_SCALE = (
    "A recall of {recall} at radius {radius} needs {needed} tables with the store's n_hashes "
    "{k}; at most {limit} are chosen. Give a smaller --max-radius."
)


def add_scales(store: FairpipeStore, max_radius: float, lock_timeout: float = 0.0) -> dict:
    """Extend the store's index to answer every radius up to ``max_radius`` (one commit).
    Returns the new scales (``added``: ``[radius, bucket_width, n_tables]`` each; empty where
    the index already reaches ``max_radius``), the range before and after, and the commit."""
    attrs = store.require_data()
    before = _check_extensible(attrs, store.url)
    if max_radius <= before * (1 + RADIUS_TOLERANCE):
        return {"store": store.url, "max_radius": before, "before": before, "added": [],
                "n_tables": int(attrs["lsh"]["n_tables"]), "commit": None}  # fmt: skip
    with store.transaction(f"extend the radius range to {max_radius:.6g}",
                           lock_timeout=lock_timeout) as txn:  # fmt: skip
        attrs = store.attrs(txn.session)
        before = _check_extensible(attrs, store.url)
        lsh = load_lsh(txn.session, attrs)
        alive = read_array(txn.session, "alive")
        live = np.flatnonzero(alive)
        ids = read_array(txn.session, "ids")
        sample = live[width_sample_rows(ids[live], int(attrs["seed"]))]
        profile = DistanceProfile.of(read_rows_at(txn.session, "points", sample).astype(np.float64))
        target = attrs["lsh"].get("recall_target") or DEFAULT_RECALL
        k, d = int(lsh.n_hashes), int(attrs["d"])
        try:
            chosen = scales_above(profile, before, float(max_radius), target,
                                  n_rows=max(live.shape[0], 1), n_hashes=k, n_features=d)  # fmt: skip
        except UnreachableRecall as e:
            raise FairpipeInputError(UNREACHABLE_SCALE.format(
                recall=target, radius=f"{e.radius:.6g}", needed=e.needed_text(), k=k,
                limit=e.limit)) from None  # fmt: skip
        added = [[c.radius, c.bucket_width, c.n_tables] for c in chosen]
        old_tables = int(lsh.n_tables)
        scales = [[s.radius or before, s.bucket_width, s.n_tables] for s in lsh.scales_of()]
        n_tables = old_tables + sum(int(t) for _, _, t in added)
        check_projection_size(d, k, n_tables)
        kept = dict(attrs["lsh"])
        kept.update(n_tables=n_tables, scales=scales + added, max_radius=float(max_radius))
        new = type(lsh)(**{**lsh.get_params(), "n_tables": n_tables,
                           "scales": tuple(map(tuple, scales + added))}).fit(d)  # fmt: skip
        _check_same_functions(lsh, new, old_tables)
        root = open_group(txn.session, mode="a")
        for name, arr in new.to_arrays().items():
            del root[f"lsh/{name}"]
            create_array(root, f"lsh/{name}", shape=arr.shape, dtype=arr.dtype)[...] = arr
        starts = layer_starts(attrs)
        ends = [s for _, s, _ in starts[1:]] + [int(attrs["n"])]
        for (layer, first, bits), last in zip(starts, ends):
            rows = live[(live >= first) & (live < last)]
            points = read_array(txn.session, "points", slice(first, last))[rows - first]
            _add_tables(txn.session, root, layer, bits, new, points, rows, old_tables)
        root.attrs["lsh"] = kept
        record(txn, "configure", {"max_radius": float(max_radius), "before": before,
                                  "scales_added": len(added), "n_tables": n_tables})  # fmt: skip
    return {"store": store.url, "max_radius": float(max_radius), "before": before,
            "added": added, "n_tables": n_tables, "commit": txn.commit_id}  # fmt: skip


def _check_extensible(attrs: dict, url: str) -> float:
    if store_format(attrs) == 1:
        raise FairpipeInputError(FORMAT1.format(url=url))
    top = max_radius_of(attrs["lsh"])
    if top is None:
        raise FairpipeInputError(NO_RANGE.format(url=url))
    return top


def _check_same_functions(old, new, old_tables: int) -> None:
    """The extended hash functions keep the old tables' (each scale draws its own)."""
    k = int(old.n_hashes)
    same = np.array_equal(old.projections_, new.projections_[:, : old_tables * k]) and (
        np.array_equal(old.offsets_, new.offsets_[: old_tables * k])
    )
    if not same:  # a bug, not the user's: exit 1
        raise AssertionError("Adding scales changed the hash functions of the index's tables.")


def _add_tables(session, root, layer: str, bits: int, lsh, points: np.ndarray, rows: np.ndarray,
                old_tables: int) -> None:  # fmt: skip
    """Tables ``old_tables`` and up of ``lsh`` in ``layer``: the layer's live ``rows`` (sorted;
    their ``points``) in their buckets, in ``2**bits`` segments a table."""
    n_tables = int(lsh.n_tables)
    segments, lengths_name, counts_name = layer_arrays(layer)
    old_lengths = read_array(session, f"lsh/{lengths_name}")
    old_counts = read_array(session, f"lsh/{counts_name}")
    set_shape(root, f"lsh/{segments}", (n_tables, MAX_SEGMENTS, SEGMENT_CAPACITY))
    lengths = np.zeros((n_tables, old_lengths.shape[1]), dtype=np.int32)
    lengths[:old_tables] = old_lengths
    counts = np.zeros(n_tables, dtype=np.int64)
    counts[:old_tables] = old_counts
    X = np.ascontiguousarray(points, dtype=np.float32)
    for t0 in range(old_tables, n_tables, TABLE_BLOCK):
        t1 = min(t0 + TABLE_BLOCK, n_tables)
        keys = lsh.tables(t0, t1).hash_validated(X, by_table=True, threads=FLOW_THREADS)
        packed = [pack(mix(keys[j]), rows, bits, sorted_rows=True) for j in range(t1 - t0)]
        written = write_tables(session, t0, packed, [np.zeros(0, np.int32)] * len(packed), layer)
        for j, (flat, offsets) in enumerate(packed):
            lengths[t0 + j] = written[j]
            counts[t0 + j] = bucket_count(flat, offsets)
    write_segment_lengths(root, lengths, layer)
    write_bucket_counts(root, counts, layer)
