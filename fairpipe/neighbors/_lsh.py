"""E2LSH for the L2 distance (Datar, Immorlica, Indyk, Mirrokni 2004).

Each of ``n_tables`` tables concatenates ``n_hashes`` functions ``floor((a . x + b) / w)`` with
``a ~ N(0, I_d)``, ``b ~ U[0, w)`` and w the ``bucket_width``. The integers of a table are folded into one 64-bit bucket
key: the table number in the top 16 bits and a 48-bit hash of the k-tuple below them, so that every
(table, bucket) pair has one key and all tables' buckets live in one sorted array (searched through
:mod:`fairpipe.neighbors._key_directory`). Two different k-tuples of one table share a key with probability
2**-48 per pair; such a merge only adds candidates to a bucket, which the neighbourhood modes then
filter by distance.

Determinism: a point's keys must not depend on which chunk, worker, batch or machine hashed it
(an append must give the keys a fresh build gives, a forget must find the buckets the ingest
used). The projection is a float32 matrix product, and BLAS sums a row's products in an order
that depends on more than the row: on some CPUs (OpenBLAS 0.3.31 on an AMD EPYC: measured) on the
row's position in the block, on the number of rows and of threads. So each cell of a key is
defined exactly, by ``projection = "exact"`` (the default): ``floor(v)`` with ``v`` the float64
sum, in the order of the coordinates, of the (exact) products ``x_j * a_j / w``, plus ``b / w``.
It is computed from the float32 product where that settles the floor: BLAS's error is at most
``gamma_d * ||x|| * ||a / w||`` (``gamma_d = d u / (1 - d u)``, u the unit roundoff), so when
``floor`` is the same at both ends of that interval (plus the float64 sum's own error) it is
the floor of ``v``; the cells near an integer (3.6 in 100,000 for standard normal points at
d = 128; many more at a large d or far from the origin, where the bound is wider) are summed in
float64, in order. A float32 product that overflowed is summed the same way; cells beyond
+-2**62 (a width tiny against the data) are clamped, so their int64 is defined on every CPU.
``projection = "float32"`` is the definition stores made before it keep (``floor`` of the
float32 product plus the float32 offset: machine-dependent there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fairpipe.base import BaseEstimator
from fairpipe.errors import FairpipeInputError, check_positive_int
from fairpipe.hashing import splitmix64
from fairpipe.neighbors import _segments
from fairpipe.settings import (
    E2LSH_SETTINGS,
    LSH_BUCKET_WIDTH,
    LSH_N_HASHES,
    LSH_N_TABLES,
    PROJECTION,
    SEED,
    check_settings,
)
from fairpipe.validation import check_points

ROW_BLOCK = 256
# Above this many rows, keys are folded by the compiled kernel: loading it costs a process about
# 0.45 s once, and numpy folds 10k rows in 0.04 s, so a small append done by the flow itself
# (fairpipe.flows.ingest.LOCAL_ROWS) stays with numpy; the Dask jobs' chunks are larger.
COMPILED_FOLD_ROWS = 20_000
# Rows per thread at least, where hash_validated is given several threads.
THREAD_ROWS = 2048
TABLE_SHIFT = np.uint64(48)
HASH_MASK = np.uint64((1 << 48) - 1)
MULT_LOW, MULT_HIGH = 1 << 26, 1 << 27
# The projections are a (d, n_tables * n_hashes) float64 matrix: at most 1 GiB of it.
MAX_PROJECTION_VALUES = 1 << 27
TOO_LARGE_PROJECTIONS = (
    "E2LSH with 'n_hashes' = {k} and 'n_tables' = {tables} in {d} dimensions needs {values} "
    "projection values; at most 134217728 (1 GiB) are supported."
)


def check_projection_size(d: int, n_hashes: int, n_tables: int) -> None:
    """Refuse hash functions whose projections cannot be held in memory."""
    if d * n_hashes * n_tables > MAX_PROJECTION_VALUES:
        raise FairpipeInputError(TOO_LARGE_PROJECTIONS.format(
            k=n_hashes, tables=n_tables, d=d, values=d * n_hashes * n_tables))  # fmt: skip


LSH_ARRAYS = ("projections", "offsets", "multipliers")
# A radius within this relative distance above a scale's radius is read by that scale (the
# radius a command prints and reads back is rounded).
RADIUS_TOLERANCE = 1e-9
BAD_SCALES = (
    "The 'scales' parameter of E2LSH must be (radius, bucket_width, n_tables) triples with "
    "positive radii in increasing order, the first bucket_width equal to 'bucket_width' and "
    "n_tables summing to 'n_tables' ({tables}). Got {scales!r}."
)


@dataclass(frozen=True)
class Scale:
    """One family of the index's tables, built for queries up to ``radius``: tables
    ``first`` to ``last - 1`` with bucket width ``bucket_width`` (``index``: its place)."""

    index: int
    radius: float
    bucket_width: float
    first: int
    last: int

    @property
    def n_tables(self) -> int:
        return self.last - self.first


def check_scales(scales, n_tables: int, bucket_width: float) -> tuple[Scale, ...]:
    """The :class:`Scale` s of the ``scales`` parameter (see :class:`LSHParameters`)."""
    if scales is None or len(scales) == 0:
        return (Scale(0, 0.0, float(bucket_width), 0, int(n_tables)),)
    out: list[Scale] = []
    first = 0
    try:
        for i, (radius, width, tables) in enumerate(scales):
            radius, width = float(radius), float(width)
            ok = (isinstance(tables, int | np.integer) and not isinstance(tables, bool)
                  and tables >= 1 and np.isfinite(radius) and radius > 0
                  and np.isfinite(width) and width > 0
                  and (i > 0 or width == float(bucket_width))
                  and (i == 0 or radius > out[-1].radius))  # fmt: skip
            if not ok:
                raise ValueError
            out.append(Scale(i, radius, width, first, first + int(tables)))
            first += int(tables)
    except (TypeError, ValueError):
        raise FairpipeInputError(BAD_SCALES.format(tables=n_tables, scales=scales)) from None
    if first != int(n_tables):
        raise FairpipeInputError(BAD_SCALES.format(tables=n_tables, scales=scales))
    return tuple(out)


U32, U64 = 2.0**-24, 2.0**-53  # unit roundoffs (float32, float64)
NEAR_ENTRIES = 1 << 20  # products of near cells summed at once (8 MB of float64)
CELL_CLAMP = 2.0**62  # |cell| above it is clamped (exact projection)


@dataclass(kw_only=True, repr=False, eq=False)
class LSHParameters(BaseEstimator):
    """The parameters of E2LSH hash functions, shared by :class:`E2LSH` and ``FairNN`` (which
    draws its hash functions with them)."""

    n_hashes: int = LSH_N_HASHES.default
    n_tables: int = LSH_N_TABLES.default
    bucket_width: float = LSH_BUCKET_WIDTH.default
    seed: int = SEED.default
    projection: str = PROJECTION.default  # how a cell is defined (module docstring)
    # The index's scales (:class:`Scale`): each a family of tables for one query radius, as
    # (radius, bucket_width, n_tables) in table order; () is one family of all the tables.
    scales: tuple = ()

    def _check_params(self) -> None:
        check_settings("E2LSH", E2LSH_SETTINGS, self)
        self.scales_of()

    def scales_of(self) -> tuple[Scale, ...]:
        """The checked scales, in table order (one scale of every table where none are given,
        its radius unknown: 0)."""
        return check_scales(self.scales, int(self.n_tables), float(self.bucket_width))

    def scale_for(self, radius: float) -> Scale:
        """The scale a query at ``radius`` reads: the one of the smallest radius at least
        ``radius`` (its tables reach a point at ``radius`` with at least the recall they reach
        at their own), else the largest (``radius`` beyond the index's range). An index of one
        scale answers every radius with it."""
        scales = self.scales_of()
        for scale in scales:
            if radius <= scale.radius * (1 + RADIUS_TOLERANCE):
                return scale
        return scales[-1]

    def radius_range(self) -> float | None:
        """The largest radius the index is built for (None: not recorded)."""
        top = self.scales_of()[-1].radius
        return top if top > 0 else None


@dataclass(kw_only=True, repr=False, eq=False)
class E2LSH(LSHParameters):
    """Random E2LSH hash functions and the bucket keys of points.

    Parameters
    ----------
    n_hashes : int
        Hash functions concatenated per table (the papers' k).
    n_tables : int
        Number of tables L.
    bucket_width : float
        Bucket width w (the paper uses w about 3.1-3.3 times the query radius).
    seed : int
        Seed of the projections and offsets.
    projection : {"exact", "float32"}
        How a cell ``floor((a . x + b) / w)`` is computed: ``"exact"`` (the default) gives the
        same bits on every machine, batch and thread count; ``"float32"`` is the definition of
        stores made before it (see the module docstring).

    Examples
    --------
    >>> X = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    >>> lsh = E2LSH(n_hashes=2, n_tables=4, bucket_width=1.0, seed=1).fit(X)
    >>> keys = lsh.hash(X)
    >>> keys.shape, keys.dtype.name
    ((5, 4), 'uint64')
    >>> bool(np.array_equal(keys, lsh.hash(X[::-1])[::-1]))
    True
    """

    _fitted_attribute = "projections_"

    def fit(self, X: np.ndarray | int, y=None, *, ids: np.ndarray | None = None) -> E2LSH:
        """Draw the hash functions for the dimension of ``X`` (a matrix or an int dimension);
        ``y`` and ``ids`` are accepted for the common signature and not used (the functions depend on the
        seed and the dimension only)."""
        d = int(X) if isinstance(X, int | np.integer) else int(np.asarray(X).shape[1])
        check_positive_int(d, "d", "E2LSH.fit")
        self._check_params()
        k, n_tables, width = int(self.n_hashes), int(self.n_tables), float(self.bucket_width)
        check_projection_size(d, k, n_tables)
        scales = self.scales_of()
        rng = np.random.default_rng(np.random.SeedSequence([int(self.seed), 0x15B]))
        a = [rng.standard_normal((d, scales[0].n_tables * k))]
        b = [rng.uniform(0.0, width, size=scales[0].n_tables * k)]
        # Odd multipliers below 2**27 keep sum(cell * multiplier) exact in float64 (see _fold).
        multipliers = rng.integers(MULT_LOW, MULT_HIGH, size=k, dtype=np.int64).view(np.uint64)
        multipliers |= np.uint64(1)
        for scale in scales[1:]:  # each scale's functions its own draw: a scale added later
            # leaves the others' as they were
            more = np.random.default_rng(
                np.random.SeedSequence([int(self.seed), 0x15B, scale.index])
            )
            a.append(more.standard_normal((d, scale.n_tables * k)))
            b.append(more.uniform(0.0, scale.bucket_width, size=scale.n_tables * k))
        return self._install(np.concatenate(a, axis=1).astype(np.float32),
                             np.concatenate(b).astype(np.float32), multipliers)  # fmt: skip

    def to_arrays(self, data: bool = True) -> dict[str, np.ndarray]:
        """The hash functions: ``projections`` (d, L * n_hashes) float32, ``offsets``
        (L * n_hashes,) float32 and ``multipliers`` (n_hashes,) uint64 (no rows to include)."""
        self._check_fitted()
        return {
            "projections": self.projections_,
            "offsets": self.offsets_,
            "multipliers": self.multipliers_,
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], **params) -> E2LSH:
        lsh = cls(**params)
        lsh._check_params()
        return lsh._install(*(np.asarray(arrays[name]) for name in LSH_ARRAYS))

    def _install(self, projections: np.ndarray, offsets: np.ndarray, multipliers: np.ndarray):
        self.projections_ = np.ascontiguousarray(projections, dtype=np.float32)
        self.offsets_ = np.ascontiguousarray(offsets, dtype=np.float32)
        self.multipliers_ = np.ascontiguousarray(multipliers, dtype=np.uint64)
        self.n_features_in_ = self.projections_.shape[0]
        # Dividing once here instead of per point: floor((a.x + b) / w) = floor(x.(a/w) + b/w),
        # w the width of the column's scale.
        k = int(self.n_hashes)
        widths = np.concatenate([np.full(s.n_tables * k, s.bucket_width, dtype=np.float32)
                                 for s in self.scales_of()])  # fmt: skip
        self._scaled_a = (self.projections_ / widths).astype(np.float32)
        self._scaled_b = (self.offsets_ / widths).astype(np.float32)
        self._table_prefix = np.arange(self.n_tables, dtype=np.uint64) << TABLE_SHIFT
        self._first_table = 0  # the number of the first table (E2LSH.tables)
        # sum_j |cell_j| * m_j < 2**53 whenever every |cell| < _cell_limit: then float64 sums
        # of integer products are exact in any order, and equal the wrapping uint64 sum.
        top = float(self.multipliers_.max()) if self.multipliers_.size else 1.0
        self._cell_limit = 2.0**53 / (top * max(int(self.n_hashes), 1) * 2.0)
        self._mult_f64 = self.multipliers_.astype(np.float64)
        # The exact projection (module docstring): the float64 operands of the in-order sums,
        # and per column gamma_d * ||a_c / w|| (float32 product's and float64 sum's errors),
        # rounded up, so that ||x|| times it bounds |float32 product - v| but for the offset.
        d = self.n_features_in_
        self._a_f64 = self._scaled_a.astype(np.float64)
        self._b_f64 = self._scaled_b.astype(np.float64)
        self._a_f64_t = np.ascontiguousarray(self._a_f64.T)
        gamma = d * U32 / (1 - d * U32) + (d + 2) * U64 / (1 - (d + 2) * U64)
        norms = np.sqrt(np.einsum("ij,ij->j", self._a_f64, self._a_f64))
        self._col_bound = gamma * (1 + 1e-6) * norms
        # The numpy fold's per-row bound: ||x|| times the largest column bound, and the terms
        # bounding |t| (the largest column norm, the largest offset plus one).
        widest = float(norms.max(initial=0.0)) * (1 + 1e-6)
        self._row_bound = (float(self._col_bound.max(initial=0.0)), widest,
                           float(np.abs(self._b_f64).max(initial=0.0)) + 1.0)  # fmt: skip
        return self

    def tables(self, first: int, last: int, renumbered: bool = False) -> E2LSH:
        """The hash functions of tables ``first`` to ``last - 1`` alone: their keys as this
        one gives them (what an index extended by new scales hashes its rows with), or with
        the tables numbered from 0 (``renumbered``: an index of those tables alone)."""
        self._check_fitted()
        k = int(self.n_hashes)
        parts = [(s.radius, s.bucket_width, min(s.last, last) - max(s.first, first))
                 for s in self.scales_of() if s.first < last and s.last > first]  # fmt: skip
        if not 0 <= first < last <= int(self.n_tables) or any(r <= 0 for r, _, _ in parts[1:]):
            raise FairpipeInputError(f"E2LSH.tables needs 0 <= first < last <= {self.n_tables}"
                                     f" within known scales. Got {first}, {last}.")  # fmt: skip
        sub = E2LSH(n_hashes=k, n_tables=last - first, bucket_width=parts[0][1], seed=self.seed,
                    projection=self.projection,
                    scales=tuple(parts) if len(parts) > 1 else ())  # fmt: skip
        sub._install(self.projections_[:, first * k : last * k],
                     self.offsets_[first * k : last * k], self.multipliers_)  # fmt: skip
        if not renumbered:
            sub._table_prefix = np.arange(first, last, dtype=np.uint64) << TABLE_SHIFT
            sub._first_table = first
        return sub

    def hash(self, X: np.ndarray) -> np.ndarray:
        """Bucket keys, shape (n, n_tables) uint64, of validated points ``X``."""
        self._check_fitted()
        X = check_points(X, where="E2LSH.hash", n_features=self.n_features_in_)
        return self.hash_validated(X)

    def hash_validated(self, X: np.ndarray, by_table: bool = False,
                       threads: int = 1) -> np.ndarray:  # fmt: skip
        """Bucket keys of ``X``, which is known to be valid (a finite float32 matrix of the
        fitted dimension): the kernel the Dask jobs call on chunks they already validated.
        ``by_table``: returned transposed, (n_tables, n) (what the index build stages).
        ``threads``: where the compiled fold is used, the rows are split in up to that many
        ranges of whole row blocks hashed at once (the product and the fold release the GIL;
        every block is the one a single thread hashes, so the keys are the same)."""
        n = X.shape[0]
        out = np.empty((self.n_tables, n) if by_table else (n, self.n_tables), dtype=np.uint64)
        compiled = n > COMPILED_FOLD_ROWS or _segments.KERNELS_WARM
        parts = min(int(threads), n // THREAD_ROWS) if compiled else 1
        if parts <= 1:
            self._hash_rows(X, 0, n, out, by_table, compiled)
            return self._numbered(out, by_table)
        from concurrent.futures import ThreadPoolExecutor

        blocks = -(-n // ROW_BLOCK)
        cuts = [min(n, blocks * i // parts * ROW_BLOCK) for i in range(parts + 1)]
        with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="fairpipe-hash") as pool:
            done = [pool.submit(self._hash_rows, X, a, b, out, by_table, True)
                    for a, b in zip(cuts[:-1], cuts[1:])]  # fmt: skip
            for future in done:
                future.result()
        return self._numbered(out, by_table)

    def _numbered(self, keys: np.ndarray, by_table: bool) -> np.ndarray:
        """``keys`` with their tables' numbers (the compiled fold numbers them from 0: tables
        of :meth:`tables` start at their own)."""
        if self._first_table:
            keys &= HASH_MASK
            keys |= self._table_prefix[:, None] if by_table else self._table_prefix
        return keys

    def _hash_rows(self, X: np.ndarray, first: int, last: int, out: np.ndarray, by_table: bool,
                   compiled: bool) -> None:  # fmt: skip
        """Keys of rows [first, last) of ``X`` into ``out`` (``first`` a multiple of
        ROW_BLOCK), a block of ROW_BLOCK rows at a time (the last padded with zeros)."""
        proj = np.empty((ROW_BLOCK, self._scaled_a.shape[1]), dtype=np.float32)
        block = np.zeros((ROW_BLOCK, X.shape[1]), dtype=np.float32)
        for start in range(first, last, ROW_BLOCK):
            stop = min(start + ROW_BLOCK, last)
            rows = stop - start
            if rows == ROW_BLOCK:
                src = X[start:stop]
                if src.dtype != np.float32 or not src.flags.c_contiguous:
                    block[:] = src
                    src = block
            elif self.projection == "exact":
                # A short block is multiplied alone (a query's one row: 0.1 ms, against 4-12 ms
                # for the padded block): its keys do not depend on the product's order.
                block[:rows] = X[start:stop]
                src = block[:rows]
            else:
                block[:rows] = X[start:stop]
                block[rows:] = 0.0
                src = block
            np.matmul(src, self._scaled_a, out=proj[: src.shape[0]])
            if compiled:
                self._fold_compiled(proj[:rows], src[:rows], out[:, start:stop] if by_table else
                                    out[start:stop], by_table)  # fmt: skip
            elif by_table:
                out[:, start:stop] = self._fold(proj[:rows], src[:rows]).T
            else:
                out[start:stop] = self._fold(proj[:rows], src[:rows])

    def _fold_compiled(self, proj: np.ndarray, X: np.ndarray, out: np.ndarray,
                       by_table: bool) -> None:  # fmt: skip
        """:meth:`_fold` by the compiled kernel into ``out`` ((rows, L), or (L, rows) when
        ``by_table``): the same bits; worth loading numba for a large batch only."""
        from fairpipe.neighbors._pack import fold_block

        fold_block(proj, X, self._scaled_b, self._a_f64, self._b_f64, self._col_bound,
                   self.multipliers_, self.n_tables, HASH_MASK, TABLE_SHIFT, out, by_table,
                   self.projection == "exact")  # fmt: skip

    def _cells(self, proj: np.ndarray, X: np.ndarray) -> np.ndarray:
        """The floored cells (rows, L * k) float64 of rows ``X`` from their float32 product
        ``proj`` with the scaled projections (overwritten), by the ``projection`` definition."""
        if self.projection == "float32":
            proj += self._scaled_b
            return np.floor(proj, out=proj).astype(np.float64)
        t = proj.astype(np.float64)
        t += self._b_f64
        cells = np.floor(t)
        t -= cells  # the fraction (in [0, 1]: for t in (-1, 0) it may round to 1)
        # One bound per row (the largest column's): |v - t| <= bound, with |t| itself bounded
        # by ||x|| max ||a_c / w|| + max |b / w| (Cauchy-Schwarz), so no (rows, L * k) bound.
        x_norm = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64)) * (1 + 1e-6)
        bound = x_norm * self._row_bound[0] + 8 * U64 * (
            x_norm * self._row_bound[1] + self._row_bound[2]
        )
        bound = bound[:, None]
        # Settled only where both tests hold: a product that overflowed float32 (inf, or NaN
        # after floor) fails them and is summed in float64, where it cannot overflow.
        near = ~((t >= bound) & (t < 1 - bound))
        if near.any():  # near an integer: the in-order float64 sum decides
            i, c = np.divmod(np.flatnonzero(near), t.shape[1])  # (np.nonzero: 7x slower)
            # In parts of at most NEAR_ENTRIES products: a large d makes many cells near
            # (the bound grows with d), and all at once took GBs for one block at d = 2,000.
            step = max(1, NEAR_ENTRIES // X.shape[1])
            for a in range(0, i.shape[0], step):
                ii, cc = i[a : a + step], c[a : a + step]
                products = X[ii].astype(np.float64) * self._a_f64_t[cc]  # exact
                acc = np.add.accumulate(products, axis=1)[:, -1]  # in order, as the kernel
                acc += self._b_f64[cc]
                cells[ii, cc] = np.floor(acc)
        # Cells beyond +-2**62 (a width tiny against the data) are clamped, so the int64 of
        # a cell is defined on every CPU (a float64 above 2**63 converts differently).
        np.clip(cells, -CELL_CLAMP, CELL_CLAMP, out=cells)
        return cells

    def _fold(self, proj: np.ndarray, X: np.ndarray) -> np.ndarray:
        cells = self._cells(proj, X)
        shape = (cells.shape[0], self.n_tables, self.n_hashes)
        if cells.size and max(-float(cells.min()), float(cells.max())) < self._cell_limit:
            # Exact: every partial sum is an integer below 2**53 (about twice as fast).
            total = cells.reshape(shape) @ self._mult_f64
            folded = total.astype(np.int64).view(np.uint64)
        else:
            # Wrapping uint64 arithmetic: the same sum modulo 2**64.
            cells_u = cells.astype(np.int64).view(np.uint64).reshape(shape)
            folded = np.einsum("ntk,k->nt", cells_u, self.multipliers_)
        # Then a bijective mixer.
        return (splitmix64(folded) & HASH_MASK) | self._table_prefix
