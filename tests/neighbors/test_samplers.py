"""Statistical tests of the samplers, each with a fixed seed and a stated false-failure rate."""

import numpy as np
import pytest
from scipy import stats

from fairpipe import FairNN, FairpipeInputError
from fairpipe.neighbors import chi_square_uniform, tv_to_uniform
from tests.conftest import skewed_points

ALPHA = 1e-3  # false-failure rate of each uniformity test (fixed seeds make it reproducible)


@pytest.fixture(scope="module")
def skewed():
    X = skewed_points()
    nn = FairNN(n_hashes=3, n_tables=12, bucket_width=1.2, seed=4).fit(X)
    return X, nn


def brute_force(X, q, radius):
    return np.flatnonzero(np.linalg.norm(X - X[q], axis=1) <= radius)


def test_found_neighbourhood_is_a_subset_of_the_true_one(skewed):
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[0], radius=1.0, mode="exact")[0]
    truth = brute_force(X, 0, 1.0)
    assert set(M) <= set(truth)
    assert M.size >= 0.8 * truth.size  # LSH recall on this easy example


@pytest.mark.parametrize("sampler", ["exact", "rank", "approx"])
@pytest.mark.parametrize("mode", ["buckets", "exact"])
def test_fair_methods_are_uniform(skewed, sampler, mode):
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[0], radius=1.0, mode=mode)[0]
    S = 60 * M.size
    res = nn.sample(query_rows=[0], radius=1.0, n_samples=S, sampler=sampler, mode=mode, seed=11)
    rows = res.rows[0]
    assert res.counts[0] == S and set(rows) <= set(M)
    chi2, dof = chi_square_uniform(rows, M)
    assert stats.chi2.sf(chi2, dof) > ALPHA


@pytest.mark.parametrize("sampler", ["uniform", "weighted"])
def test_biased_methods_are_detectably_biased(skewed, sampler):
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[0], radius=1.0, mode="buckets")[0]
    res = nn.sample(
        query_rows=[0], radius=1.0, n_samples=60 * M.size, sampler=sampler, mode="buckets", seed=11
    )
    chi2, dof = chi_square_uniform(res.rows[0], M)
    assert stats.chi2.sf(chi2, dof) < 1e-6


def test_exact_mode_returns_only_points_within_r_and_approximate_within_cr(skewed):
    X, nn = skewed
    for mode, limit in (("exact", 0.6), ("approximate", 1.2)):
        res = nn.sample(query_rows=[3], radius=0.6, n_samples=2000, mode=mode, c=2.0, seed=1)
        d = np.linalg.norm(X[res.rows[0, : res.counts[0]]] - X[3], axis=1)
        assert res.counts[0] == 2000 and (d <= limit + 1e-5).all()


def test_outliers_are_removed_then_scanned_and_the_output_stays_uniform(skewed):
    X, nn = skewed
    # A tiny radius makes most bucket-mates outliers: removal, then the one-pass filter.
    M = nn.neighbourhood(query_rows=[0], radius=0.2, mode="approximate", c=1.5)[0]
    res = nn.sample(
        query_rows=[0],
        radius=0.2,
        c=1.5,
        n_samples=80 * M.size,
        mode="approximate",
        seed=5,
        max_outliers=10,
        path="lazy",
    )
    st = res.stats[0]
    assert st.outliers > 10 and st.outlier_scan
    chi2, dof = chi_square_uniform(res.rows[0], M)
    assert stats.chi2.sf(chi2, dof) > ALPHA


def test_exact_sampler_reaches_the_noise_floor_and_beats_weighted(skewed):
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[0], radius=1.0, mode="exact")[0]
    S = 100 * M.size
    tv = {
        m: tv_to_uniform(
            nn.sample(query_rows=[0], radius=1.0, n_samples=S, sampler=m, seed=2).rows[0], M
        )
        for m in ("exact", "weighted", "uniform")
    }
    floor = np.sqrt(1 / (2 * np.pi * 100))
    assert tv["exact"] < 1.5 * floor
    assert tv["weighted"] > 2 * tv["exact"] and tv["uniform"] > 2 * tv["exact"]


def test_rank_samples_are_independent_across_repeated_queries(skewed):
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[0], radius=1.0, mode="exact")[0]
    firsts = [
        nn.sample(query_rows=[0], radius=1.0, n_samples=1, sampler="rank", seed=s).rows[0, 0]
        for s in range(40 * M.size)
    ]
    chi2, dof = chi_square_uniform(np.array(firsts), M)
    assert stats.chi2.sf(chi2, dof) > ALPHA


def test_same_seed_same_samples_and_inputs_not_mutated(skewed):
    X, nn = skewed
    before = (nn.index_.members.copy(), nn.keys_.copy())
    a = nn.sample(
        query_rows=[0, 5], radius=1.0, n_samples=50, sampler="approx", mode="approximate", seed=9
    )
    b = nn.sample(
        query_rows=[0, 5], radius=1.0, n_samples=50, sampler="approx", mode="approximate", seed=9
    )
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(before[0], nn.index_.members) and np.array_equal(before[1], nn.keys_)


def test_external_query_points_hash_to_the_stored_keys(skewed):
    X, nn = skewed
    assert np.array_equal(nn.lsh_.hash(X[:1]), nn.keys_[:1])
    a = nn.sample(X[7], radius=1.0, n_samples=30, seed=3)
    b = nn.sample(query_rows=[7], radius=1.0, n_samples=30, seed=3)
    assert np.array_equal(a.ids, b.ids)


def test_empty_neighbourhood_gives_minus_one():
    X = np.array([[0.0, 0.0], [100.0, 100.0]], dtype=np.float32)
    nn = FairNN(n_hashes=4, n_tables=3, bucket_width=0.5, seed=0).fit(X)
    res = nn.sample(np.array([50.0, 50.0]), radius=0.1, n_samples=3)
    assert res.counts[0] == 0 and (res.ids == -1).all()


def test_fitted_object_pickles(skewed):
    import pickle

    X, nn = skewed
    clone = pickle.loads(pickle.dumps(nn))
    a = nn.sample(query_rows=[1], radius=1.0, n_samples=20, seed=4)
    assert np.array_equal(a.ids, clone.sample(query_rows=[1], radius=1.0, n_samples=20, seed=4).ids)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"radius": -1.0},
            "'radius' parameter of FairNN.sample must be a positive float. Got -1.0",
        ),
        (
            {"radius": 1.0, "n_samples": 0},
            "'n_samples' parameter of FairNN.sample must be an integer from 1 to 100000000",
        ),
        ({"radius": 1.0, "sampler": "fair"}, "'sampler' parameter of FairNN.sample must be one of"),
        ({"radius": 1.0, "mode": "near"}, "'mode' parameter of FairNN.sample must be one of"),
        ({"radius": 1.0, "query_rows": [10_000]}, "Query row 10000 is out of range"),
    ],
)
def test_bad_sampling_arguments(skewed, kwargs, match):
    X, nn = skewed
    kwargs = {"query_rows": [0], **kwargs}
    with pytest.raises(FairpipeInputError, match=match):
        nn.sample(**kwargs)


def test_fit_rejects_duplicate_ids():
    with pytest.raises(FairpipeInputError, match="Id 4 appears more than once"):
        FairNN(n_hashes=1, n_tables=1).fit(np.zeros((3, 2)), ids=np.array([4, 5, 4]))


@pytest.mark.parametrize("sampler", ["exact", "approx"])
@pytest.mark.parametrize("mode", ["buckets", "approximate", "exact"])
def test_flat_and_lazy_paths_are_both_uniform_on_the_neighbourhood(skewed, sampler, mode):
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[3], radius=0.6, mode=mode, c=1.5)[0]
    assert M.size >= 5
    for path in ("lazy", "flat"):
        res = nn.sample(
            query_rows=[3], radius=0.6, c=1.5, mode=mode, sampler=sampler,
            n_samples=60 * M.size, seed=11, path=path,
        )  # fmt: skip
        assert res.stats[0].extra.get("flattened", False) == (path == "flat")
        assert set(res.rows[0]) <= set(M)
        chi2, dof = chi_square_uniform(res.rows[0], M)
        assert stats.chi2.sf(chi2, dof) > ALPHA, (path, sampler, mode)


def test_flat_degree_equals_the_key_comparison_degree(skewed):
    from fairpipe.neighbors._query_buckets import _flatten, degree_of, query_buckets

    X, nn = skewed
    qb = query_buckets(nn.index_, nn.point_buckets_[7])
    flat = _flatten(nn.index_, qb, nn.points_, X[7], "buckets", np.inf, np.inf)
    by_keys = np.count_nonzero(nn.keys_[flat.rows] == nn.keys_[7], axis=1)
    assert np.array_equal(flat.degree, by_keys)
    assert np.array_equal(
        flat.degree, degree_of(nn.point_buckets_, flat.rows, nn.point_buckets_[7])
    )
    assert flat.rows.size == int(qb.size.sum())


def _expected_probabilities(nn, row, M, sampler):
    """P(p) of one draw of each sampler on the union M of row's buckets, from the index itself."""
    lo, size = nn.index_.bounds(nn.point_buckets_[row])
    members = [nn.index_.members[a : a + s] for a, s in zip(lo, size) if s]
    p = np.zeros(M.size)
    for bucket in members:
        where = np.searchsorted(M, bucket)
        if sampler == "uniform":
            p[where] += 1.0 / (len(members) * bucket.size)
        else:  # weighted: each (bucket, member) entry equally likely
            p[where] += 1.0 / sum(b.size for b in members)
    if sampler == "exact":
        p = np.full(M.size, 1.0 / M.size)
    return p


@pytest.mark.parametrize("sampler", ["exact", "weighted", "uniform"])
@pytest.mark.parametrize("n_samples", [1, 3])
def test_few_sample_queries_follow_each_samplers_distribution(skewed, sampler, n_samples):
    # n_samples <= 4 in buckets mode takes the draw-by-draw path: check it draws from the same
    # distribution as the vectorised rounds (exact: uniform on M; weighted: degree/m; uniform:
    # bucket then member), over many seeds.
    X, nn = skewed
    M = nn.neighbourhood(query_rows=[0], radius=1.0, mode="buckets")[0]
    got = np.concatenate(
        [
            nn.sample(query_rows=[0], radius=1.0, n_samples=n_samples, sampler=sampler,
                      mode="buckets", seed=seed).rows[0]
            for seed in range(40 * M.size // n_samples)
        ]
    )  # fmt: skip
    assert got.min() >= 0 and set(got) <= set(M)
    expected = _expected_probabilities(nn, 0, M, sampler) * got.size
    observed = np.bincount(np.searchsorted(M, got), minlength=M.size)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(chi2, M.size - 1) > ALPHA


def test_a_call_without_a_seed_draws_fresh_samples_and_a_seed_repeats_them(skewed):
    _, nn = skewed
    draw = lambda seed: nn.sample(query_rows=[0], radius=1.0, n_samples=40, seed=seed).ids  # noqa: E731
    assert np.array_equal(draw(5), draw(5))
    # 40 draws from a neighbourhood of dozens of points: two fresh calls agree with
    # probability far below 1e-12.
    assert not np.array_equal(draw(None), draw(None))


def test_unique_ints_is_np_unique():
    """The mask path (many values below a small bound) and the np.unique path (few values, or
    a large bound) give np.unique's sorted values and dtype."""
    from fairpipe.neighbors import unique_ints

    rng = np.random.default_rng(0)
    for size, top, dtype in [(0, 1, np.int64), (5, 10, np.int64), (5000, 100, np.int32),
                             (500_000, 1_000_000, np.int64), (2000, 10**9, np.int64),
                             (3000, 3000, np.int16)]:  # fmt: skip
        values = rng.integers(0, top, size=size).astype(dtype)
        for v in (values, values - 5):  # negative values: np.unique's path
            got, want = unique_ints(v), np.unique(v)
            assert got.dtype == want.dtype and np.array_equal(got, want), (size, top)
