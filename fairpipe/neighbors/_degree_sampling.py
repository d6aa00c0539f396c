"""Fair (and deliberately unfair) sampling from the union of a query's LSH buckets.

Har-Peled & Mahabadi, "Near Neighbor: Who is the Fairest of Them All?" (NeurIPS 2019):

- ``uniform``: a bucket uniformly, then a point uniformly in it (biased toward small buckets).
- ``weighted``: a bucket with probability size/m, then a point uniformly (p drawn w.p. d(p)/m).
- ``exact``: weighted, then accept p with probability 1/d(p) (Lemma 3.1): uniform on the union.
- ``approx``: weighted, then probe the query's buckets uniformly with replacement until one holds p;
  after i probes accept with probability i / (g * Delta), reject after g * Delta probes, where
  Delta = ceil(ln(1 / failure_prob)) + 4 (Section 3.4, Lemmas 3.6-3.7; the paper's gamma).
  E[i] = g / d(p), so acceptance is proportional to 1/d(p); the papers' experiment code used
  1 / (L // i) instead, which is biased.

The sampler (which point of the union) is independent of the neighbourhood mode (which points
count as neighbours): ``buckets`` (every bucket-mate), ``approximate`` (points farther than c*r are
outliers: when one is drawn it is removed from that bucket's active prefix, as in Section 3.5),
``exact`` (as approximate, then outputs farther than r are rejected, Lemma 4.9). When more than
``max_outliers`` outliers are met, the query's buckets are filtered by distance in one pass (the
state Section 3.5's removals would converge to) instead of failing; the result reports it.

Many samples of one query: the ``exact`` sampler's output is uniform on M(q), so once the
rejection draws would cost more than reading the query's buckets, M(q) is enumerated once (the
union of the buckets, filtered by the mode's distance rule) and the samples are drawn uniformly
from it, with replacement: the same distribution, with no rejection. A query never returns
fewer samples than asked without saying why (:class:`QueryStats`): its neighbourhood is empty,
or its draws reached a limit set from its acceptance rate (:func:`draw_limit`), far beyond what
a request that can be met needs.

The kernel here works on one query and vectorises over its draws; ``FairNN`` validates inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fairpipe.neighbors._query_buckets import (
    FlatBuckets,
    QueryBuckets,
    _filter_all_outliers,
    _flatten,
    _members_at,
    _remove_outliers,
    degree_of,
    enumerate_neighbourhood,
    query_buckets,
    sq_distances,
    squared,
)

PATHS = ("auto", "lazy", "flat", "enumerate")


@dataclass
class QueryStats:
    """What one query's sampling did: the samples ``asked`` and ``drawn`` (fewer only for the
    reason ``why``: :data:`SHORT_EMPTY`, :data:`SHORT_LIMIT`; None when all were drawn), the
    draws made (accepted or not) and its rounds, outliers removed, approx probes; ``extra``:
    ``flattened``, ``enumerated`` and, on the store's lazy path, what it read."""

    asked: int = 0
    drawn: int = 0
    why: str | None = None
    draws: int = 0
    rounds: int = 0
    outliers: int = 0
    outlier_scan: bool = False
    probes: int = 0
    extra: dict = field(default_factory=dict)


def _approx_accept(
    point_buckets,
    rows,
    qb: QueryBuckets,
    failure_prob: float,
    rng: np.random.Generator,
    stats: QueryStats,
) -> np.ndarray:
    g = qb.buckets.shape[0]
    delta = math.ceil(math.log(1.0 / failure_prob)) + 4
    cap = g * delta
    tables = qb.table_columns()
    probes = np.zeros(rows.shape[0], dtype=np.int64)
    found = np.zeros(rows.shape[0], dtype=bool)
    todo = np.arange(rows.shape[0])
    block = max(4, min(64, g))
    while todo.size:
        t = rng.integers(0, g, size=(todo.size, block))
        hit = point_buckets[rows[todo][:, None], tables[t]] == qb.buckets[t]
        first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, block + 1)
        got = first <= block
        found[todo[got]] = True
        probes[todo[got]] += first[got]
        probes[todo[~got]] += block
        todo = todo[~got]
        over = probes[todo] >= cap
        todo = todo[~over]
    stats.probes += int(np.minimum(probes, cap).sum())
    ok = found & (probes <= cap)
    u = rng.random(rows.shape[0])
    return ok & (u * cap < probes)


def sample_query(
    index,
    point_buckets: np.ndarray | None,
    points: np.ndarray,
    query: np.ndarray,
    q_buckets: np.ndarray,
    n_samples: int,
    sampler: str,
    mode: str,
    radius: float,
    c: float,
    rng: np.random.Generator,
    max_outliers: int,
    failure_prob: float = 0.01,
    max_draws: int | None = None,
    path: str = "auto",
    complete: bool = False,
    degrees: np.ndarray | None = None,
    hood: np.ndarray | None = None,
    exclude: int = -1,
) -> tuple[np.ndarray, QueryStats]:
    """Draw ``n_samples`` rows for one query: all of them, unless its neighbourhood is empty
    or the draws reach their limit (:func:`draw_limit`); the stats say which (``asked``,
    ``drawn``, ``why``).

    Draws start lazily (cost per draw independent of the bucket sizes, as in the paper); once a
    query has used as many draws as its buckets hold, it flattens its buckets (:class:`FlatBuckets`)
    and continues from that state: never more than about twice the cheaper of the two costs.
    The ``exact`` sampler enumerates M(q) instead of flattening (:func:`enumerate_neighbourhood`)
    and draws uniformly from it, with no rejection: at once when the draws it expects to need
    (2.2 per sample before any is made, then from its acceptance so far) would cost more than
    enumerating, a draw counted as :data:`DRAW_ENTRIES` of the m entries of its buckets.
    ``path`` forces one way (``lazy``, ``flat``, or, for
    the ``exact`` sampler, ``enumerate``; ``auto`` by default). ``complete``: see
    :func:`query_buckets`. ``degrees`` (each index row's degree in the query's buckets) and
    ``hood`` (M(q), sorted) are what the caller may know already (the store's reader builds an
    index of the query's buckets alone, whose rows' degrees are their counts); then
    ``point_buckets`` is needed by the ``approx`` sampler only.

    ``exclude`` (a row of the index, -1 for none: the query's own row) is never drawn: every
    path rejects it as it rejects a point outside the neighbourhood (the lazy and flat draws),
    or leaves it out of M(q) (the enumeration; ``hood``, when given, must not hold it), so the
    samples are distributed over M(q) without it exactly as they are over M(q) otherwise.
    """
    stats = QueryStats(asked=n_samples)
    qb = query_buckets(index, q_buckets, complete)
    out = np.empty(n_samples, dtype=np.int64)
    filled = 0
    far2 = squared(c * radius)
    near2 = squared(radius)
    rate = 0.5
    total = int(qb.cum[-1]) if qb.cum.shape[0] else 0
    flat: FlatBuckets | None = None
    limit: int | None = None  # draws allowed, known once the acceptance rate is
    absolute = MAX_DRAWS if max_draws is None else max_draws
    if total == 0:
        return out[:0], _finish(stats, 0, SHORT_EMPTY)
    scalar = path != "flat" and mode == "buckets" and sampler in SCALAR_SAMPLERS
    if scalar and n_samples <= SCALAR_SAMPLES and path != "enumerate":
        filled = _draw_scalar(index, qb, point_buckets, q_buckets, degrees, out, sampler, rng,
                              stats, exclude)  # fmt: skip
    enumerable = sampler == "exact" and path in ("auto", "enumerate")
    while filled < n_samples:
        need = n_samples - filled
        if enumerable and (
            path == "enumerate"
            or (stats.draws + _expected_draws(need, filled, stats.draws)) * DRAW_ENTRIES > total
        ):
            if hood is None:
                hood = enumerate_neighbourhood(index, qb, points, query, mode, radius, c)
                if exclude >= 0:
                    hood = hood[hood != exclude]
            stats.extra["enumerated"] = True
            if hood.shape[0] == 0:
                break
            out[filled:] = hood[rng.integers(0, hood.shape[0], size=need)]
            filled = n_samples
            break
        n_draw = int(min(need / max(rate, 1e-4) * 1.1 + 4, 4_000_000))
        if enumerable and stats.draws == 0:
            n_draw = min(n_draw, max(SCALAR_DRAWS, total // 8))  # a probe of the acceptance
        if flat is None and path != "lazy" and (path == "flat" or stats.draws + n_draw > total):
            flat = _flatten(index, qb, points, query, mode, far2, near2, exclude)
            stats.outliers = flat.removed
            stats.extra["flattened"] = True
        if limit is None and (flat is not None or stats.draws >= total):
            # The draws a query may make follow its acceptance rate (that of the state the
            # lazy path converges to, for the active entries it still draws from).
            state = flat or _flatten(index, qb, points, query, mode, far2, near2, exclude)
            accept = acceptance(state, qb.buckets.shape[0], sampler, failure_prob)
            if flat is None:
                accept *= state.rows.shape[0] / max(int(qb.cum[-1]), 1)
            if accept == 0.0:
                break  # M(q) is empty: no draw can be accepted
            rate = accept
            limit = stats.draws + draw_limit(need, accept, absolute - stats.draws)
            n_draw = int(min(need / rate * 1.1 + 4, 4_000_000))
        n_draw = min(n_draw, (absolute if limit is None else limit) - stats.draws)
        if n_draw <= 0:
            return out[:filled], _finish(stats, filled, SHORT_LIMIT)
        m = flat.rows.shape[0] if flat is not None else int(qb.cum[-1])
        if m == 0:
            break
        stats.rounds += 1
        stats.draws += n_draw
        if flat is not None:
            accept_mask, rows = _draw_flat(
                flat, qb, point_buckets, n_draw, sampler, failure_prob, rng, stats
            )
        else:
            accept_mask, rows = _draw_lazy(
                index, qb, point_buckets, degrees, points, query, q_buckets, n_draw, sampler,
                mode, far2, near2, max_outliers, failure_prob, rng, stats, exclude,
            )  # fmt: skip
        got = rows[accept_mask][:need]
        out[filled : filled + got.shape[0]] = got
        filled += got.shape[0]
        if limit is None:
            n_ok = int(np.count_nonzero(accept_mask))
            rate = max(0.5 * rate, n_ok / n_draw) if n_ok else rate / 4
    return out[:filled], _finish(stats, filled, SHORT_EMPTY if filled < n_samples else None)


# Why a query returns fewer samples than asked (``QueryStats.why``).
SHORT_EMPTY = "empty"  # its neighbourhood M(q) is empty: nothing can be drawn
SHORT_LIMIT = "draw_limit"  # its draws reached their limit (:func:`draw_limit`)
# The draws one query may make, at most, whatever it asks (about 10 s of the flat path's draws,
# a few minutes of the approx sampler's probes): only a request whose expected work passes it
# is cut short, and the result says so.
MAX_DRAWS = 2**30
# Draws a query may make beyond what it expects to need: DRAW_SLACK x (samples still needed +
# DRAW_EXTRA) / its acceptance rate. The draws needed are a sum of geometric variables; that many
# fall short of the samples with probability below exp(-36) (Chernoff).
DRAW_SLACK = 4
DRAW_EXTRA = 32


def draw_limit(need: int, accept: float, absolute: int = MAX_DRAWS) -> int:
    """The draws a query still needing ``need`` samples may make, when a draw is accepted with
    probability ``accept``: DRAW_SLACK x (need + DRAW_EXTRA) / accept, at most ``absolute``."""
    return int(min(absolute, math.ceil(DRAW_SLACK * (need + DRAW_EXTRA) / accept)))


def _finish(stats: QueryStats, drawn: int, why: str | None) -> QueryStats:
    stats.drawn = drawn
    stats.why = why
    return stats


def _expected_draws(need: int, accepted: int, draws: int) -> float:
    """The draws the rejection path expects to make for ``need`` more samples: the first round's
    (an acceptance of 1/2 assumed), then from the acceptance so far (below 1/draws while no draw
    was accepted)."""
    if draws == 0:
        return need / 0.5 * 1.1 + 4
    return need * draws / accepted if accepted else need * draws


def acceptance(flat: FlatBuckets, g: int, sampler: str, failure_prob: float) -> float:
    """The probability that one draw from the flattened buckets ``flat`` (of a query with ``g``
    non-empty buckets) is accepted: 0 exactly when its neighbourhood is empty.

    A draw takes an entry (a bucket, then a member: ``uniform``; an entry uniformly: the others)
    and accepts it when its row is near, with probability 1/degree (``exact``) or, for
    ``approx``, E[I; I <= N] / N, where I ~ Geometric(degree / g) is the number of probes and
    N = g * Delta their limit."""
    m = flat.rows.shape[0]
    if m == 0:
        return 0.0
    near = flat.near
    if sampler == "uniform":
        used = flat.counts > 0
        hits = flat.counts if near is None else np.bincount(flat.bucket[near], minlength=g)
        return float((hits[used] / flat.counts[used]).mean())
    if sampler == "exact":
        weight = 1.0 / flat.degree
    elif sampler == "approx":
        cap = g * (math.ceil(math.log(1.0 / failure_prob)) + 4)
        q = flat.degree / g
        r = 1.0 - q
        weight = (1.0 - r**cap * (1.0 + cap * q)) / (q * cap)
    else:
        weight = np.ones(m)
    if near is not None:
        weight = weight * near
    return float(weight.sum() / m)


SCALAR_SAMPLES = 4
SCALAR_DRAWS = 64
# What a rejection draw costs in entries of the query's buckets enumerated (a draw: a member, its
# distance and its degree among L buckets; an entry: a copy, and a share of a unique row's
# distance): about 300 ns against 15-40 ns at 1M x 128, L = 67; 8 leaves the lazy path to
# a few thousand samples or fewer.
DRAW_ENTRIES = 8
SCALAR_SAMPLERS = ("exact", "weighted", "uniform")


def _draw_scalar(
    index,
    qb: QueryBuckets,
    point_buckets,
    q_buckets,
    degrees,
    out,
    sampler,
    rng,
    stats,
    exclude: int = -1,
) -> int:
    """One draw at a time, on Python scalars: a query wanting a few samples (``buckets`` mode).

    A vectorised round costs ~15 numpy calls whatever its size; a single draw here costs ~5 and a
    query needs about the mean degree of its candidates (~1.3 at n=1M) draws per sample. Same
    distributions as the vectorised draws (``uniform``: a bucket, then a member; ``weighted``: an
    entry of the concatenated buckets; ``exact``: then accept with probability 1/degree). Stops
    after ``SCALAR_DRAWS`` draws and leaves what is missing to the vectorised rounds.
    """
    total = float(qb.cum[-1])
    g = qb.size.shape[0]
    filled = 0
    draws = 0
    while filled < out.shape[0] and draws < SCALAR_DRAWS:
        draws += 1
        if sampler == "uniform":
            b = int(rng.random() * g)
            row = index.members[qb.lo[b] + int(rng.random() * qb.size[b])]
            if row == exclude:
                continue
        else:
            v = int(rng.random() * total)
            row = index.members[qb.base[qb.cum.searchsorted(v, side="right")] + v]
            if row == exclude:
                continue
            if sampler == "exact":
                if degrees is not None:
                    degree = int(degrees[row])
                else:
                    degree = int(np.count_nonzero(point_buckets[row] == q_buckets))
                if rng.random() * degree >= 1.0:
                    continue
        out[filled] = row
        filled += 1
    stats.draws += draws
    stats.rounds += 1
    return filled


def _uniform_bucket_draws(sizes: np.ndarray, n_draw: int, rng: np.random.Generator):
    """A non-empty bucket uniformly, then a position uniformly in it (the ``uniform`` sampler)."""
    nonempty = np.flatnonzero(sizes > 0)
    b = nonempty[(rng.random(n_draw) * nonempty.size).astype(np.int64)]
    return b, (rng.random(n_draw) * sizes[b]).astype(np.int64)


def _approx_filter(accept, point_buckets, rows, qb, failure_prob, rng, stats) -> None:
    """Apply the approx acceptance in place, probing only for draws still in the running."""
    live = np.flatnonzero(accept)
    accept[live] = _approx_accept(point_buckets, rows[live], qb, failure_prob, rng, stats)


def _draw_flat(flat: FlatBuckets, qb, point_buckets, n_draw, sampler, failure_prob, rng, stats):
    if sampler == "uniform":
        b, pos = _uniform_bucket_draws(flat.counts, n_draw, rng)
        v = flat.starts[b] + pos
    else:
        v = rng.integers(0, flat.rows.shape[0], size=n_draw)
    rows = flat.rows[v]
    accept = flat.near[v] if flat.near is not None else np.ones(n_draw, dtype=bool)
    if sampler == "exact":
        accept &= rng.random(n_draw) * flat.degree[v] < 1.0
    elif sampler == "approx":
        _approx_filter(accept, point_buckets, rows, qb, failure_prob, rng, stats)
    return accept, rows


def _draw_lazy(
    index, qb, point_buckets, degrees, points, query, q_buckets, n_draw, sampler, mode, far2,
    near2, max_outliers, failure_prob, rng, stats, exclude: int = -1,
):  # fmt: skip
    if sampler == "uniform":
        b, pos = _uniform_bucket_draws(qb.active, n_draw, rng)
        v = pos + (qb.cum[b] - qb.active[b])
    else:
        # Floats scaled to the total: uniform on 0..total-1 up to 2**-53 relative, and several
        # times cheaper than Generator.integers for the few draws a single query needs.
        v = (rng.random(n_draw) * float(qb.cum[-1])).astype(np.int64)
        b = np.searchsorted(qb.cum, v, side="right")
    rows = _members_at(index, qb, b, v)
    accept = None
    if mode != "buckets":
        d2 = sq_distances(points, rows, query, (far2, near2) if mode == "exact" else (far2,))
        outlier = d2 > far2
        accept = ~outlier
        if outlier.any():
            stats.outliers += _remove_outliers(index, qb, b[outlier], rows[outlier])
            if stats.outliers > max_outliers and not stats.outlier_scan:
                _filter_all_outliers(index, qb, points, query, far2)
                stats.outlier_scan = True
        if mode == "exact":
            accept &= d2 <= near2
    if sampler == "exact":
        deg = degrees[rows] if degrees is not None else degree_of(point_buckets, rows, q_buckets)
        ok = rng.random(n_draw) * deg < 1.0
        accept = ok if accept is None else accept & ok
    elif sampler == "approx":
        if accept is None:
            accept = np.ones(n_draw, dtype=bool)
        _approx_filter(accept, point_buckets, rows, qb, failure_prob, rng, stats)
    if exclude >= 0:
        kept = rows != exclude
        accept = kept if accept is None else accept & kept
    return (np.ones(n_draw, dtype=bool) if accept is None else accept), rows
