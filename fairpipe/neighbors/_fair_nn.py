"""FairNN: fair near-neighbour sampling through an E2LSH bucket index.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(500, 8)).astype(np.float32)
>>> nn = FairNN(n_hashes=2, n_tables=10, bucket_width=4.0, seed=0).fit(X)
>>> res = nn.sample(query_rows=[0, 1], radius=3.0, n_samples=5, seed=1)
>>> res.ids.shape
(2, 5)
>>> bool((np.linalg.norm(X[res.ids[0]] - X[0], axis=1) <= 3.0).all())
True
>>> report = nn.delete(res.ids[0])
>>> bool(np.isin(nn.sample(query_rows=[0], radius=3.0, n_samples=50, seed=2).ids, report.deleted).any())
False
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairpipe.base import DeletionReport
from fairpipe.errors import (
    FairpipeInputError,
    check_one_of,
    check_positive_float,
    check_seed,
)
from fairpipe.neighbors._bucket_index import BucketIndex, remove_rows
from fairpipe.neighbors._degree_sampling import (
    PATHS,
    SHORT_EMPTY,
    QueryStats,
    sample_query,
)
from fairpipe.neighbors._lsh import E2LSH, LSH_ARRAYS, LSHParameters, Scale
from fairpipe.neighbors._query_buckets import neighbourhood
from fairpipe.neighbors._rank_sampling import RankState
from fairpipe.settings import MAX_SAMPLES, MODE, N_SAMPLES, SAMPLER, C, check_settings
from fairpipe.validation import check_points, check_points_and_ids

NEEDS_ROWS = "FairNN.from_arrays needs the rows: the array {name!r} is missing."
INDEX_ARRAYS = ("bucket_keys", "bucket_starts", "members")
BAD_ROW = "Query row {row} is out of range: the index holds rows 0..{last}."
DEAD_ROW = "Query row {row} (id {id}) has been deleted; it cannot be used as a query."
# Samples one call returns at most (an int64 id each: 800 MB), over all its queries.
TOO_MANY_SAMPLES = (
    "{owner} is asked for {n} samples{detail}; at most 100000000 (an 8-byte id each) can be "
    "returned by one call."
)
INCLUDE_QUERY_BY_VALUE = (
    "The 'include_query' parameter of {owner} applies to queries by row or id only: points "
    "given by value are no rows of the index. Leave it out, or query by row."
)
ENUMERATE_EXACT_ONLY = (
    "The 'path' parameter of {owner} may be 'enumerate' only with the 'exact' sampler (a "
    "uniform draw from the enumerated neighbourhood is its distribution). Got sampler "
    "{sampler!r}."
)


_THREAD = threading.local()


@functools.lru_cache(maxsize=256)
def _seed_state(seed: int) -> Any:
    return np.random.PCG64(np.random.SeedSequence([seed, 7])).state


def check_sample_options(owner, radius, n_samples, sampler, mode, c, failure_prob, path):
    """:meth:`FairNN.sample`'s options, checked (shared with the store's lazy sampler)."""
    radius = check_positive_float(radius, "radius", owner)
    given = {"n_samples": n_samples, "sampler": sampler, "mode": mode, "c": c}
    checked = check_settings(owner, (N_SAMPLES, SAMPLER, MODE, C), given)
    n_samples, sampler, mode, c = (checked[name] for name in given)
    failure_prob = check_positive_float(failure_prob, "failure_prob", owner)
    if failure_prob >= 1.0:
        raise FairpipeInputError(
            f"The 'failure_prob' parameter of {owner} must be below 1. Got {failure_prob}."
        )
    path = check_one_of(path, PATHS, "path", owner)
    if path == "enumerate" and sampler != "exact":
        raise FairpipeInputError(ENUMERATE_EXACT_ONLY.format(owner=owner, sampler=sampler))
    return radius, n_samples, sampler, mode, c, failure_prob, path


def query_generator(seed: int | None, owner: str = "FairNN.sample") -> np.random.Generator:
    """The generator a sampling call draws from: fresh entropy for ``seed=None``."""
    if seed is None:
        return np.random.default_rng()
    return _generator(check_seed(seed, "seed", owner))


def check_sample_count(owner: str, n_samples: int, n_queries: int) -> None:
    """Refuse a call whose samples (one id each) cannot be held in memory."""
    if n_samples * n_queries > MAX_SAMPLES:
        detail = f" ({n_samples} for each of {n_queries} queries)"
        raise FairpipeInputError(
            TOO_MANY_SAMPLES.format(owner=owner, n=n_samples * n_queries, detail=detail)
        )


def _generator(seed: int) -> np.random.Generator:
    """``default_rng(SeedSequence([seed, 7]))``, without re-hashing the seed on every query.

    Seeding a PCG64 costs ~15 us, a third of a whole query at n = 1M; restoring a cached state
    into this thread's generator costs ~2 us and yields the same stream.
    """
    gen = getattr(_THREAD, "generator", None)
    if gen is None:
        gen = _THREAD.generator = np.random.Generator(np.random.PCG64(0))
    gen.bit_generator.state = _seed_state(seed)
    return gen


@dataclass
class SampleResult:
    """Sampled ids per query: ``ids[i]`` holds query i's samples, -1 where none could be drawn.

    ``counts[i]`` samples of query i were drawn (``stats[i].drawn``) of the ``stats[i].asked``;
    fewer only with a reason, ``stats[i].why`` (``"empty"``: its neighbourhood is empty;
    ``"draw_limit"``: its draws reached their limit). :meth:`short` lists those queries.
    """

    ids: np.ndarray
    rows: np.ndarray
    counts: np.ndarray
    neighbourhood_sizes: np.ndarray | None
    stats: list[QueryStats] = field(default_factory=list)

    def short(self) -> list[tuple[int, int, int, str]]:
        """(query, drawn, asked, why) of each query given fewer samples than asked."""
        return [(i, st.drawn, st.asked, st.why) for i, st in enumerate(self.stats)
                if st.why is not None]  # fmt: skip


@dataclass(kw_only=True, repr=False, eq=False)
class FairNN(LSHParameters):
    """Sample a uniformly random near neighbour of a query, through LSH buckets.

    Parameters
    ----------
    n_hashes, n_tables, bucket_width, seed, projection
        E2LSH parameters (see :class:`E2LSH`); ``seed`` also fixes the rank permutation of the
        ``rank`` sampler.
    """

    _fitted_attribute = "index_"

    def _lsh(self) -> E2LSH:
        return E2LSH(**self.get_params())

    def fit(self, X: np.ndarray, y=None, *, ids: np.ndarray | None = None) -> FairNN:
        """Index the rows of ``X`` (``ids``: one per row, default the row numbers; ``y`` is
        ignored, scikit-learn's convention for estimators without a target)."""
        self._check_params()
        X, ids = check_points_and_ids(X, ids, "FairNN")
        lsh = self._lsh().fit(X)
        keys = lsh.hash_validated(X)
        return self._install(X, ids, np.ones(X.shape[0], bool), keys, BucketIndex.build(keys), lsh)

    def to_arrays(self, data: bool = True) -> dict[str, np.ndarray]:
        """The hash functions (``projections``, ``offsets``, ``multipliers``), the bucket index
        over all tables (``bucket_keys``, ``bucket_starts``, ``members``: row numbers), and with
        ``data`` the rows (``points``, ``ids``, ``alive``) and their ``keys`` (n, L)."""
        self._check_fitted()
        out = {**self.lsh_.to_arrays(), "bucket_keys": self.index_.bucket_keys,
               "bucket_starts": self.index_.starts, "members": self.index_.members}  # fmt: skip
        if data:
            out.update(keys=self.keys_, **self._row_arrays(True))
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], **params) -> FairNN:
        """A fitted sampler from :meth:`to_arrays` output (with its rows) and the parameters.
        Without ``bucket_keys`` the index is rebuilt from the live rows' ``keys``; without
        ``keys`` (a store's sampler: :func:`fairpipe.storage.index.load_sampler`), they are made from
        the index when first asked for."""
        nn = cls(**params)
        for name in ("points", "ids", *LSH_ARRAYS):
            if name not in arrays:
                raise FairpipeInputError(NEEDS_ROWS.format(name=name))
        if "keys" not in arrays and "bucket_keys" not in arrays:
            raise FairpipeInputError(NEEDS_ROWS.format(name="keys"))
        lsh = E2LSH.from_arrays(arrays, **nn._lsh().get_params())
        points, ids = np.asarray(arrays["points"]), np.asarray(arrays["ids"])
        keys = np.asarray(arrays["keys"]) if "keys" in arrays else None
        alive = np.asarray(arrays["alive"], bool) if "alive" in arrays else np.ones(len(ids), bool)
        if "bucket_keys" in arrays:
            bucket_keys, starts, members = (np.asarray(arrays[n]) for n in INDEX_ARRAYS)
            index = BucketIndex(bucket_keys, starts, members, int(nn.n_tables))
        else:
            assert keys is not None  # checked above
            index = BucketIndex.build(keys, alive)
        return nn._install(points, ids, alive, keys, index, lsh)

    def _install(self, points, ids, alive, keys, index, lsh) -> FairNN:
        self._set_rows(points, ids, alive)
        self._keys = keys
        self.index_ = index
        self.lsh_ = lsh
        self.n_features_in_ = int(points.shape[1])
        self._rank_state: RankState | None = None
        self._point_buckets: np.ndarray | None = None
        return self

    def delete(self, ids) -> DeletionReport:
        """Forget ``ids``: their rows leave every bucket, so no query can draw them again. The
        buckets afterwards hold exactly the live rows, as an index built on them would."""
        report, rows = self._start_deletion(ids)
        if rows.size:
            dead = np.zeros(self.ids_.shape[0], dtype=bool)
            dead[rows] = True
            index = self.index_
            kept_keys, kept_starts, kept_members = remove_rows(
                index.bucket_keys, index.starts, index.members, dead
            )
            self.index_ = BucketIndex(kept_keys, kept_starts, kept_members, index.n_tables)
            self._rank_state = None
            self._point_buckets = None
        return report

    @property
    def keys_(self) -> np.ndarray:
        """(n, L) uint64 bucket key of every row in each table. Made from the index on first use
        where the sampler was given none (a row in no bucket, forgotten, has all ones)."""
        keys = self.__dict__.get("_keys", self.__dict__.get("keys_"))  # (older pickles hold keys_)
        if keys is None:
            keys = self.index_.row_keys(self.points_.shape[0])
        self._keys = keys
        return keys

    @property
    def point_buckets_(self) -> np.ndarray:
        """(n, L) bucket number of every row in each table (:meth:`BucketIndex.point_buckets`).

        Built on first use (about 2 s per 100M row-table pairs); the samplers compare these
        instead of the 64-bit keys, and a query that is a stored row reads its buckets here.
        """
        if self._point_buckets is None:
            self._point_buckets = self.index_.point_buckets(self.points_.shape[0])
        return self._point_buckets

    def _few_rows(self, query_rows):
        """A short list of row numbers checked on Python ints (a single query's common case)."""
        if not isinstance(query_rows, (list, tuple)) or not 0 < len(query_rows) <= 8:
            return None
        n = self.points_.shape[0]
        for r in query_rows:
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                return None
            if not 0 <= r < n:
                raise FairpipeInputError(BAD_ROW.format(row=int(r), last=n - 1))
            if not self.alive_[r]:
                raise FairpipeInputError(DEAD_ROW.format(row=int(r), id=int(self.ids_[r])))
        if len(query_rows) == 1:
            r = int(query_rows[0])
            return self.points_[r : r + 1], self.point_buckets_[r : r + 1]
        rows = [int(r) for r in query_rows]
        return self.points_[rows], self.point_buckets_[rows]

    def _resolve_queries(self, queries, query_rows, scale: Scale):
        """The queries' points and their buckets in every table of ``scale`` (-1 in the
        others': a query reads the tables of one scale)."""
        Q, QB = self._queries_and_buckets(queries, query_rows)
        if scale.n_tables < self.n_tables:
            QB = np.array(QB)
            QB[:, : scale.first] = -1
            QB[:, scale.last :] = -1
        return Q, QB

    def _queries_and_buckets(self, queries, query_rows):
        if (queries is None) == (query_rows is None):
            raise FairpipeInputError(
                "FairNN.sample needs exactly one of 'queries' or 'query_rows'."
            )
        if query_rows is not None:
            few = self._few_rows(query_rows)
            if few is not None:
                return few
            rows = np.atleast_1d(np.asarray(query_rows))
            if rows.dtype.kind not in "iu":
                raise FairpipeInputError(f"Query rows must be integers. Got {rows.dtype}.")
            n = self.points_.shape[0]
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                r = next(int(r) for r in rows if not 0 <= r < n)
                raise FairpipeInputError(BAD_ROW.format(row=r, last=n - 1))
            if not self.alive_[rows].all():
                r = next(int(r) for r in rows if not self.alive_[r])
                raise FairpipeInputError(DEAD_ROW.format(row=r, id=int(self.ids_[r])))
            return self.points_[rows], self.point_buckets_[rows]
        Q = np.asarray(queries)
        Q = check_points(
            Q[None, :] if Q.ndim == 1 else Q, where="the queries", n_features=self.points_.shape[1]
        )
        return Q, self.index_.find(self.lsh_.hash_validated(Q))

    def sample(
        self,
        queries: np.ndarray | None = None,
        *,
        query_rows=None,
        radius: float,
        n_samples: int = 1,
        sampler: str = SAMPLER.default,
        mode: str = MODE.default,
        c: float = C.default,
        seed: int | None = None,
        max_outliers: int | None = None,
        failure_prob: float = 0.01,
        with_neighbourhood: bool = False,
        path: str = "auto",
        include_query: bool = False,
    ) -> SampleResult:
        """Draw ``n_samples`` near neighbours for each query.

        ``mode`` picks the neighbourhood (which points count): ``buckets`` (all bucket-mates),
        ``approximate`` (within ``c * radius``) or ``exact`` (within ``radius``). ``sampler``
        picks how a point of it is drawn: ``exact`` and ``approx`` (uniform on the
        neighbourhood; ``failure_prob`` bounds how often ``approx`` gives up on a draw),
        ``rank`` (uniform, keeping its permutation across calls, so repeated queries give
        independent samples), and the biased ``uniform`` and ``weighted`` baselines.

        ``seed`` makes the draws reproducible; with ``seed=None`` every call draws fresh entropy
        from the operating system, so two calls give independent samples.

        ``path`` picks how draws are made (``lazy``: per draw, as in the paper; ``flat``: after
        one pass over the query's buckets; ``enumerate``, ``exact`` sampler only: a uniform
        draw from M(q), enumerated once; ``auto``: lazy until the draws would outnumber the
        bucket entries, then ``enumerate`` for the ``exact`` sampler, ``flat`` for the
        others); all have the same output distribution.

        Every query gets ``n_samples`` samples unless its neighbourhood is empty or its draws
        reach their limit (set from its acceptance rate, so that only absurd work is cut
        short): ``SampleResult.stats[i]`` has ``asked``, ``drawn`` and ``why``.
        """
        self._check_fitted()
        radius, n_samples, sampler, mode, c, failure_prob, path = check_sample_options(
            "FairNN.sample", radius, n_samples, sampler, mode, c, failure_prob, path
        )
        scale = self.scale_for(radius)
        if max_outliers is None:
            max_outliers = 3 * scale.n_tables
        Q, QB = self._resolve_queries(queries, query_rows, scale)
        own = self._own_rows(query_rows, include_query, Q.shape[0], "FairNN.sample")
        check_sample_count("FairNN.sample", n_samples, Q.shape[0])
        rng = query_generator(seed)
        rows = np.empty((Q.shape[0], n_samples), dtype=np.int64)
        rows.fill(-1)
        short = False
        # live stored rows: each of their buckets holds them (the tables of other scales are
        # left out: not complete)
        complete = queries is None and scale.n_tables == self.n_tables
        counts = np.zeros(Q.shape[0], dtype=np.int64)
        sizes = (
            np.zeros(Q.shape[0], dtype=np.int64)
            if with_neighbourhood or sampler == "rank"
            else None
        )
        stats = []
        for i in range(Q.shape[0]):
            cand = None
            if sampler == "rank" or with_neighbourhood:
                cand = neighbourhood(self.index_, self.points_, Q[i], QB[i], mode, radius, c,
                                     int(own[i]))  # fmt: skip
                assert sizes is not None
                sizes[i] = cand.shape[0]
            if sampler == "rank":
                if self._rank_state is None:
                    self._rank_state = RankState(self.ids_, int(self.seed), self.alive_)
                assert cand is not None
                got = self._rank_state.sample(cand, n_samples, rng)
                st = QueryStats(asked=n_samples, drawn=got.shape[0], draws=got.shape[0],
                                rounds=1, why=None if got.shape[0] else SHORT_EMPTY)  # fmt: skip
            else:
                got, st = sample_query(
                    self.index_,
                    self.point_buckets_,
                    self.points_,
                    Q[i],
                    QB[i],
                    n_samples,
                    sampler,
                    mode,
                    radius,
                    c,
                    rng,
                    max_outliers,
                    failure_prob,
                    path=path,
                    complete=complete,
                    hood=cand,
                    exclude=int(own[i]),
                )
            rows[i, : got.shape[0]] = got
            counts[i] = got.shape[0]
            short = short or got.shape[0] < n_samples
            stats.append(st)
        ids = self.ids_[rows]
        if short:
            ids[rows < 0] = -1
        return SampleResult(
            ids=ids, rows=rows, counts=counts, neighbourhood_sizes=sizes, stats=stats
        )

    def neighbourhood(
        self, *, query_rows=None, queries=None, radius: float, mode: str = MODE.default,
        c: float = C.default, include_query: bool = False,
    ) -> list[np.ndarray]:  # fmt: skip
        """Rows of each query's found neighbourhood M(q) (union of its buckets, by mode): the
        points :meth:`sample` draws from, without a query row's own row unless
        ``include_query``."""
        self._check_fitted()
        radius = check_positive_float(radius, "radius", "FairNN.neighbourhood")
        mode = MODE.check(mode, "FairNN.neighbourhood")
        Q, QB = self._resolve_queries(queries, query_rows, self.scale_for(radius))
        own = self._own_rows(query_rows, include_query, Q.shape[0], "FairNN.neighbourhood")
        return [
            neighbourhood(self.index_, self.points_, Q[i], QB[i], mode, radius, c, int(own[i]))
            for i in range(Q.shape[0])
        ]

    @staticmethod
    def _own_rows(query_rows, include_query: bool, n_queries: int, owner: str) -> np.ndarray:
        """The row each query leaves out of its neighbourhood (-1: none), once the queries are
        valid: its own, for a query by row unless ``include_query``."""
        if not isinstance(include_query, (bool, np.bool_)):
            raise FairpipeInputError(
                f"The 'include_query' parameter of {owner} must be a bool. Got {include_query!r}."
            )
        if query_rows is None:
            if include_query:
                raise FairpipeInputError(INCLUDE_QUERY_BY_VALUE.format(owner=owner))
            return np.full(n_queries, -1, dtype=np.int64)
        if include_query:
            return np.full(n_queries, -1, dtype=np.int64)
        return np.atleast_1d(np.asarray(query_rows, dtype=np.int64)).reshape(-1)
