"""Fairness measured on the truth: the true ball B(q, r) by brute force, the share of it the index
finds (coverage), and TV to uniform on it, checked statistically with stated false-failure rates.

The data: 10,000 points in 24 dimensions, 4 Gaussian clusters; 10 query rows; r = 5.6, where the
balls hold 47-645 points. Every index here is a ``FairNN`` in memory with explicit k, L, w.

Why the bounds hold (each test names the part it uses):

- Coverage. E2LSH with width w puts two points at distance t in the same bucket of one function
  with probability p(t) = 1 - 2 Phi(-w/t) - 2 t / (sqrt(2 pi) w) (1 - exp(-w^2 / (2 t^2))),
  decreasing in t, and the L tables of k functions are drawn independently, so a point of
  B(q, r) is missing from M(q) with probability at most eps = (1 - p(r)^k)^L. The expected
  share of a ball that is missed is then at most eps; misses of different points share the hash
  functions, so only Markov's inequality applies: P(miss share of one query > 0.1) <= 10 eps and
  P(mean miss share over Q queries > 0.01) <= 100 eps.
- TV on B(q, r). Given the index, the exact sampler's draws for a query are independent and
  uniform on M(q) (the claim under test), so E[TV on B] is exactly
  ``expected_tv_on_ball(|M|, |B|, N)``: about (1 - coverage) plus the noise floor. One draw moves
  the mean over queries of the TV by at most 1 / (Q N_q), so by McDiarmid's inequality the mean
  lies within ``tv_margin(N, alpha)`` of its expectation on each side, but with probability
  alpha.
"""

import math

import numpy as np
import pytest
from scipy.stats import norm

from fairpipe import FairNN
from fairpipe.neighbors import (
    coverage,
    evaluate_tv,
    expected_tv_on_ball,
    noise_floor,
    true_ball,
    true_balls,
    tv_margin,
    tv_to_uniform,
)

RADIUS = 5.6
PER_POINT = 100  # S = 100 |B(q, r)| draws per query
TV_TARGET = 1.5 * noise_floor(PER_POINT)  # the benchmark's target on B(q, r), 0.0598
ALPHA_TV = 5e-4  # each side of each TV check


def e2lsh_collision(distance: float, width: float) -> float:
    """P(two points at ``distance`` share the bucket of one E2LSH function of ``width``)."""
    u = width / distance
    return 1 - 2 * norm.cdf(-u) - 2 / (math.sqrt(2 * math.pi) * u) * (1 - math.exp(-u * u / 2))


def miss_probability(distance: float, k: int, tables: int, width: float) -> float:
    """P(a point at ``distance`` of the query is in none of its L buckets)."""
    return (1 - e2lsh_collision(distance, width) ** k) ** tables


@pytest.fixture(scope="module")
def clusters():
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(4, 24))
    X = (centres[rng.integers(0, 4, size=10_000)] + rng.normal(size=(10_000, 24))).astype(
        np.float32
    )
    queries = np.random.default_rng(1).choice(X.shape[0], size=10, replace=False)
    return X, queries


def test_true_balls_are_the_brute_force_balls_whatever_the_chunking(clusters):
    X, queries = clusters
    alive = np.ones(X.shape[0], bool)
    alive[::7] = False
    direct = [np.flatnonzero(np.linalg.norm(X - X[q], axis=1) <= RADIUS) for q in queries]
    for chunk_rows in (1_000, 4_096, 1 << 16):
        got = true_balls(X, X[queries], RADIUS, chunk_rows=chunk_rows)
        # float32 here, float64 in np.linalg.norm: they may differ only at the boundary.
        for g, d in zip(got, direct):
            assert np.setxor1d(g, d).size <= 1 and 40 <= g.size == np.unique(g).size
        dead = true_balls(X, X[queries], RADIUS, alive=alive, chunk_rows=chunk_rows)
        assert all(np.array_equal(a, g[alive[g]]) for a, g in zip(dead, got))
    assert np.array_equal(true_ball(X, X[queries[0]], RADIUS), got[0])


def test_the_index_in_exact_mode_finds_only_points_of_the_true_ball(clusters):
    X, queries = clusters
    nn = FairNN(n_hashes=8, n_tables=12, bucket_width=3.0 * RADIUS, seed=3).fit(X)
    for q, B in zip(queries, true_balls(X, X[queries], RADIUS)):
        M = nn.neighbourhood(query_rows=[q], radius=RADIUS, mode="exact")[0]
        assert np.isin(M, B).all() and coverage(M, B) == M.size / B.size


def test_coverage_and_the_expected_tv_of_a_sampler_uniform_on_part_of_the_ball():
    assert coverage(np.array([3, 1, 99]), np.array([1, 2, 3, 4])) == 0.5
    assert math.isnan(coverage(np.array([1]), np.array([], dtype=np.int64)))
    assert expected_tv_on_ball(0, 10, 1000) == 1.0
    # A sampler uniform on the whole ball: the noise floor, times sqrt(1 - 1/|B|) (finite |B|).
    for b in (50, 400):
        floor = noise_floor(PER_POINT) * math.sqrt(1 - 1 / b)
        assert expected_tv_on_ball(b, b, PER_POINT * b) == pytest.approx(floor, rel=0.01)
    # A fifth of the ball never drawn: at least 0.2, and the noise adds little more.
    assert 0.2 <= expected_tv_on_ball(400, 500, PER_POINT * 500) <= 0.2 + 0.01


def test_an_index_at_high_recall_keeps_the_promise_on_the_true_ball(clusters):
    """k = 6, L = 45, w = 4r: eps = (1 - p(r)^6)^45 <= 2.5e-6. The assertions fail with
    probability at most 200 eps + 2 ALPHA_TV <= 1.5e-3: a query below 0.9 (10 eps per query,
    100 eps for 10), a mean miss share above 0.01 (100 eps), or the mean TV on B(q, r) farther
    than the McDiarmid margin from its expectation (ALPHA_TV each side). Outside those events the
    mean coverage is >= 0.99 and the mean TV on B(q, r) at most its expectation (<= 0.01 + the
    noise floor) plus the margin: below 1.5 x the noise floor."""
    X, queries = clusters
    k, tables, width = 6, 45, 4.0 * RADIUS
    eps = miss_probability(RADIUS, k, tables, width)
    assert eps <= 2.5e-6
    nn = FairNN(n_hashes=k, n_tables=tables, bucket_width=width, seed=3).fit(X)
    ev = evaluate_tv(nn, queries, RADIUS, per_point=PER_POINT, samplers=("exact",), seed=7)
    assert ev["queries"] == 10 and ev["methods"]["exact"]["drawn"] == PER_POINT * sum(
        ev["ball_sizes"]
    )
    assert ev["mean_coverage"] >= 0.95 and ev["min_coverage"] >= 0.9
    tv_ball = ev["methods"]["exact"]["tv_ball"]
    margin = tv_margin(PER_POINT * np.array(ev["ball_sizes"]), ALPHA_TV)
    assert abs(tv_ball - ev["expected_tv_ball"]) <= margin
    assert tv_ball <= TV_TARGET


def test_an_index_that_misses_people_shows_it_in_coverage_and_tv_on_the_ball(clusters):
    """k = 8, L = 12, w = 3r: this index finds 71% of the balls (a point at distance r is
    missed with probability 0.35). The sampler is still uniform on M(q), so TV on M(q) is at the
    noise floor, while TV on B(q, r) is (1 - coverage) plus noise: never below 1 - coverage (the
    draws put no mass on B(q, r) outside M(q)), and within the McDiarmid margin of
    ``expected_tv_on_ball`` (false-failure rate 2 ALPHA_TV = 1e-3). TV on M(q) exceeds 1.5 x
    the floor with probability below 1e-10 (McDiarmid again, 0.02 above its expectation)."""
    X, queries = clusters
    nn = FairNN(n_hashes=8, n_tables=12, bucket_width=3.0 * RADIUS, seed=3).fit(X)
    ev = evaluate_tv(nn, queries, RADIUS, per_point=PER_POINT, samplers=("exact",), seed=7)
    exact = ev["methods"]["exact"]
    balls = np.array(ev["ball_sizes"])
    assert ev["mean_coverage"] < 0.9  # these seeds' index: the case this test is about
    assert exact["tv_ball"] >= 1 - ev["mean_coverage"]
    assert abs(exact["tv_ball"] - ev["expected_tv_ball"]) <= tv_margin(PER_POINT * balls, ALPHA_TV)
    assert exact["tv_ball"] > TV_TARGET and exact["tv"] < 1.5 * noise_floor(PER_POINT)


def test_a_sampler_uniform_on_nine_tenths_of_each_ball_fails_the_target(clusters):
    """The check's power against the failure it is for: one person in ten never drawn. Its
    expected mean TV on B(q, r) is above 0.1; it falls to the target 0.0598 with probability
    below exp(-2 (0.04)^2 / sum c^2) (McDiarmid), less than 1e-100 here."""
    X, queries = clusters
    rng = np.random.default_rng(5)
    balls = true_balls(X, X[queries], RADIUS)
    tvs = []
    for B in balls:
        kept = B[rng.permutation(B.size)[: int(0.9 * B.size)]]
        tvs.append(tv_to_uniform(rng.choice(kept, size=PER_POINT * B.size), B))
    expected = np.mean([expected_tv_on_ball(int(0.9 * b.size), b.size, PER_POINT * b.size)
                        for b in balls])  # fmt: skip
    assert expected > 0.1
    assert np.mean(tvs) > TV_TARGET
