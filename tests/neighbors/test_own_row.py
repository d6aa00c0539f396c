"""A query by row leaves its own row out of its neighbourhood (``include_query`` keeps it), and
the samplers stay uniform on what remains: chi-square tests with a fixed seed and a stated
false-failure rate."""

import numpy as np
import pytest
from scipy import stats

from fairpipe import FairNN, FairpipeInputError
from fairpipe.neighbors import chi_square_uniform

ALPHA = 1e-3  # false-failure rate of each statistical test (fixed seeds make it reproducible)


@pytest.fixture(scope="module")
def nn():
    X = np.random.default_rng(5).normal(size=(400, 3)).astype(np.float32)
    X[399] = 50.0  # far from every other row: alone in its buckets within any small radius
    return FairNN(n_hashes=2, n_tables=8, bucket_width=3.0, seed=1).fit(X)


@pytest.mark.parametrize(
    "sampler, path",
    [("exact", "lazy"), ("exact", "flat"), ("exact", "enumerate"), ("approx", "auto"),
     ("rank", "auto")],
)  # fmt: skip
@pytest.mark.parametrize("include_query", [False, True])
def test_the_own_row_is_left_out_and_the_rest_stays_uniform(nn, sampler, path, include_query):
    kw = dict(query_rows=[7], radius=1.0, include_query=include_query)
    M = nn.neighbourhood(**kw)[0]
    assert (7 in M) is include_query and M.size >= 5
    res = nn.sample(**kw, n_samples=40 * M.size, sampler=sampler, path=path, seed=3,
                    with_neighbourhood=True)  # fmt: skip
    got = res.rows[0, : res.counts[0]]
    assert res.counts[0] == 40 * M.size and res.neighbourhood_sizes[0] == M.size
    assert set(got.tolist()) <= set(M.tolist())
    assert stats.chi2.sf(*chi_square_uniform(got, M)) > ALPHA


@pytest.mark.parametrize("sampler", ["exact", "approx", "uniform", "weighted", "rank"])
def test_a_query_alone_in_its_neighbourhood_gets_no_sample_and_says_it_is_empty(nn, sampler):
    res = nn.sample(query_rows=[399], radius=1.0, n_samples=5, sampler=sampler, seed=0,
                    with_neighbourhood=True)  # fmt: skip
    assert res.counts[0] == 0 and res.stats[0].why == "empty"
    assert res.neighbourhood_sizes[0] == 0 and (res.ids[0] == -1).all()
    kept = nn.sample(query_rows=[399], radius=1.0, n_samples=5, sampler=sampler, seed=0,
                     include_query=True)  # fmt: skip
    assert kept.rows[0].tolist() == [399] * 5


def test_include_query_does_not_apply_to_points_given_by_value(nn):
    with pytest.raises(FairpipeInputError, match="'include_query' parameter of FairNN.sample "
                       "applies to queries by row or id only"):  # fmt: skip
        nn.sample(nn.points_[:1], radius=1.0, include_query=True)
    with pytest.raises(FairpipeInputError, match="'include_query' parameter of "
                       "FairNN.neighbourhood must be a bool. Got 'yes'"):  # fmt: skip
        nn.neighbourhood(query_rows=[0], radius=1.0, include_query="yes")
    # A point given by value is no row: nothing is left out (row 7's point finds row 7).
    assert 7 in nn.neighbourhood(queries=nn.points_[7], radius=1.0)[0]
