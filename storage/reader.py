"""Queries over a committed store that read only what they need.

:func:`open_reader` gives a :class:`StoreReader`. Its :meth:`~StoreReader.sample` and
:meth:`~StoreReader.neighbourhood` read, per query, one segment per LSH table (the one holding the
query's bucket: :mod:`fairpipe.neighbors._segments`) and the sketch of the candidates the sampler
looks at (a byte per coordinate, in chunks of ``SKETCH_BLOCK`` rows), whose distance bounds
decide most of them; the sketch's residual (a signed byte per coordinate) only of those they
leave undecided, and the points (chunks of ``POINT_BLOCK`` rows) only of those it leaves
undecided (a candidate decided by its bounds lies on the same side of every threshold as its
exact distance); :meth:`~StoreReader.predict` reads the model's root. Segments and points read
are cached for the reader's life. A query runs the same kernel as the in-memory
:class:`fairpipe.neighbors.FairNN` on a small index made of the query's own buckets, so with the
same seed it draws exactly what ``FairNN`` draws (the exact sampler stays exactly uniform).
:meth:`~StoreReader.preload` reads everything once into a ``FairNN`` for the hot path of a
long-lived process (memory about n x (d + 2L) x 4 bytes); the ``rank`` sampler, whose
permutation spans every row, always uses it.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.neighbors import (
    E2LSH,
    LSH_ARRAYS,
    RADIUS_TOLERANCE,
    FairNN,
    QueryStats,
    SampleResult,
    Scale,
    bucket_members,
    check_sample_count,
    check_sample_options,
    lsh_recall,
    max_radius_of,
    mix,
    neighbourhood,
    query_generator,
    sample_query,
    segment_of,
    unique_inverse_ints,
)
from fairpipe.settings import MODE, SAMPLER, C
from fairpipe.storage.arrays import read_array, read_arrays
from fairpipe.storage.candidates import _Candidates, _LocalIndex, _QueryIndex, _RowCache
from fairpipe.storage.formats import store_format
from fairpipe.storage.index import load_sampler
from fairpipe.storage.layers import layer_arrays, layer_bits, lsh_from_arrays
from fairpipe.storage.light import open_light
from fairpipe.storage.rows import StoredIds, has_residual, has_sketch, scale_points
from fairpipe.storage.segments import read_checked_segments
from fairpipe.storage.store import FairpipeStore
from fairpipe.storage.urls import parse_store_url
from fairpipe.validation import as_id_array, check_ids, check_points

UNKNOWN_ID = "Id {id} is not in the store {url}."
BAD_ROW = "Query row {row} is out of range: the store {url} holds rows 0..{last}."
DEAD_ROW = "Row {row} (id {id}) of the store {url} has been forgotten; it cannot be a query."
ONE_QUERY = "Give exactly one of queries, query_rows or query_ids."
# The neighbourhood size a suggested radius aims at (:meth:`StoreReader.suggest_radius`).
SUGGEST_HOLDING = 50
# A batch of at least this many queries reads the index of its radius's scale once
# (:meth:`StoreReader.preload`) and answers from memory: at 1M x 128, a query new to the reader took about 0.26 s (its buckets'
# segments and candidates read; 10 samples each, 100 ids in one `fairpipe sample
# --query-ids-file`), and the whole index 8.3 s, so from about 32 queries on, reading it all is
# faster. The samples are the same either way.
PRELOAD_QUERIES = 64


class StoreReader:
    """A committed snapshot of a store, for queries. Cheap to open: nothing is read until a
    query needs it."""

    def __init__(self, url: str, snapshot: str | None = None, keep_rows: bool = True):
        url = str(url)
        self.keep = keep_rows
        local = parse_store_url(url).local_dir
        folder = local.resolve() if local is not None else None
        light = open_light(folder, snapshot) if folder is not None else None
        # A local store is read without zarr (fairpipe.storage.light); what needs an Icechunk session
        # later reopens it at its absolute path (the process may change folder meanwhile).
        self._reopen = str(folder) if folder is not None else url
        if light is not None:
            self.url = url
            self.session, self.attrs = light
        else:
            store = self.__dict__["store"] = FairpipeStore.open(url)
            self.url = store.url
            self.attrs = store.require_data()
            self.session = store.readonly_session(snapshot)
            if snapshot is not None:
                self.attrs = store.attrs(self.session)
        self.n, self.d = int(self.attrs["n"]), int(self.attrs["d"])
        self.n_tables = int(self.attrs["lsh"]["n_tables"])
        self._lsh: E2LSH | None = None
        self._lengths: dict[str, np.ndarray] = {}
        self._segments: dict[tuple[str, int, int], np.ndarray] = {}
        self._rows: dict[str, _RowCache | None] = {}
        self._lookup: StoredIds | None = None
        self._nn: dict[int | None, FairNN] = {}  # by scale (None: every table)
        self._model: tuple[np.ndarray, np.ndarray] | None = None

    @cached_property
    def full_session(self):
        """An Icechunk session of the reader's snapshot, for what the light path does not read
        (the whole store into the in-memory sampler, the clustering model)."""
        if not getattr(self.session, "is_light", False):
            return self.session
        return self.store.readonly_session(self.session.snapshot_id)

    @cached_property
    def store(self) -> FairpipeStore:
        """The store, opened through Icechunk (on first use where the reader reads without)."""
        return FairpipeStore.open(self._reopen)

    # -- what a query reads ------------------------------------------------------------------
    @property
    def suggested_radius(self) -> float:
        return float(self.attrs["suggested_radius"])

    @property
    def lsh(self) -> E2LSH:
        """The store's hash functions (read with the index's segment lengths: one round trip)."""
        if self._lsh is None:
            names = LSH_ARRAYS
            layers = [layer for layer in layer_bits(self.attrs) if layer not in self._lengths]
            got = read_arrays(self.session, [f"lsh/{name}" for name in names]
                              + [f"lsh/{layer_arrays(layer)[1]}" for layer in layers])  # fmt: skip
            self._lengths.update(zip(layers, got[len(names) :]))
            self._lsh = lsh_from_arrays(dict(zip(names, got)), self.attrs)
        return self._lsh

    def segments(self, wanted: list[tuple[str, int, int]]) -> list[np.ndarray]:
        """Segments (layer, table, segment) of the index, the missing ones read concurrently."""
        missing = sorted({w for w in wanted if w not in self._segments})
        for layer in {w[0] for w in missing}:
            if layer not in self._lengths:
                self._lengths[layer] = read_array(self.session, f"lsh/{layer_arrays(layer)[1]}")
        sels = [(t, p, slice(0, int(self._lengths[layer][t, p]))) for layer, t, p in missing]
        for layer in {w[0] for w in missing}:
            mine = [i for i, w in enumerate(missing) if w[0] == layer]
            # (checked: a query indexes the store's rows with their members)
            got = read_checked_segments(self.session, layer, [sels[i] for i in mine], self.n)
            for i, seg in zip(mine, got):
                self._segments[missing[i]] = seg
        return [self._segments[w] for w in wanted]

    def row_cache(self, name: str) -> _RowCache | None:
        """The cache of array ``name``'s rows (``points``, ``ids``, ``alive``, ``sketch``,
        ``sketch_residual``); None for a sketch or residual the store does not have."""
        if name not in self._rows:
            missing = (name == "sketch" and not has_sketch(self.attrs)) or (
                name == "sketch_residual" and not has_residual(self.attrs)
            )
            self._rows[name] = None if missing else _RowCache(self.session, name, self.keep)
        return self._rows[name]

    def _cached(self, name: str) -> _RowCache:
        cache = self.row_cache(name)
        assert cache is not None  # points, ids and alive: every store has them
        return cache

    def points_at(self, rows: np.ndarray) -> np.ndarray:
        """Points of stored ``rows`` (cached)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.zeros((0, self.d), np.float32)
        return self._cached("points").rows(rows)

    def ids_at(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return rows.copy()
        return self._cached("ids").rows(rows)

    def rows_of(self, ids) -> np.ndarray:
        """Rows of the stored ``ids`` (reads the ids once), or an error naming the first id that
        is unknown or forgotten."""
        ids = check_ids(np.atleast_1d(as_id_array(ids)), "the query ids")
        if self._lookup is None:
            self._lookup = StoredIds(self.session, self.n)
        found, known = self._lookup.rows(ids)
        rows = np.full(ids.shape[0], -1, dtype=np.int64)
        rows[known] = found
        live = np.zeros(ids.shape[0], dtype=bool)
        if found.size:
            live[np.flatnonzero(known)] = self._cached("alive").rows(found)
        if not live.all():
            i = int(np.argmin(live))
            message = UNKNOWN_ID.format(id=int(ids[i]), url=self.url)
            raise FairpipeInputError(message + (" (forgotten)" if known[i] else ""))
        return rows

    def _check_rows(self, rows) -> np.ndarray:
        rows = np.atleast_1d(np.asarray(rows))  # a Python int of 2^63 or more: uint64 or object
        values = rows.tolist()
        if rows.dtype.kind not in "iuO" or not all(type(r) is int for r in values):
            raise FairpipeInputError(f"Query rows must be integers. Got {rows.dtype}.")
        for r in values:  # before any cast to int64, which would wrap 2^63 to -2^63
            if not 0 <= r < self.n:
                raise FairpipeInputError(BAD_ROW.format(row=r, url=self.url, last=self.n - 1))
        rows = rows.astype(np.int64)
        alive = self._cached("alive").rows(np.sort(rows))
        if not alive.all():
            r = int(np.sort(rows)[np.argmin(alive)])
            raise FairpipeInputError(
                DEAD_ROW.format(row=r, id=int(self.ids_at([r])[0]), url=self.url)
            )
        return rows

    def _queries(self, queries, query_rows, query_ids) -> tuple[np.ndarray, np.ndarray | None]:
        """(query points, their stored rows: None for points given by value, which are
        scaled as the store's points were: :meth:`scale`)."""
        if sum(x is not None for x in (queries, query_rows, query_ids)) != 1:
            raise FairpipeInputError(ONE_QUERY)
        if query_ids is not None:
            query_rows = self.rows_of(query_ids)
        if query_rows is not None:
            rows = self._check_rows(query_rows)
            return self.points_at(rows), rows
        Q = np.asarray(queries)
        Q = check_points(Q[None, :] if Q.ndim == 1 else Q, where="the queries", n_features=self.d)
        return self.scale(Q), None

    def scale(self, X: np.ndarray) -> np.ndarray:
        """Points in the source's units, scaled as ingest scaled the store's points (the
        ``scale`` attribute: :func:`fairpipe.storage.rows.scale_points`): how a point given by value
        is compared with them."""
        return scale_points(self.attrs, X)

    def _buckets(self, q: np.ndarray, scale: Scale) -> _QueryIndex:
        """The query's bucket in every table of ``scale``, as an index of its candidates
        alone (its tables numbered from 0)."""
        keys = self.lsh.hash_validated(q[None, :])[0]
        h = mix(keys)[scale.first : scale.last]
        L = scale.n_tables
        bits = layer_bits(self.attrs)  # the deltas' members of a bucket follow (larger rows)
        wanted = [(layer, scale.first + t, int(p)) for layer, b in bits.items()
                  for t, p in enumerate(segment_of(h, b))]  # fmt: skip
        segs = self.segments(wanted)
        layers = range(len(bits))
        found = [bucket_members(segs[i * L + t], h[t]) for t in range(L) for i in layers]
        sizes = np.array([f.shape[0] for f in found], dtype=np.int64)
        sizes = sizes.reshape(L, len(bits)).sum(axis=1)
        if sizes.sum():
            rows, members = unique_inverse_ints(np.concatenate(found))
        else:
            rows, members = np.zeros(0, np.int64), np.zeros(0, np.int64)
        starts = np.zeros(L + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        q_buckets = np.where(sizes > 0, np.arange(L), -1)
        return _QueryIndex(rows.astype(np.int64, copy=False), _LocalIndex(starts, members),
                           q_buckets)  # fmt: skip

    def reach(self, radius: float) -> dict:
        """What the index promises at ``radius``: ``expected_recall`` (the probability that a
        point at distance ``radius`` is among a query's candidates, in the tables of the scale
        it reads), ``max_radius`` (the largest radius the store's recall target holds at: its
        largest scale's, or its radius for a store of one scale; None where the store records
        neither) and ``in_range`` (``radius`` at most that; None where unknown)."""
        lsh = self.lsh
        scale = lsh.scale_for(radius)
        top = max_radius_of(self.attrs["lsh"])
        return {
            "expected_recall": float(lsh_recall(radius, int(lsh.n_hashes), scale.n_tables,
                                                scale.bucket_width)),
            "max_radius": top,
            "in_range": None if top is None else bool(radius <= top * (1 + RADIUS_TOLERANCE)),
        }  # fmt: skip

    # -- the queries -------------------------------------------------------------------------
    def preload(self, radius: float | None = None) -> FairNN:
        """Read the index and every row into an in-memory :class:`FairNN` (once); later
        queries use it (the hot path). ``radius``: only the tables of its scale (what the
        queries at radii of that scale read: a fraction of the memory of an index of several
        scales), an index of them alone; None: every table (a preload of every table serves
        every radius)."""
        scales = self.lsh.scales_of()
        key = None if radius is None or len(scales) == 1 else self.lsh.scale_for(radius).index
        if None in self._nn:
            return self._nn[None]
        if key not in self._nn:
            light = getattr(self.session, "is_light", False) and store_format(self.attrs) == 2
            nn = load_sampler(self.session if light else self.full_session, self.attrs,
                              None if key is None else scales[key])  # fmt: skip
            nn.point_buckets_  # noqa: B018 (built here, not by the first query)
            self._nn[key] = nn
        return self._nn[key]

    def sample(self, queries=None, *, query_rows=None, query_ids=None, radius=None,
               n_samples: int = 1, sampler: str = SAMPLER.default, mode: str = MODE.default, c: float = C.default,
               seed: int | None = None, max_outliers: int | None = None,
               failure_prob: float = 0.01, with_neighbourhood: bool = False,
               path: str = "auto", include_query: bool = False) -> SampleResult:  # fmt: skip
        """:meth:`FairNN.sample` over the store (``radius`` defaults to the store's suggested
        radius; ``query_ids`` names stored points by id, and a query by id or row never draws
        its own row unless ``include_query``; ``queries`` are points in the source's units,
        scaled as the store's points were)."""
        radius = self.suggested_radius if radius is None else radius
        radius, n_samples, sampler, mode, c, failure_prob, path = check_sample_options(
            "StoreReader.sample", radius, n_samples, sampler, mode, c, failure_prob, path
        )
        if (self._nn or sampler == "rank" or store_format(self.attrs) == 1
                or _batch_size(queries, query_rows, query_ids) >= PRELOAD_QUERIES):  # fmt: skip
            nn = self.preload(radius)
            if query_ids is not None:
                query_rows, query_ids = self.rows_of(query_ids), None
            if queries is not None:
                queries = self._queries(queries, None, None)[0]
            return nn.sample(queries, query_rows=query_rows, radius=radius, n_samples=n_samples,
                             sampler=sampler, mode=mode, c=c, seed=seed,
                             max_outliers=max_outliers, failure_prob=failure_prob,
                             with_neighbourhood=with_neighbourhood, path=path,
                             include_query=include_query)  # fmt: skip
        Q, stored = self._queries(queries, query_rows, query_ids)
        own = FairNN._own_rows(stored, include_query, Q.shape[0], "StoreReader.sample")
        scale = self.lsh.scale_for(radius)
        max_outliers = 3 * scale.n_tables if max_outliers is None else max_outliers
        check_sample_count("StoreReader.sample", n_samples, Q.shape[0])
        rng = query_generator(seed, "StoreReader.sample")
        rows = np.full((Q.shape[0], n_samples), -1, dtype=np.int64)
        counts = np.zeros(Q.shape[0], dtype=np.int64)
        sizes = np.zeros(Q.shape[0], dtype=np.int64) if with_neighbourhood else None
        stats: list[QueryStats] = []
        for i in range(Q.shape[0]):
            qi = self._buckets(Q[i], scale)
            cand, index, q_buckets = qi.rows, qi.index, qi.q_buckets
            points: Any = _Candidates(self, cand)  # the kernel's points
            exclude = _local_row(cand, int(own[i]))
            hood = None
            if sizes is not None:
                hood = neighbourhood(index, points, Q[i], q_buckets, mode, radius, c, exclude)
                sizes[i] = hood.shape[0]
            got, st = sample_query(
                index, qi.point_buckets if sampler == "approx" else None, points, Q[i],
                q_buckets, n_samples, sampler, mode, radius, c, rng, max_outliers, failure_prob,
                path=path, complete=stored is not None and bool((q_buckets >= 0).all()),
                degrees=qi.degrees, hood=hood, exclude=exclude,
            )  # fmt: skip
            rows[i, : got.shape[0]] = cand[got]
            counts[i] = got.shape[0]
            st.extra.update(candidates=int(cand.shape[0]), points_read=points.points_read,
                            refined=points.refined)  # fmt: skip
            stats.append(st)
        ids = np.full(rows.shape, -1, dtype=np.int64)
        drawn = rows >= 0
        ids[drawn] = self.ids_at(rows[drawn])
        return SampleResult(ids=ids, rows=rows, counts=counts, neighbourhood_sizes=sizes,
                            stats=stats)  # fmt: skip

    def neighbourhood(self, queries=None, *, query_rows=None, query_ids=None, radius=None,
                      mode: str = MODE.default, c: float = C.default,
                      include_query: bool = False) -> list[np.ndarray]:  # fmt: skip
        """Ids of each query's found neighbourhood (the union of its buckets, by mode), without
        a query by id or row's own unless ``include_query``."""
        radius = self.suggested_radius if radius is None else radius
        radius, _, _, mode, c, _, _ = check_sample_options(
            "StoreReader.neighbourhood", radius, 1, "exact", mode, c, 0.5, "auto"
        )
        Q, stored = self._queries(queries, query_rows, query_ids)
        own = FairNN._own_rows(stored, include_query, Q.shape[0], "StoreReader.neighbourhood")
        out = []
        scale = self.lsh.scale_for(radius)
        for i in range(Q.shape[0]):
            qi = self._buckets(Q[i], scale)
            local = neighbourhood(qi.index, _Candidates(self, qi.rows), Q[i], qi.q_buckets, mode,
                                  radius, c, _local_row(qi.rows, int(own[i])))  # fmt: skip
            out.append(self.ids_at(qi.rows[local]))
        return out

    def suggest_radius(self, queries=None, *, query_rows=None, query_ids=None,
                       include_query: bool = False, holding: int = SUGGEST_HOLDING,
                       radius: float | None = None) -> list[dict]:  # fmt: skip
        """Per query, a radius whose neighbourhood would hold about ``holding`` points: the
        distance to the ``holding``-th nearest of its candidates (the rows of its buckets,
        without its own row unless ``include_query``), or to the farthest where it has fewer.
        Each entry: ``suggested_radius`` (None where the buckets hold no other point) and
        ``candidates`` (how many it was chosen among). The distances are estimated from the
        candidates' sketch where the store has one (the midpoint of their bounds), else exact.
        The candidates are those of the index's scale for ``radius`` (default: the store's)."""
        radius = self.suggested_radius if radius is None else radius
        scale = self.lsh.scale_for(radius)
        Q, stored = self._queries(queries, query_rows, query_ids)
        own = FairNN._own_rows(stored, include_query, Q.shape[0], "StoreReader.suggest_radius")
        if self._nn or store_format(self.attrs) == 1:
            nn = self.preload(radius)
            out = []
            for i in range(Q.shape[0]):
                qb = nn._resolve_queries(Q[i : i + 1], None, nn.scale_for(radius))[1][0]
                rows = neighbourhood(nn.index_, nn.points_, Q[i], qb, "buckets", 1.0, 1.0,
                                     int(own[i]))  # fmt: skip
                d2 = np.einsum("ij,ij->i", nn.points_[rows] - Q[i], nn.points_[rows] - Q[i])
                out.append(_radius_holding(d2, holding))
            return out
        out = []
        for i in range(Q.shape[0]):
            qi = self._buckets(Q[i], scale)
            exclude = _local_row(qi.rows, int(own[i]))
            local = np.arange(qi.rows.shape[0])
            local = local[local != exclude] if exclude >= 0 else local
            d2 = _Candidates(self, qi.rows).sq_distances(local, Q[i], ())
            out.append(_radius_holding(np.asarray(d2, dtype=np.float64), holding))
        return out

    def predict(self, queries=None, *, query_rows=None, query_ids=None) -> np.ndarray:
        """The nearest root centroid (with mass) of the store's clustering model, per query."""
        from fairpipe.cluster import DCKMeans, nearest
        from fairpipe.storage.models import read_model, require_model

        if self._model is None:
            kind = require_model(self.attrs, self.url)
            model = read_model(self.full_session, kind)
            mass = model.masses_ if isinstance(model, DCKMeans) else model.sizes_[-1]
            self._model = (model.centroids_, mass)
        Q, _ = self._queries(queries, query_rows, query_ids)
        centroids, mass = self._model
        return nearest(Q, centroids, mass > 0)[0]


def _local_row(rows: np.ndarray, row: int) -> int:
    """The position of the stored ``row`` among a query's candidates ``rows`` (sorted), -1 where
    it is none of them (or ``row`` is -1)."""
    if row < 0:
        return -1
    at = int(np.searchsorted(rows, row))
    return at if at < rows.shape[0] and int(rows[at]) == row else -1


def _radius_holding(d2: np.ndarray, holding: int) -> dict:
    """The distance to the ``holding``-th nearest of candidates at squared distances ``d2``
    (the farthest, where there are fewer), and how many candidates there were."""
    if d2.shape[0] == 0:
        return {"suggested_radius": None, "candidates": 0}
    k = min(holding, d2.shape[0]) - 1
    return {"suggested_radius": float(np.sqrt(np.partition(d2, k)[k])),
            "candidates": int(d2.shape[0])}  # fmt: skip


def _batch_size(queries, query_rows, query_ids) -> int:
    """How many queries a call of :meth:`StoreReader.sample` is given (points, rows or ids)."""
    if queries is not None:
        return int(np.atleast_2d(np.asarray(queries)).shape[0])
    given = query_rows if query_rows is not None else query_ids
    return 0 if given is None else int(np.atleast_1d(np.asarray(given)).shape[0])


def open_reader(url: str, snapshot: str | None = None, keep_rows: bool = True) -> StoreReader:
    """A reader over the committed store at ``url`` (at ``snapshot``, default the tip): lazy,
    cached reads. Raises a clear error for a location that is not a fairpipe store.

    ``keep_rows``: keep the chunks of rows (sketch, residual, points, ids) that queries read
    for the reader's life, so that later queries read them from memory (a long-lived reader);
    False for a process that asks one query (``fairpipe sample``), which then frees each chunk
    once it has taken the rows it needs."""
    return StoreReader(url, snapshot, keep_rows)
