"""A query's candidates as the sampling kernel reads them: the query's buckets as an index over
its candidates alone (:class:`_QueryIndex`), the stored rows read a chunk at a time and cached
(:class:`_RowCache`), and the candidates' distances decided from the sketch, then its
residual, then the points (:class:`_Candidates`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

from fairpipe.neighbors import SKETCH_EXTRA, ambiguous, residual_bounds, sketch_bounds
from fairpipe.storage.arrays import open_array, read_array
from fairpipe.storage.chunks import _fetch_chunks, _plain_chunks


class _RowSource(Protocol):
    """What :class:`_Candidates` reads rows through (a :class:`fairpipe.storage.reader.StoreReader`)."""

    keep: bool
    d: int

    def row_cache(self, name: str) -> _RowCache | None: ...


@dataclass
class _QueryIndex:
    """A query's candidates (the stored rows of its buckets, sorted) and its buckets as an index
    over them: bucket t (-1 in ``q_buckets`` where empty) is the query's bucket in table t."""

    rows: np.ndarray
    index: _LocalIndex
    q_buckets: np.ndarray

    @cached_property
    def degrees(self) -> np.ndarray:
        """The number of the query's buckets holding each candidate (a row is in one bucket of
        each table, so its count among the members)."""
        return np.bincount(self.index.members, minlength=self.rows.shape[0])

    @cached_property
    def point_buckets(self) -> np.ndarray:
        """(candidates, L) the local bucket number of each candidate in each table (t where it
        is in the query's bucket of table t, else -2): what the ``approx`` sampler's probes
        compare. The smallest integer type holding -2 .. L - 1 (a tenth of the int64 bytes at
        L = 100, where 100k candidates made 76 MB)."""
        L = self.q_buckets.shape[0]
        small = np.int8 if L < 2**7 else np.int16 if L < 2**15 else np.int32
        out = np.full((self.rows.shape[0], L), -2, dtype=small)
        table = np.repeat(np.arange(L, dtype=small), np.diff(self.index.starts))
        out[self.index.members, table] = table
        return out


@dataclass
class _LocalIndex:
    """The buckets of one query, as the sampling kernel reads an index: bucket t is the query's
    bucket in table t, members are positions in the query's candidate list."""

    starts: np.ndarray
    members: np.ndarray


class _RowCache:
    """The rows of one stored array that queries read: a chunk is read (whole) the first time
    a row of it is asked for, and with ``keep`` kept for the reader's life, so later queries
    read it from memory.

    Chunks are kept as they are decoded (no copy), so the cache's memory follows the chunks
    read, up to the array's size (the sketch: (d + 12) bytes a row, its residual d + 4, the
    points 4 d). Without ``keep`` (a one-query process: the command line) each chunk is freed
    once the rows asked of it are taken, as it arrives."""

    def __init__(self, session, name: str, keep: bool = True):
        arr = open_array(session, name)
        self.session, self.name, self.keep = session, name, keep
        self.block = int(arr.chunks[0])
        self.n = int(arr.shape[0])
        self.row_shape = tuple(int(x) for x in arr.shape[1:])
        self.dtype = np.dtype(arr.dtype)
        self.chunks: dict[int, np.ndarray] = {}

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self.chunks.values())

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The values of ``rows`` (any order, repeats allowed)."""
        chunk = rows // self.block
        if rows.shape[0] == 1 and int(chunk[0]) in self.chunks:  # one row: a query's own
            c = int(chunk[0])
            return self.chunks[c][int(rows[0]) - c * self.block][None]
        order = np.argsort(chunk, kind="stable")
        ordered = chunk[order]
        heads = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]).tolist()
        parts = {int(ordered[a]): order[a:b] for a, b in zip(heads, [*heads[1:], rows.shape[0]])}
        out = np.empty((rows.shape[0], *self.row_shape), dtype=self.dtype)
        missing = []
        for c, part in parts.items():
            if c in self.chunks:
                out[part] = self.chunks[c][rows[part] - c * self.block]
            else:
                missing.append(c)

        def take(c: int, values: np.ndarray) -> None:
            part = parts[c]
            out[part] = values[rows[part] - c * self.block]
            if self.keep:
                self.chunks[c] = values

        if missing:
            self._read(missing, take)
        return out

    def _read(self, chunks: list[int], take) -> None:
        """Hand ``take(chunk, values)`` each of ``chunks`` as it arrives: straight from the
        store, as decoded, for a plainly encoded array split along rows only; through zarr
        otherwise."""
        arr = open_array(self.session, self.name)
        plain = _plain_chunks(arr)
        if plain is not None and tuple(arr.chunks[1:]) == tuple(arr.shape[1:]):
            zeros = (0,) * (arr.ndim - 1)
            _fetch_chunks(self.session, plain, [(c, *zeros) for c in chunks],
                          lambda i, values: take(chunks[i], values))  # fmt: skip
            return
        for c in chunks:
            a = c * self.block
            take(c, read_array(self.session, self.name, slice(a, min(a + self.block, self.n))))


class _Candidates:
    """A query's candidates (``rows``) as the sampling kernel sees points: only through
    :meth:`sq_distances`, which decides distances from the candidates' sketch where it can (a
    quarter of the bytes), then from the sketch's residual where it can, and computes the exact
    ones of the rest from their points.

    Each is computed once per query, only for the candidates a threshold is asked about, and
    kept as a number; the rows (sketch, residual, points) come from the reader's caches
    (:class:`_RowCache`), which read a chunk the first time a query needs one of its rows."""

    def __init__(self, reader: _RowSource, rows: np.ndarray):
        self.reader, self.rows = reader, rows
        self._query: bytes | None = None
        self._bounds = np.zeros((2, rows.shape[0]))
        self._have_bounds = np.zeros(rows.shape[0], dtype=bool)
        self._have_fine = np.zeros(rows.shape[0], dtype=bool)
        self._exact = np.zeros(rows.shape[0])
        self._have_exact = np.zeros(rows.shape[0], dtype=bool)
        self.points_read = self.refined = 0
        # With a residual and a reader that does not keep the chunks it reads, the sketch rows
        # of the candidates whose bounds are known (d + 12 bytes each: 13 MB for 100k
        # candidates at d = 128), which the residual refines.
        self._sketch: np.ndarray | None = None
        if reader.row_cache("sketch_residual") is not None and not reader.keep:
            self._sketch = np.empty((rows.shape[0], reader.d + SKETCH_EXTRA), dtype=np.uint8)

    def _for_query(self, query: np.ndarray) -> None:
        """Forget what was computed for another query."""
        key = query.dtype.str.encode() + query.tobytes()
        if key != self._query:
            self._query = key
            self._have_bounds.fill(False)
            self._have_fine.fill(False)
            self._have_exact.fill(False)

    def sq_distances(self, local, query: np.ndarray, thresholds) -> np.ndarray:
        """Squared distances of ``local`` rows to ``query``: exact where the bounds from the
        sketch do not settle every threshold (every row, without a sketch), else a value inside
        the bounds, so on the same side of every threshold: see
        :func:`fairpipe.neighbors.sq_distances`."""
        local, query = np.asarray(local), np.asarray(query)
        self._for_query(query)
        dtype = np.result_type(np.float32, query.dtype)  # the kernel's (points - query)
        sketch = self.reader.row_cache("sketch")
        if sketch is None:  # a store made before the sketch
            return self._exact_at(local, query).astype(dtype)
        need = _first_of(local[~self._have_bounds[local]], self.rows.shape[0])
        if need.size:
            rows = sketch.rows(self.rows[need])
            self._bounds[:, need] = sketch_bounds(rows, query)
            self._have_bounds[need] = True
            if self._sketch is not None:  # kept for the residual (the chunks may not be)
                self._sketch[need] = rows
        lower2, upper2 = self._bounds[:, local]
        exact = ambiguous(lower2, upper2, thresholds)
        if exact.any() and self.reader.row_cache("sketch_residual") is not None:
            self._refine(local[exact], query)
            lower2, upper2 = self._bounds[:, local]
            exact = ambiguous(lower2, upper2, thresholds)
        out = ((lower2 + upper2) / 2).astype(dtype)
        if exact.any():
            out[exact] = self._exact_at(local[exact], query).astype(dtype)
        return out

    def _refine(self, local: np.ndarray, query: np.ndarray) -> None:
        """Narrow the bounds of ``local`` rows (whose sketch bounds are known) to their
        intersection with the residual's."""
        need = _first_of(local[~self._have_fine[local]], self.rows.shape[0])
        if not need.size:
            return
        sketch, residual = self.reader.row_cache("sketch"), self.reader.row_cache("sketch_residual")
        assert sketch is not None and residual is not None  # only called for such a store
        rows = self.rows[need]
        coarse = sketch.rows(rows) if self._sketch is None else self._sketch[need]
        lower2, upper2 = residual_bounds(coarse, residual.rows(rows), query)
        np.maximum(self._bounds[0, need], lower2, out=lower2)
        np.minimum(self._bounds[1, need], upper2, out=upper2)
        self._bounds[:, need] = lower2, upper2
        self._have_fine[need] = True
        self.refined += need.shape[0]

    def _exact_at(self, local: np.ndarray, query: np.ndarray) -> np.ndarray:
        need = _first_of(local[~self._have_exact[local]], self.rows.shape[0])
        if need.size:
            points = self.reader.row_cache("points")
            assert points is not None  # every store has its points
            diff = points.rows(self.rows[need]) - query  # as the kernel computes it, row by row
            self._exact[need] = np.einsum("ij,ij->i", diff, diff)
            self._have_exact[need] = True
            self.points_read += need.shape[0]
        return self._exact[local]


def _first_of(local: np.ndarray, n: int) -> np.ndarray:
    """``local`` (positions below ``n``) without repeats (the kernel's draws repeat rows), sorted:
    a sort for a few, a mask over 0..n for many (every candidate, when M(q) is listed)."""
    if local.size <= 256:
        return np.unique(local) if local.size > 1 else local
    mask = np.zeros(n, dtype=bool)
    mask[local] = True
    return np.flatnonzero(mask)
