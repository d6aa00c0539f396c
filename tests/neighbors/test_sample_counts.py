"""Many samples of one query (the enumerate path) and what comes back when a query cannot get
every sample asked: each statistical check with a fixed seed and a stated false-failure rate."""

import numpy as np
import pytest
from scipy import stats

import fairpipe.neighbors._degree_sampling as kernel
import fairpipe.neighbors._query_buckets as buckets
from fairpipe import FairNN, FairpipeInputError
from fairpipe.neighbors import chi_square_uniform
from tests.conftest import skewed_points

ALPHA = 1e-3  # false-failure rate of each statistical test (fixed seeds make it reproducible)


@pytest.fixture(scope="module")
def skewed():
    X = skewed_points()
    nn = FairNN(n_hashes=3, n_tables=12, bucket_width=1.2, seed=4).fit(X)
    return X, nn


@pytest.fixture(scope="module")
def shell():
    """A query with 6 points within r = 1 and 20,000 on a shell at 1.6 r (outside r, inside
    c r = 2 r): in exact mode a draw from the buckets is rarely in M(q), so rejection needs
    thousands of draws a sample."""
    rng = np.random.default_rng(1)
    d = 8
    inner = rng.normal(size=(6, d))
    inner *= (rng.uniform(0.2, 0.9, size=6) / np.linalg.norm(inner, axis=1))[:, None]
    outer = rng.normal(size=(20_000, d))
    outer *= (1.6 / np.linalg.norm(outer, axis=1))[:, None]
    X = np.vstack([np.zeros((1, d)), inner, outer]).astype(np.float32)
    nn = FairNN(n_hashes=2, n_tables=10, bucket_width=8.0, seed=2).fit(X)
    return X, nn


@pytest.mark.parametrize("mode", ["buckets", "approximate", "exact"])
def test_the_enumerate_path_is_uniform_on_the_neighbourhood(skewed, mode):
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[3], radius=0.6, mode=mode, c=1.5)[0]
    assert M.size >= 5
    kw = dict(query_rows=[3], radius=0.6, c=1.5, mode=mode, n_samples=60 * M.size, seed=11,
              path="enumerate")  # fmt: skip
    res = nn.sample(**kw)
    assert res.stats[0].extra["enumerated"] and res.counts[0] == 60 * M.size
    assert set(res.rows[0]) <= set(M)
    chi2, dof = chi_square_uniform(res.rows[0], M)
    assert stats.chi2.sf(chi2, dof) > ALPHA
    assert np.array_equal(nn.sample(**kw).ids, res.ids)  # same seed, same samples


@pytest.mark.parametrize("mode", ["buckets", "exact"])
def test_the_enumerate_path_draws_the_exact_samplers_distribution(skewed, mode):
    """A chi-square test of homogeneity between the rejection sampler's draws and the
    enumerated ones (false-failure rate ALPHA): the same distribution on M(q)."""
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[0], radius=1.0, mode=mode)[0]
    S = 60 * M.size
    counts = []
    for path in ("lazy", "enumerate"):
        res = nn.sample(query_rows=[0], radius=1.0, n_samples=S, mode=mode, seed=5, path=path)
        assert res.counts[0] == S
        counts.append(np.bincount(np.searchsorted(M, res.rows[0]), minlength=M.size))
    _, p, _, _ = stats.chi2_contingency(np.array(counts))
    assert p > ALPHA


def test_auto_enumerates_when_rejection_would_cost_more(skewed, shell):
    _, nn = skewed
    few = nn.sample(query_rows=[0], radius=1.0, n_samples=5, seed=1)
    assert not few.stats[0].extra.get("enumerated")  # a few samples of a large M(q): rejection
    many = nn.sample(query_rows=[0], radius=1.0, n_samples=5000, seed=1)
    assert many.stats[0].extra.get("enumerated") and many.stats[0].draws == 0
    _, nn = shell
    # 7 of 20,007 candidates within r: 20 samples would take about 20 m / 7 rejection draws
    # (m: the entries of the query's buckets); it stops probing long before m.
    m = int(nn.index_.bounds(nn.point_buckets_[0])[1].sum())
    small = nn.sample(query_rows=[0], radius=1.0, n_samples=20, seed=1)
    assert small.stats[0].extra.get("enumerated") and small.counts[0] == 20
    assert small.stats[0].draws < m / 4, (small.stats[0].draws, m)


@pytest.mark.parametrize("sampler", ["exact", "approx", "uniform", "weighted", "rank"])
def test_ordinary_large_requests_get_every_sample(shell, sampler):
    """The request that a fixed cap of 50M draws cut short (to 2,663 of 7,000 samples): 1,000
    |M(q)| samples of a query whose candidates are nearly all outside r. Every sampler
    returns all of them."""
    _, nn = shell
    M = nn.neighbourhood(query_rows=[0], radius=1.0)[0]
    assert M.size == 6  # the inner points: the query's own row is left out
    S = 100 * M.size * (10 if sampler in ("exact", "rank") else 1)
    res = nn.sample(query_rows=[0], radius=1.0, n_samples=S, sampler=sampler, seed=3)
    st = res.stats[0]
    assert res.counts[0] == S and (st.asked, st.drawn, st.why) == (S, S, None)
    assert res.short() == [] and set(res.rows[0]) <= set(M)


def test_forced_rejection_paths_get_every_sample_too(shell):
    _, nn = shell
    for path in ("lazy", "flat"):
        res = nn.sample(query_rows=[0], radius=1.0, n_samples=50, seed=3, path=path)
        assert res.counts[0] == 50 and res.stats[0].why is None, path


@pytest.mark.parametrize("sampler", ["exact", "approx", "uniform", "weighted"])
def test_the_acceptance_rate_the_limit_is_set_from_is_the_measured_one(shell, sampler):
    """``acceptance`` (what the draw limit divides by) against the share of 200,000 draws from
    the flattened buckets that are accepted: within 5 standard errors (false-failure rate
    below 1e-6)."""
    X, nn = shell
    qb = buckets.query_buckets(nn.index_, nn.point_buckets_[0])
    flat = buckets._flatten(nn.index_, qb, nn.points_, X[0], "exact", 4.0, 1.0)
    p = kernel.acceptance(flat, qb.buckets.shape[0], sampler, 0.01)
    assert 0 < p < 1
    n = 200_000
    st = kernel.QueryStats()
    rng = np.random.default_rng(8)
    accept, _ = kernel._draw_flat(flat, qb, nn.point_buckets_, n, sampler, 0.01, rng, st)
    measured = accept.mean()
    assert abs(measured - p) < 5 * np.sqrt(p * (1 - p) / n), (measured, p)


def test_the_draw_limit_follows_the_acceptance_and_has_an_absolute_bound():
    assert kernel.draw_limit(1000, 0.01) == 4 * (1000 + 32) * 100
    assert kernel.draw_limit(10**8, 1e-6) == kernel.MAX_DRAWS == 2**30
    assert kernel.draw_limit(10, 0.5, absolute=50) == 50


def test_a_query_stopped_by_the_draw_limit_says_so(skewed, monkeypatch):
    _, nn = skewed
    monkeypatch.setattr(kernel, "MAX_DRAWS", 3000)
    res = nn.sample(query_rows=[0, 1], radius=1.0, n_samples=2000, sampler="approx", seed=1)
    for i, st in enumerate(res.stats):
        assert st.why == "draw_limit" and st.draws <= 3000
        assert 0 < st.drawn == res.counts[i] < st.asked == 2000
        assert (res.ids[i, st.drawn :] == -1).all() and (res.ids[i, : st.drawn] >= 0).all()
    assert [(q, why) for q, _, _, why in res.short()] == [(0, "draw_limit"), (1, "draw_limit")]


def test_an_empty_neighbourhood_says_so_without_drawing_on(shell):
    X, nn = shell
    # Candidates, but none within r of a point between the query and the shell.
    q = X[0] + np.float32(0.0)
    q[0] = 1.2
    res = nn.sample(q, radius=0.05, n_samples=1000, seed=1)
    st = res.stats[0]
    assert (st.asked, st.drawn, st.why) == (1000, 0, "empty") and (res.ids == -1).all()
    m = int(nn.index_.lookup(nn.lsh_.hash(q[None, :]))[1].sum())
    assert st.draws < m / 4, (st.draws, m)  # one probe of the acceptance, then M(q) is listed
    far = nn.sample(np.full((1, 8), 50.0, np.float32), radius=0.05, n_samples=10, seed=1)
    assert far.short() == [(0, 0, 10, "empty")]


def test_enumerate_is_for_the_exact_sampler_only(skewed):
    _, nn = skewed
    with pytest.raises(FairpipeInputError, match="may be 'enumerate' only with the 'exact'"):
        nn.sample(query_rows=[0], radius=1.0, sampler="approx", path="enumerate")


def test_distances_of_many_rows_are_those_of_the_plain_computation():
    """Enumerating M(q) computes the distances of many rows a block at a time: each equals
    the whole gather's, bit for bit (which side of r a row falls on cannot change)."""
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(30_000, 24)) * 10).astype(np.float32)
    rows = rng.choice(30_000, 3 * buckets.DISTANCE_BLOCK + 17)
    for q in (X[3] + np.float32(0.5), X[3].astype(np.float64) + 0.5):
        diff = X[rows] - q
        want = np.einsum("ij,ij->i", diff, diff)
        got = buckets.sq_distances(X, rows, q, ())
        assert got.dtype == want.dtype and np.array_equal(got, want)
