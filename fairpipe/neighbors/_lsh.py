"""E2LSH for the L2 distance (Datar, Immorlica, Indyk, Mirrokni 2004).

Each of ``n_tables`` tables concatenates ``n_hashes`` functions ``floor((a . x + b) / w)`` with
``a ~ N(0, I_d)``, ``b ~ U[0, w)`` and w the ``bucket_width``. The integers of a table are folded into one 64-bit bucket
key: the table number in the top 16 bits and a 48-bit hash of the k-tuple below them, so that every
(table, bucket) pair has one key and all tables' buckets live in one sorted array (searched through
:mod:`fairpipe.neighbors._key_directory`). Two different k-tuples of one table share a key with probability
2**-48 per pair; such a merge only adds candidates to a bucket, which the neighbourhood modes then
filter by distance.

Determinism: the projection is a float32 matrix product. BLAS may sum a row's products in a
different order for a different number of rows (a one-row product goes through gemv), so rows are
always hashed in padded blocks of ``ROW_BLOCK`` rows: a point's keys do not depend on which chunk,
worker or batch it was hashed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fairpipe.base import BaseEstimator
from fairpipe.errors import FairpipeInputError, check_int, check_positive_float, check_positive_int
from fairpipe.hashing import splitmix64
from fairpipe.validation import check_points

ROW_BLOCK = 256
# Above this many rows, keys are folded by the compiled kernel: loading it costs a process about
# 0.45 s once, and numpy folds 10k rows in 0.04 s, so a small append done by the flow itself
# (flows.ingest.LOCAL_ROWS) stays with numpy; the Dask jobs' chunks are larger.
COMPILED_FOLD_ROWS = 20_000
TABLE_SHIFT = np.uint64(48)
HASH_MASK = np.uint64((1 << 48) - 1)
MAX_TABLES = (1 << 16) - 1
MULT_LOW, MULT_HIGH = 1 << 26, 1 << 27
TOO_MANY_TABLES = "The 'n_tables' parameter of E2LSH must be at most {limit}. Got {value}."
LSH_ARRAYS = ("projections", "offsets", "multipliers")


@dataclass(kw_only=True, repr=False, eq=False)
class LSHParameters(BaseEstimator):
    """The parameters of E2LSH hash functions, shared by :class:`E2LSH` and ``FairNN`` (which
    draws its hash functions with them)."""

    n_hashes: int = 15
    n_tables: int = 100
    bucket_width: float = 4.0
    seed: int = 0

    def _check_params(self) -> None:
        check_positive_int(self.n_hashes, "n_hashes", "E2LSH")
        n_tables = check_positive_int(self.n_tables, "n_tables", "E2LSH")
        check_positive_float(self.bucket_width, "bucket_width", "E2LSH")
        check_int(self.seed, "seed", "E2LSH")
        if n_tables > MAX_TABLES:
            raise FairpipeInputError(TOO_MANY_TABLES.format(limit=MAX_TABLES, value=n_tables))


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

    def fit(self, X: np.ndarray | int, ids: np.ndarray | None = None) -> E2LSH:
        """Draw the hash functions for the dimension of ``X`` (a matrix or an int dimension);
        ``ids`` are accepted for the common signature and not used (the functions depend on the
        seed and the dimension only)."""
        d = int(X) if isinstance(X, int | np.integer) else int(np.asarray(X).shape[1])
        check_positive_int(d, "d", "E2LSH.fit")
        self._check_params()
        k, n_tables, width = int(self.n_hashes), int(self.n_tables), float(self.bucket_width)
        rng = np.random.default_rng(np.random.SeedSequence([int(self.seed), 0x15B]))
        a = rng.standard_normal((d, n_tables * k))
        b = rng.uniform(0.0, width, size=n_tables * k)
        # Odd multipliers below 2**27 keep sum(cell * multiplier) exact in float64 (see _fold).
        multipliers = rng.integers(MULT_LOW, MULT_HIGH, size=k, dtype=np.int64).view(np.uint64)
        multipliers |= np.uint64(1)
        return self._install(a.astype(np.float32), b.astype(np.float32), multipliers)

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
        # Dividing once here instead of per point: floor((a.x + b) / w) = floor(x.(a/w) + b/w).
        self._scaled_a = (self.projections_ / np.float32(self.bucket_width)).astype(np.float32)
        self._scaled_b = (self.offsets_ / np.float32(self.bucket_width)).astype(np.float32)
        self._table_prefix = np.arange(self.n_tables, dtype=np.uint64) << TABLE_SHIFT
        # sum_j |cell_j| * m_j < 2**53 whenever every |cell| < _cell_limit: then float64 sums
        # of integer products are exact in any order, and equal the wrapping uint64 sum.
        top = float(self.multipliers_.max()) if self.multipliers_.size else 1.0
        self._cell_limit = 2.0**53 / (top * max(int(self.n_hashes), 1) * 2.0)
        self._mult_f64 = self.multipliers_.astype(np.float64)
        return self

    def hash(self, X: np.ndarray) -> np.ndarray:
        """Bucket keys, shape (n, n_tables) uint64, of validated points ``X``."""
        self._check_fitted()
        X = check_points(X, where="E2LSH.hash", n_features=self.n_features_in_)
        return self.hash_validated(X)

    def hash_validated(self, X: np.ndarray, by_table: bool = False) -> np.ndarray:
        """Bucket keys of ``X``, which is known to be valid (a finite float32 matrix of the
        fitted dimension): the kernel the Dask jobs call on chunks they already validated.
        ``by_table``: returned transposed, (n_tables, n) (what the index build stages)."""
        n = X.shape[0]
        out = np.empty((self.n_tables, n) if by_table else (n, self.n_tables), dtype=np.uint64)
        proj = np.empty((ROW_BLOCK, self._scaled_a.shape[1]), dtype=np.float32)
        compiled = n > COMPILED_FOLD_ROWS

        block = np.zeros((ROW_BLOCK, X.shape[1]), dtype=np.float32)
        for start in range(0, n, ROW_BLOCK):
            stop = min(start + ROW_BLOCK, n)
            rows = stop - start
            if rows == ROW_BLOCK:
                src = X[start:stop]
                if src.dtype != np.float32 or not src.flags.c_contiguous:
                    block[:] = src
                    src = block
            else:
                block[:rows] = X[start:stop]
                block[rows:] = 0.0
                src = block
            np.matmul(src, self._scaled_a, out=proj)
            if compiled:
                self._fold_compiled(proj[:rows], out[:, start:stop] if by_table else
                                    out[start:stop], by_table)  # fmt: skip
            elif by_table:
                out[:, start:stop] = self._fold(proj[:rows]).T
            else:
                out[start:stop] = self._fold(proj[:rows])
        return out

    def _fold_compiled(self, proj: np.ndarray, out: np.ndarray, by_table: bool) -> None:
        """:meth:`_fold` by the compiled kernel into ``out`` ((rows, L), or (L, rows) when
        ``by_table``): the same bits; worth loading numba for a large batch only."""
        from fairpipe.neighbors._pack import fold_block

        fold_block(proj, self._scaled_b, self.multipliers_, self.n_tables, HASH_MASK, TABLE_SHIFT,
                   out, by_table)  # fmt: skip

    def _fold(self, proj: np.ndarray) -> np.ndarray:
        proj += self._scaled_b
        np.floor(proj, out=proj)
        shape = (proj.shape[0], self.n_tables, self.n_hashes)
        if proj.size and max(-float(proj.min()), float(proj.max())) < self._cell_limit:
            # Exact: every partial sum is an integer below 2**53 (about twice as fast).
            total = proj.reshape(shape).astype(np.float64) @ self._mult_f64
            folded = total.astype(np.int64).view(np.uint64)
        else:
            # Wrapping uint64 arithmetic: the same sum modulo 2**64.
            cells = proj.astype(np.int64).view(np.uint64).reshape(shape)
            folded = np.einsum("ntk,k->nt", cells, self.multipliers_)
        # Then a bijective mixer.
        return (splitmix64(folded) & HASH_MASK) | self._table_prefix
