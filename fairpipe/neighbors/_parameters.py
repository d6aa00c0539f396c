"""E2LSH's parameters k, L and w chosen for a target recall at the query radius r.

The promise of the fair samplers is about the ball B(q, r): every point within r of the query is
equally likely. They draw from M(q), the points in at least one of the query's L buckets, so a
point of B(q, r) missing from M(q) is never drawn. This module chooses the parameters so that a
point at distance r is in M(q) with at least a target probability (the recall), at the least
expected cost per query.

The model
---------
One E2LSH function ``floor((a . x + b) / w)`` (``a ~ N(0, I)``, ``b ~ U[0, w)``) puts two points
at distance d in the same cell with probability (Datar, Immorlica, Indyk, Mirrokni 2004, section
3.2; ``a . (x - y)`` is ``d`` times a standard normal, and the cells' offset makes a difference t
collide with probability ``1 - t / w``), with ``u = d / w``,

    p(u) = 1 - 2 Phi(-1/u) - (2 u / sqrt(2 pi)) (1 - exp(-1 / (2 u^2))),

(:func:`collision_probability`; tested against the empirical collision rate of
:class:`~fairpipe.neighbors.E2LSH` itself). A table concatenates k functions: the point shares
the query's bucket in one table with probability ``p^k``, and is in M(q) (at least one of L
tables) with probability

    P(d) = 1 - (1 - p(d / w)^k)^L.

The recall at r is P(r) (:func:`lsh_recall`); nearer points have more (p falls with d), so the
mean coverage |M(q) & B(q, r)| / |B(q, r)| is at least P(r) in expectation.

A query reads one index segment per table and computes distances on its candidates (the union
M of its L buckets; the query itself is one). Its expected cost, in units of one candidate, is

    cost = table_cost * L + E|M|,   E|M| = 1 + (n - 1) * mean over pairs of P(d),

with the mean over the pairwise distances of a sample of the data (:class:`DistanceProfile`:
the width sample of ingest, 2,000 rows chosen by a hash of (seed, id)), scaled to the n rows of
the index. ``table_cost`` (default 100) is what reading a table's segment costs against one
candidate's distance, measured at 200,000 x 128 (16 Gaussian clusters, 5 stores with L from 7
to 107): a fresh reader pays 0.46 ms a table and 0.93 us a candidate (490 candidates a table);
with its segments cached, 0.08 ms and 1.2 us (65); the in-memory ``FairNN`` reads a table for
the price of a few candidates. 100 weighs the warm reads, the ones a long-lived reader makes.

The search
----------
Over the grid k = 1..32 and w / r = 2^(j / 16), j = 0..64 (1 to 16), each (k, w) takes the least
L with P(r) >= the target, ``ceil(log(1 - target) / log(1 - p(r / w)^k))``; it is kept if
L <= ``max_tables`` and the projections fit (d k L <= 2^27, :func:`check_projection_size`).
The least cost wins; costs within 1e-9 of each other are a tie, won by the smaller L, then the
smaller k, then the smaller w. A parameter given (``n_hashes``, ``n_tables`` or
``bucket_width``) fixes its axis of the grid: the search fills in the others.

``max_tables`` defaults to 200 (:data:`MAX_CHOSEN_TABLES`): the index keeps every row in every
table (a packed entry of 4-8 bytes: 430 bytes a row at L = 100 and 200,000 rows), and ingest
hashes k L functions a row, so L = 200 doubles the index of the k = 15, L = 100 of the paper's
experiments; beyond it, a longer w with a shorter k serves the same recall with fewer tables.
Give L explicitly (``--n-tables``, up to 65,535) to go beyond it.

Determinism: the choice depends on the sample, the radius and n only, and the sample on the data
and the seed. The radius (the median nearest-neighbour distance in the sample) does not depend
on the machine (each nearest pair's distance is summed again from its coordinates, in order,
not by BLAS: :func:`~fairpipe.neighbors._bucket_width.nearest_distances`); the
profile's other distances come from one matrix product, whose last bits may differ between
machines: that moves a pair to a neighbouring bin (1/64 of an octave) only where its distance
lies within about 1e-7 of a bin edge, and changes the choice only where two grid points' costs
tie to within that.

>>> rng = np.random.default_rng(0)
>>> centres = 8 * rng.normal(size=(4, 16))
>>> X = (rng.normal(size=(6000, 16)) + centres[rng.integers(4, size=6000)]).astype(np.float32)
>>> choice = choose_lsh_parameters(X, recall=0.95)
>>> choice.n_hashes, choice.n_tables, round(choice.bucket_width / choice.radius, 2)
(6, 3, 10.83)
>>> round(choice.expected_recall, 4), round(lsh_recall(choice.radius, 15, 100, 3.2 * choice.radius), 3)
(0.9501, 0.745)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from fairpipe.errors import (
    FairpipeInputError,
    check_int_range,
    check_open_unit,
    check_positive_float,
    check_positive_int,
    check_seed,
)
from fairpipe.neighbors._bucket_width import (
    WIDTH_SAMPLE,
    nearest_distances,
    suggested_radius,
    width_sample_rows,
)
from fairpipe.neighbors._lsh import MAX_PROJECTION_VALUES, check_projection_size
from fairpipe.settings import MAX_TABLES
from fairpipe.validation import check_points

DEFAULT_RECALL = 0.98
MAX_CHOSEN_TABLES = 200
TABLE_COST = 100.0
K_GRID = tuple(range(1, 33))
WIDTH_RATIOS = tuple(2.0 ** (j / 16) for j in range(65))  # w / r from 1 to 16
BINS_PER_OCTAVE = 64
TIE = 1e-9

OWNER = "choose_lsh_parameters"
NEEDS_TABLES = (
    "A recall of {recall} at radius {radius}{fixed} needs {needed} tables; at most "
    "'max_tables' = {limit} are chosen (the index keeps an entry per row and table). Lower the "
    "recall, or give 'n_tables'."
)
FIXED_TABLES = (
    "A recall of {recall} at radius {radius} is out of reach with 'n_tables' = {tables}{fixed}: "
    "the best k and w give {best}. Lower the recall, or give more tables."
)
EMPTY_BALLS = (
    "No two of the {rows} sampled rows are within 'radius' {radius} of each other (the closest "
    "pair is {closest} apart): every query's ball would be empty. The suggested radius (the "
    "median distance to the nearest sampled row) is {suggested}."
)


class UnreachableRecall(FairpipeInputError):
    """No grid point reaches the recall within the limits. Attributes: ``recall``, ``radius``,
    ``needed`` (the fewest tables any grid point needs: inf where none can reach it),
    ``limit`` (``max_tables``), ``fixed`` (the parameters given, by name), ``best`` (with
    ``n_tables`` given: the best recall it allows)."""

    def __init__(self, recall: float, radius: float, needed: float, limit: int, fixed: dict,
                 best: float | None = None):  # fmt: skip
        self.recall, self.radius, self.needed, self.limit = recall, radius, needed, limit
        self.fixed, self.best = fixed, best
        given = [f"{name!r} = {value:.6g}" for name, value in fixed.items() if name != "n_tables"]
        with_given = " with " + " and ".join(given) if given else ""
        if "n_tables" in fixed:
            message = FIXED_TABLES.format(recall=recall, radius=f"{radius:.6g}",
                                          tables=fixed["n_tables"], fixed=with_given,
                                          best=f"{best:.4g}")  # fmt: skip
        else:
            message = NEEDS_TABLES.format(recall=recall, radius=f"{radius:.6g}", fixed=with_given,
                                          needed=self.needed_text(), limit=limit)  # fmt: skip
        super().__init__(message)

    def needed_text(self) -> str:
        return f"L = {int(self.needed)}" if self.needed < 1e15 else "more than 10^15"

    def __reduce__(self):
        return type(self), (self.recall, self.radius, self.needed, self.limit, self.fixed,
                            self.best)  # fmt: skip


class EmptyBalls(FairpipeInputError):
    """No two sampled rows are within the radius. Attributes: ``rows`` (sampled), ``radius``,
    ``closest`` (the closest pair's distance), ``suggested`` (the suggested radius)."""

    def __init__(self, rows: int, radius: float, closest: float, suggested: float):
        self.rows, self.radius, self.closest, self.suggested = rows, radius, closest, suggested
        super().__init__(EMPTY_BALLS.format(rows=rows, radius=f"{radius:.6g}",
                                            closest=f"{closest:.6g}",
                                            suggested=f"{suggested:.6g}"))  # fmt: skip

    def __reduce__(self):
        return type(self), (self.rows, self.radius, self.closest, self.suggested)


def _erfc(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erfc, 1, 1)(x).astype(np.float64)


def collision_probability(distance, bucket_width) -> np.ndarray | float:
    """The probability that one E2LSH function puts two points at ``distance`` in the same
    cell (Datar et al. 2004): ``p(u)`` with ``u = distance / bucket_width``; 1 at distance 0.
    Both broadcast (numpy arrays).

    >>> round(float(collision_probability(1.0, 3.2)), 4)
    0.7508
    """
    u = np.asarray(distance, dtype=np.float64) / np.asarray(bucket_width, dtype=np.float64)
    scalar = u.ndim == 0
    u = np.atleast_1d(u)
    out = np.ones_like(u)
    far = u > 0
    inv = 1.0 / u[far]
    # 2 Phi(-1/u) = erfc(1 / (u sqrt 2))
    out[far] = (1.0 - _erfc(inv / math.sqrt(2.0))
                - 2.0 * u[far] / math.sqrt(2.0 * math.pi) * -np.expm1(-0.5 * inv * inv))  # fmt: skip
    np.clip(out, 0.0, 1.0, out=out)
    return float(out[0]) if scalar else out


def _union_probability(p_table: np.ndarray, n_tables) -> np.ndarray:
    """1 - (1 - p_table)^L, accurate for tiny p_table."""
    with np.errstate(divide="ignore"):
        return -np.expm1(np.asarray(n_tables, dtype=np.float64) * np.log1p(-p_table))


def lsh_recall(distance, n_hashes: int, n_tables: int, bucket_width: float):
    """The probability that a point at ``distance`` from the query shares at least one of its
    ``n_tables`` buckets: ``1 - (1 - p(distance / bucket_width)^n_hashes)^n_tables`` (all four
    broadcast)."""
    p = np.asarray(collision_probability(distance, bucket_width), dtype=np.float64)
    out = _union_probability(p ** np.asarray(n_hashes), np.asarray(n_tables))
    return float(out) if np.ndim(out) == 0 else out


def _tables_needed(p_table: np.ndarray, recall: float) -> np.ndarray:
    """The least L with 1 - (1 - p_table)^L >= recall (inf where p_table is 0)."""
    p_table = np.asarray(p_table, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.ceil(math.log1p(-recall) / np.log1p(-p_table))
    L = np.where(p_table >= 1.0, 1.0, np.where(p_table <= 0.0, np.inf, np.maximum(L, 1.0)))
    # The ceiling of a rounded quotient may fall one short.
    short = np.isfinite(L) & (_union_probability(p_table, L) < recall)
    return L + short


@dataclass(frozen=True)
class DistanceProfile:
    """The pairwise distances of a sample of the data, in bins of 1/64 of an octave.

    ``distances``: each bin's representative distance (its geometric middle; 0 for the pairs of
    identical points); ``counts``: pairs per bin; ``pairs``: all pairs (``rows (rows - 1) / 2``);
    ``closest``: the smallest distance between two rows; ``suggested_radius``: the median
    distance from a row to its nearest other row, ignoring identical ones (the radius
    :func:`~fairpipe.neighbors.estimate_bucket_width` suggests)."""

    distances: np.ndarray
    counts: np.ndarray
    rows: int
    pairs: int
    closest: float
    suggested_radius: float

    @classmethod
    def of(cls, sample: np.ndarray) -> DistanceProfile:
        """The profile of the rows of ``sample`` (all their pairs: keep it to a few thousand
        rows; :func:`choose_lsh_parameters` takes the width sample)."""
        S = np.asarray(sample, dtype=np.float64)
        m = S.shape[0]
        if m < 2:  # no pairs: every point's only candidate is itself
            return cls(distances=np.zeros(0), counts=np.zeros(0, np.int64), rows=m, pairs=0,
                       closest=math.inf, suggested_radius=1.0)  # fmt: skip
        nn, d2 = nearest_distances(S)
        upper = d2[np.triu_indices(m, 1)]
        np.maximum(upper, 0.0, out=upper)
        dist = np.sqrt(upper)
        zero = dist <= 0
        with np.errstate(divide="ignore"):
            level = np.floor(np.log2(dist[~zero]) * BINS_PER_OCTAVE).astype(np.int64)
        bins, counts = np.unique(level, return_counts=True)
        distances = 2.0 ** ((bins + 0.5) / BINS_PER_OCTAVE)
        if zero.any():
            distances = np.concatenate([[0.0], distances])
            counts = np.concatenate([[int(zero.sum())], counts])
        return cls(distances=distances, counts=counts.astype(np.int64), rows=m,
                   pairs=m * (m - 1) // 2, closest=float(nn.min()),
                   suggested_radius=suggested_radius(nn))  # fmt: skip

    def expected_candidates(self, n_rows: int, n_hashes: int, n_tables: int,
                            bucket_width: float) -> float:  # fmt: skip
        """E|M(q)| for a query among ``n_rows`` rows: itself plus (n - 1) times the mean of
        P(d) over the sample's pairs."""
        if not self.pairs:
            return 1.0
        P = lsh_recall(self.distances, n_hashes, n_tables, bucket_width)
        return 1.0 + (n_rows - 1) * float(np.dot(self.counts, P)) / self.pairs


@dataclass(frozen=True)
class LSHChoice:
    """E2LSH parameters with what they promise at ``radius``: ``expected_recall`` (the
    probability that a point at distance r is in M(q)), ``expected_candidates`` (E|M(q)| over
    ``n_rows`` rows) and ``cost`` (``table_cost * n_tables + expected_candidates``, in units of
    one candidate's distance); ``recall_target`` is the recall they were chosen for.
    ``FairNN(**choice.lsh_params(), seed=...)`` uses them."""

    n_hashes: int
    n_tables: int
    bucket_width: float
    radius: float
    recall_target: float
    expected_recall: float
    expected_candidates: float
    cost: float
    n_rows: int

    def lsh_params(self) -> dict:
        """The parameters :class:`~fairpipe.neighbors.FairNN` and ``E2LSH`` take."""
        return {"n_hashes": self.n_hashes, "n_tables": self.n_tables,
                "bucket_width": self.bucket_width}  # fmt: skip

    def to_dict(self) -> dict:
        return asdict(self)


def choose_lsh_parameters(
    X: np.ndarray | DistanceProfile,
    radius: float | None = None,
    recall: float = DEFAULT_RECALL,
    *,
    n_rows: int | None = None,
    ids: np.ndarray | None = None,
    seed: int = 0,
    n_hashes: int | None = None,
    n_tables: int | None = None,
    bucket_width: float | None = None,
    max_tables: int = MAX_CHOSEN_TABLES,
    table_cost: float = TABLE_COST,
    n_features: int | None = None,
) -> LSHChoice:
    """E2LSH parameters giving at least ``recall`` at ``radius`` at the least expected cost
    per query (the model and the grid: the module docstring).

    ``X``: the data (a matrix: more than 2,000 rows are sampled by a hash of (``seed``,
    ``ids``), as ingest samples them), or a :class:`DistanceProfile` of a sample of it.
    ``radius``: the query radius r (default: the sample's median nearest-neighbour distance).
    ``n_rows``: the rows the index holds (default: the rows of ``X``; give it where ``X`` is a
    sample or a profile). ``n_hashes``, ``n_tables``, ``bucket_width``: fixed where given.
    ``max_tables``: the most tables the search may choose. ``n_features``: the dimension,
    for the projections' size limit (default: the columns of ``X``).

    Raises ``FairpipeInputError`` where no grid point reaches the recall within the limits
    (the message says how many tables it would need), or where no two sampled rows are within
    the radius (every query's ball would be empty).
    """
    recall = check_open_unit(recall, "recall", OWNER)
    max_tables = check_int_range(max_tables, "max_tables", OWNER, 1, MAX_TABLES)
    table_cost = float(table_cost)
    if not math.isfinite(table_cost) or table_cost < 0:
        raise FairpipeInputError(
            f"The 'table_cost' parameter of {OWNER} must be a number >= 0. Got {table_cost}."
        )
    if n_hashes is not None:
        n_hashes = check_positive_int(n_hashes, "n_hashes", OWNER)
    if n_tables is not None:
        n_tables = check_int_range(n_tables, "n_tables", OWNER, 1, MAX_TABLES)
    if bucket_width is not None:
        bucket_width = check_positive_float(bucket_width, "bucket_width", OWNER)
    if isinstance(X, DistanceProfile):
        profile = X
        if n_rows is None:
            n_rows = profile.rows
    else:
        points = check_points(X, where=f"the points given to {OWNER}")
        if n_rows is None:
            n_rows = points.shape[0]
        if ids is not None and np.shape(ids) != (points.shape[0],):
            raise FairpipeInputError(
                f"{OWNER} needs one id per row of X ({points.shape[0]}). Got shape {np.shape(ids)}."
            )
        if n_features is None:
            n_features = points.shape[1]
        if points.shape[0] > WIDTH_SAMPLE:
            row_ids = np.arange(points.shape[0], dtype=np.int64) if ids is None else ids
            points = points[width_sample_rows(row_ids, check_seed(seed, "seed", OWNER))]
        profile = DistanceProfile.of(points)
    n_rows = check_positive_int(n_rows, "n_rows", OWNER)
    r = (
        profile.suggested_radius
        if radius is None
        else check_positive_float(radius, "radius", OWNER)
    )
    if profile.pairs and profile.closest > r:
        raise EmptyBalls(profile.rows, r, profile.closest, profile.suggested_radius)
    return _search(profile, r, recall, n_rows, n_hashes, n_tables, bucket_width, max_tables,
                   table_cost, n_features)  # fmt: skip


def _search(profile, r, recall, n_rows, n_hashes, n_tables, bucket_width, max_tables,
            table_cost, n_features) -> LSHChoice:  # fmt: skip
    ks = np.array(K_GRID if n_hashes is None else (n_hashes,), dtype=np.int64)
    ratios = np.array(WIDTH_RATIOS if bucket_width is None else (bucket_width / r,))
    widths = ratios * r
    p_r = collision_probability(r, widths)  # (W,) one function's probability at r
    p_r = np.atleast_1d(p_r)
    # One function's probability at every profile distance, for every width: (W, bins).
    p_d = np.atleast_2d(collision_probability(profile.distances[None, :], widths[:, None]))
    best: tuple | None = None
    needed_best, needed_k = math.inf, 0  # the fewest tables any grid point needs (the error)
    best_fixed = 0.0
    weights = profile.counts / max(profile.pairs, 1)
    for k in ks:
        p_table = p_r ** int(k)
        if n_tables is None:
            L = _tables_needed(p_table, recall)
        else:
            L = np.full(ratios.shape, float(n_tables))
            got = _union_probability(p_table, L)
            best_fixed = max(best_fixed, float(got.max()))
            L[got < recall] = np.inf
        fits = np.isfinite(L)
        if fits.any() and float(L[fits].min()) < needed_best:
            needed_best, needed_k = float(L[fits].min()), int(k)
        if n_features is not None:
            fits &= n_features * int(k) * np.where(fits, L, 0) <= MAX_PROJECTION_VALUES
        ok = fits & (L <= max_tables) if n_tables is None else fits  # a given L is kept
        if not ok.any():
            continue
        cand = 1.0 + (n_rows - 1) * (
            _union_probability(p_d[ok] ** int(k), L[ok][:, None]) @ weights
        )
        cost = table_cost * L[ok] + cand
        for j, c, e, tables in zip(np.flatnonzero(ok), cost, cand, L[ok]):
            key = (float(c), int(tables), int(k), int(j))
            if best is None or _better(key, best[0]):
                best = (key, float(e), float(widths[j]))
    if best is None:
        if n_features is not None and n_tables is None and needed_best <= max_tables:
            check_projection_size(n_features, needed_k, int(needed_best))  # what stood in the way
        given = {"n_hashes": n_hashes, "n_tables": n_tables, "bucket_width": bucket_width}
        fixed = {name: value for name, value in given.items() if value is not None}
        raise UnreachableRecall(recall, r, needed_best, max_tables, fixed,
                                best_fixed if n_tables is not None else None)  # fmt: skip
    (cost, tables, k, j), cand, width = best
    return LSHChoice(n_hashes=k, n_tables=tables, bucket_width=width, radius=float(r),
                     recall_target=float(recall),
                     expected_recall=float(lsh_recall(r, k, tables, width)),
                     expected_candidates=cand, cost=cost, n_rows=int(n_rows))  # fmt: skip


def _better(key: tuple, than: tuple) -> bool:
    """Whether grid point ``key`` (cost, L, k, width index) beats ``than``: a lower cost,
    or a tie (within TIE) won by the smaller L, k, width in that order."""
    if key[0] < than[0] * (1 - TIE):
        return True
    if key[0] > than[0] * (1 + TIE):
        return False
    return key[1:] < than[1:]


# The default largest radius of an index's scales, in units of its radius.
MAX_RADIUS_FACTOR = 4.0
MAX_BELOW_RADIUS = (
    "The 'max_radius' parameter of {owner} must be at least the radius {radius}. Got {max_radius}."
)


class MaxBelowRadius(FairpipeInputError):
    """A largest radius below the index's radius (attributes ``max_radius``, ``radius``)."""

    def __init__(self, max_radius: float, radius: float, owner: str = "choose_scales"):
        super().__init__(MAX_BELOW_RADIUS.format(owner=owner, max_radius=f"{max_radius:.6g}",
                                                 radius=f"{radius:.6g}"))  # fmt: skip
        self.max_radius, self.radius = max_radius, radius

    def __reduce__(self):
        return type(self), (self.max_radius, self.radius)


def scale_radii(radius: float, max_radius: float) -> list[float]:
    """The radii of an index's scales from ``radius`` to ``max_radius``: evenly spaced in
    log, each under twice the one before (4 r: r, 2 r, 4 r).

    >>> scale_radii(1.0, 4.0), round(scale_radii(1.0, 3.0)[1] ** 2, 12), scale_radii(2.0, 2.0)
    ([1.0, 2.0, 4.0], 3.0, [2.0])
    """
    if max_radius < radius * (1 - 1e-12):
        raise MaxBelowRadius(max_radius, radius)
    steps = max(0, math.ceil(math.log2(max_radius / radius) - 1e-9))
    if steps == 0:
        return [float(radius)]
    ratio = (max_radius / radius) ** (1.0 / steps)
    return [float(radius * ratio**j) for j in range(steps)] + [float(max_radius)]


def choose_scales(
    X: np.ndarray | DistanceProfile,
    radius: float | None = None,
    recall: float = DEFAULT_RECALL,
    *,
    max_radius: float | None = None,
    n_rows: int | None = None,
    n_hashes: int | None = None,
    max_tables: int = MAX_CHOSEN_TABLES,
    n_features: int | None = None,
) -> list[LSHChoice]:
    """E2LSH parameters for each scale of an index answering every radius up to
    ``max_radius`` (default ``MAX_RADIUS_FACTOR`` times the radius) with at least ``recall``:
    one :class:`LSHChoice` per radius of :func:`scale_radii`, each at the least expected cost
    for its radius (:func:`choose_lsh_parameters`), all with the first's ``n_hashes`` (the
    scales share the hash functions' multipliers). ``max_tables`` holds for each scale; the
    projections of all (``d k L`` summed) must fit (:func:`check_projection_size`)."""
    if not isinstance(X, DistanceProfile):
        points = check_points(X, where=f"the points given to {OWNER}")
        n_rows = points.shape[0] if n_rows is None else n_rows
        n_features = points.shape[1] if n_features is None else n_features
        if points.shape[0] > WIDTH_SAMPLE:  # the rows choose_lsh_parameters samples (seed 0)
            points = points[width_sample_rows(np.arange(points.shape[0], dtype=np.int64), 0)]
        X = DistanceProfile.of(points)
    first = choose_lsh_parameters(X, radius, recall, n_rows=n_rows, n_hashes=n_hashes,
                                  max_tables=max_tables, n_features=n_features)  # fmt: skip
    top = (first.radius * MAX_RADIUS_FACTOR if max_radius is None
           else check_positive_float(max_radius, "max_radius", "choose_scales"))  # fmt: skip
    out = [first, *scales_above(X, first.radius, top, recall, n_rows=n_rows,
                                n_hashes=first.n_hashes, max_tables=max_tables,
                                n_features=n_features)]  # fmt: skip
    if n_features is not None:
        check_projection_size(n_features, first.n_hashes, sum(c.n_tables for c in out))
    return out


def scales_above(profile: DistanceProfile, radius: float, max_radius: float, recall: float, *,
                 n_rows: int | None, n_hashes: int, max_tables: int = MAX_CHOSEN_TABLES,
                 n_features: int | None = None) -> list[LSHChoice]:  # fmt: skip
    """The scales of an index above its scale of ``radius``, up to ``max_radius``: one
    :func:`choose_lsh_parameters` choice with ``n_hashes`` for each radius of
    :func:`scale_radii` but the first (what :func:`choose_scales` adds to its first scale, and
    what a store extended to a larger radius adds to its own)."""
    return [choose_lsh_parameters(profile, r, recall, n_rows=n_rows, n_hashes=n_hashes,
                                  max_tables=max_tables, n_features=n_features)
            for r in scale_radii(radius, max_radius)[1:]]  # fmt: skip


def max_radius_of(lsh: Mapping) -> float | None:
    """The largest radius a store's ``lsh`` record keeps its recall target at: its
    ``max_radius``, or the ``radius`` of a store made before scales (one scale); None where it
    records neither."""
    top = lsh.get("max_radius", lsh.get("radius"))
    return None if top is None else float(top)


def scales_params(choices: list[LSHChoice]) -> dict:
    """The parameters :class:`~fairpipe.neighbors.FairNN` and ``E2LSH`` take for an index of
    the scales ``choices`` (:func:`choose_scales`): ``n_hashes``, ``n_tables`` (all scales'),
    the first scale's ``bucket_width``, and ``scales`` (``()`` for one scale)."""
    first = choices[0]
    scales = tuple((c.radius, c.bucket_width, c.n_tables) for c in choices)
    return {"n_hashes": first.n_hashes, "n_tables": sum(c.n_tables for c in choices),
            "bucket_width": first.bucket_width, "scales": scales if len(scales) > 1 else ()}  # fmt: skip
