"""The summary tree: exact deletions, determinism, bounds at the root, bad input."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpipe.errors import FairpipeInputError
from fairpipe.hashing import stable_hash
from fairpipe.summary import EVAL_SALT, STREAM_SALT, FairSummary, Utility, stream_kernel


def data(seed=0, n=4000, d=5, n_groups=4, rare=12):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    groups = rng.integers(0, n_groups - 1, size=n)
    groups[rng.choice(n, size=rare, replace=False)] = n_groups - 1  # one rare group
    ids = rng.permutation(n * 3)[:n].astype(np.int64)
    return X, groups, ids


PARAMS = dict(k=12, lower=[2, 2, 2, 2], upper=[5, 5, 5, 5], fanout=4, height=2, eval_size=300)


def same_nodes(a: FairSummary, b: FairSummary) -> bool:
    for la, lb in zip(a.nodes_, b.nodes_):
        for x, y in zip(la, lb):
            if not (
                np.array_equal(x.candidates, y.candidates)
                and np.array_equal(x.evaluation, y.evaluation)
                and np.array_equal(x.summary, y.summary)
                and x.value == y.value
            ):
                return False
    return True


@pytest.mark.parametrize("rule", ["swap", "ck"])
def test_deletion_batches_equal_a_fresh_summary(rule):
    X, groups, ids = data()
    model = FairSummary(**PARAMS, rule=rule).fit(X, ids=ids, groups=groups)
    alive = np.ones(len(ids), bool)
    rng = np.random.default_rng(1)
    batches = [
        model.summary_ids_[:3],  # summary members
        rng.choice(ids, 40, replace=False),  # anywhere
        ids[groups == 3][:8],  # most of the rare group: 4 left, lower bound 2
    ]
    for batch in batches:
        report = model.delete(batch)
        alive &= ~np.isin(ids, batch)
        assert 0 < report.changed[0].shape[0] <= 16 and report.changed[-1].tolist() == [0]
        fresh = FairSummary(**PARAMS, rule=rule).fit(X[alive], ids=ids[alive], groups=groups[alive])
        assert same_nodes(model, fresh)
        assert model.error_ == 0
        assert not np.isin(model.summary_ids_, batch).any()
    again = model.delete(batches[0])
    assert again.already_deleted.tolist() == sorted(batches[0].tolist()) and again.changed == []
    assert model.delete([10**15]).unknown.tolist() == [10**15]


def test_summary_ignores_row_order_and_pickles():
    X, groups, ids = data(2)
    a = FairSummary(**PARAMS).fit(X, ids=ids, groups=groups)
    perm = np.random.default_rng(0).permutation(len(ids))
    b = FairSummary(**PARAMS).fit(X[perm], ids=ids[perm], groups=groups[perm])
    assert same_nodes(a, b)
    c = pickle.loads(pickle.dumps(a))
    assert np.array_equal(c.summary_ids_, a.summary_ids_)
    assert FairSummary(**{**PARAMS, "seed": 1}).fit(
        X, ids=ids, groups=groups
    ).summary_ids_.tolist() != (a.summary_ids_.tolist())


def test_one_node_tree_is_the_stream_in_hash_order():
    """height 0: the root streams every point in hash order, measured on the hash sample."""
    X, groups, ids = data(3, n=1500)
    model = FairSummary(**{**PARAMS, "height": 0, "eval_size": 200}).fit(X, ids=ids, groups=groups)
    order = np.argsort(stable_hash(0, ids, salt=STREAM_SALT))
    sample = np.argsort(stable_hash(0, ids, salt=EVAL_SALT))[:200]
    util = Utility("exemplar", X[sample].astype(np.float64))
    res = stream_kernel(
        X[order].astype(np.float64), groups[order], np.array(PARAMS["lower"]),
        np.array(PARAMS["upper"]), 12, util, swap=True,
    )  # fmt: skip
    assert np.array_equal(model.summary_ids_, np.sort(ids[order][res.rows]))
    assert model.value_ == res.value and model.oracle_calls_ == res.calls


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 1000),
    n_groups=st.integers(1, 5),
    k=st.integers(5, 20),
    fanout=st.integers(2, 4),
    height=st.integers(0, 2),
)
def test_root_meets_every_feasible_bound(seed, n_groups, k, fanout, height):
    rng = np.random.default_rng(seed)
    n = 600
    X = rng.normal(size=(n, 3))
    groups = rng.choice(n_groups, size=n, p=rng.dirichlet(np.ones(n_groups)))
    counts = np.bincount(groups, minlength=n_groups)
    lower = np.minimum(np.full(n_groups, k // (2 * n_groups)), counts)
    upper = np.maximum(lower, rng.integers(0, k, size=n_groups))
    model = FairSummary(
        k=k, lower=lower, upper=upper, fanout=fanout, height=height, eval_size=64, seed=seed
    ).fit(X, groups=groups)
    assert model.error_ == 0 and model.summary_ids_.shape[0] <= k
    assert (model.counts_ >= lower).all() and (model.counts_ <= upper).all()


def test_facility_utility_and_the_summary_quality():
    from fairpipe.summary import fair_greedy

    X, groups, ids = data(4, n=3000)
    for utility in ("exemplar", "facility"):
        model = FairSummary(**{**PARAMS, "utility": utility}).fit(X, ids=ids, groups=groups)
        sample = np.argsort(stable_hash(0, ids, salt=EVAL_SALT))[:300]
        util = Utility(utility, X[sample].astype(np.float64))
        greedy = fair_greedy(X, groups, PARAMS["lower"], PARAMS["upper"], 12, util)
        rows = np.searchsorted(np.sort(ids), model.summary_ids_)
        mine = util.value(X[np.argsort(ids)][rows].astype(np.float64))
        assert mine == pytest.approx(model.value_)
        assert mine >= 0.9 * greedy.value, (utility, mine / greedy.value)


def test_bad_input_is_named():
    X, groups, ids = data(5, n=200, rare=1)
    with pytest.raises(
        FairpipeInputError, match="Group 3 has 1 elements in the data but its lower bound is 2"
    ):
        FairSummary(**PARAMS).fit(X, ids=ids, groups=groups)
    X, groups, ids = data(5, n=200)
    with pytest.raises(FairpipeInputError, match="Row 8 of FairSummary.fit has group 9"):
        FairSummary(**PARAMS).fit(X, ids=ids, groups=np.where(np.arange(200) == 7, 9, groups))
    bad = X.copy()
    bad[11, 0] = np.inf
    with pytest.raises(FairpipeInputError, match="Row 12 of FairSummary.fit holds an inf value"):
        FairSummary(**PARAMS).fit(bad, ids=ids, groups=groups)
    with pytest.raises(FairpipeInputError, match="'rule' parameter of FairSummary must be one of"):
        FairSummary(**{**PARAMS, "rule": "greedy"}).fit(X, ids=ids, groups=groups)
    with pytest.raises(FairpipeInputError, match="'eval_size' parameter of FairSummary"):
        FairSummary(**{**PARAMS, "eval_size": 0}).fit(X, ids=ids, groups=groups)
    with pytest.raises(FairpipeInputError, match="k = 12 is larger than the 10 elements"):
        FairSummary(**{**PARAMS, "lower": [0] * 4}).fit(X[:10], ids=ids[:10], groups=groups[:10])
    with pytest.raises(FairpipeInputError, match="Id .* appears more than once"):
        FairSummary(**PARAMS).fit(X, ids=np.zeros(200, np.int64), groups=groups)
    with pytest.raises(FairpipeInputError, match="not fitted"):
        FairSummary(**PARAMS).delete([1])
