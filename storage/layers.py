"""The LSH index's hash functions and layers as the store keeps them, and where appended rows go.

- ``lsh/projections`` (d, L*k), ``lsh/offsets`` (L*k,), ``lsh/multipliers`` (k,): the hash
  functions (:meth:`fairpipe.neighbors.E2LSH.to_arrays`); their parameters in the root attribute
  ``lsh`` as ``{"k", "n_tables", "width", "seed", "segment_bits"}`` (the library's ``n_hashes``
  and ``bucket_width`` are stored as ``k`` and ``width``);
- the main layer's segments (:mod:`fairpipe.storage.segments`) index the rows of the last build;
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fairpipe.neighbors import E2LSH, LSH_ARRAYS, partition_bits
from fairpipe.storage.arrays import read_arrays

# int32 entries per chunk of a segment (fairpipe.storage.segments): most segments are one chunk; a delta
# layer's segment bits are chosen so that its segments fit in one (delta_bits).
SEGMENT_CHUNK = 65536
# Appended rows stay in the deltas while at most 1/DELTA_SHARE of the live rows (and no layer
# would hold more than 3/4 of that: plan_layers). A rebuild of the main layer costs about 0.6
# of a build at 1M (reading every entry back), so rebuilding rarely pays: with the deltas'
# binary merges, 1/4 costs about 1.3% of a build less per 1% append than 1/8 (a model of the
# measured costs over 100 appends: 5.5% against 6.8%); larger shares need more layers for the
# same merge cost, and a query reads a bucket from each.
DELTA_SHARE = 4
MAX_DELTAS = 4  # delta layers at most (a query reads a segment per table from each)
MAIN = "main"  # the index's main layer (the others are deltas, named ``delta_<first row>``)
# E2LSH's parameters, kept under their own names in the store's ``lsh`` attribute.
LSH_PARAMS = ("n_hashes", "n_tables", "bucket_width", "seed")


# -- the hash functions ---------------------------------------------------------------------------
def lsh_attrs(lsh: E2LSH, layout: dict) -> dict:
    """The ``lsh`` root attribute of a store for these hash functions and index ``layout``
    (``segment_bits``, and ``deltas``/``delta_start`` when there are deltas)."""
    params = lsh.get_params()
    layout = {k: v if k == "deltas" else int(v) for k, v in layout.items()}
    scales = {"scales": [[float(r), float(w), int(t)] for r, w, t in params["scales"]]}
    return {**{name: params[name] for name in LSH_PARAMS}, **(scales if params["scales"] else {}),
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
    # A store of one scale keeps none (one family of tables, as stores made before scales).
    params["scales"] = tuple(tuple(scale) for scale in attrs["lsh"].get("scales", ()))
    # Stores made before the exact projection keep the float32 one their keys were made by.
    params["projection"] = key_projection(attrs)
    return E2LSH.from_arrays(arrays, **params)
