"""Fair streaming submodular selection: invariants, brute force, references, bad input."""

from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpipe.errors import FairpipeInputError
from fairpipe.summary._fair_streaming import (
    _stream,
    bound_error,
    fair_greedy,
    fair_stream,
    msm_stream,
    random_subset,
)
from fairpipe.summary._utilities import Utility


def value_reference(util: Utility, X_S: np.ndarray) -> float:
    """f(S) straight from the definition, in numpy."""
    E = util.E
    X_S = np.asarray(X_S, dtype=np.float64).reshape(-1, E.shape[1])
    d2 = ((E[:, None, :] - X_S[None, :, :]) ** 2).sum(axis=2)
    if util.name == "exemplar":
        to_phantom = (E**2).sum(axis=1)
        with_phantom = np.minimum(to_phantom, d2.min(axis=1)) if X_S.shape[0] else to_phantom
        return float(to_phantom.mean() - with_phantom.mean())
    if X_S.shape[0] == 0:
        return 0.0
    return float(np.exp(-util.kernel_gamma * d2).max(axis=1).mean())


def instance(seed, n, d, n_groups, k):
    """Random points and groups with bounds that are feasible for them."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32).astype(np.float64)  # as validated
    groups = rng.integers(0, n_groups, size=n)
    groups[:n_groups] = np.arange(n_groups)  # every group present
    counts = np.bincount(groups, minlength=n_groups)
    lower = np.minimum(rng.integers(0, 3, size=n_groups), counts)
    while lower.sum() > k:
        lower[np.argmax(lower)] -= 1
    upper = lower + rng.integers(0, 3, size=n_groups)
    return X, groups, lower, upper


def brute_force(X, groups, lower, upper, k, util):
    """The best feasible set, by enumeration (tiny instances only)."""
    best = 0.0
    for size in range(int(lower.sum()), k + 1):
        for S in combinations(range(X.shape[0]), size):
            counts = np.bincount(groups[list(S)], minlength=lower.shape[0])
            if (counts >= lower).all() and (counts <= upper).all():
                best = max(best, util.value(X[list(S)]))
    return best


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 80),
    n_groups=st.integers(1, 5),
    k=st.integers(1, 12),
    utility=st.sampled_from(["exemplar", "facility"]),
    swap=st.booleans(),
)
def test_stream_stays_extendable_and_the_result_is_feasible(seed, n, n_groups, k, utility, swap):
    n_groups = min(n_groups, n)
    X, groups, lower, upper = instance(seed, n, 3, n_groups, k)
    k = min(k, n)
    while lower.sum() > k:
        lower[np.argmax(lower)] -= 1
    util = Utility(utility, X[: max(1, n // 2)])
    members, weights, backups, n_backups, calls, _ = _stream(
        util.kind, util.kernel_gamma, util.E, X, groups, lower, upper, k, 2.0, True, swap
    )
    counts = np.bincount(groups[members], minlength=n_groups)
    assert len(set(members.tolist())) == members.shape[0]
    assert (counts <= upper).all()
    assert np.maximum(counts, lower).sum() <= k  # extendable, after every element (it only grows)
    assert calls == n  # one gain evaluation per element
    for c in range(n_groups):
        kept = backups[c, : n_backups[c]]
        assert (groups[kept] == c).all() and kept.shape[0] == min(lower[c], (groups == c).sum())
    res = fair_stream(X, groups, lower, upper, k, util, swap=swap)
    assert res.error == 0
    assert (res.counts >= lower).all() and (res.counts <= upper).all()
    assert res.rows.shape[0] <= k
    assert res.calls >= n
    assert np.isclose(res.value, value_reference(util, X[res.rows]))


@pytest.mark.parametrize("utility", ["exemplar", "facility"])
def test_chakrabarti_kale_rule_is_within_a_quarter_of_brute_force(utility):
    """FSM with the CK rule is a 1/4-approximation of the best extendable set (>= the best
    feasible set); the swap rule has no proved bound but should be close on average."""
    ratios = {False: [], True: []}
    for seed in range(25):
        X, groups, lower, upper = instance(seed, 11, 2, 3, 4)
        util = Utility(utility, X)
        opt = brute_force(X, groups, lower, upper, 4, util)
        for swap in (False, True):
            res = fair_stream(X, groups, lower, upper, 4, util, swap=swap)
            assert res.error == 0
            assert res.value >= opt / 4 - 1e-12
            ratios[swap].append(res.value / opt)
        greedy = fair_greedy(X, groups, lower, upper, 4, util)
        assert greedy.error == 0 and greedy.value <= opt + 1e-12
    assert np.mean(ratios[True]) >= 0.9, np.mean(ratios[True])
    assert np.mean(ratios[False]) >= 0.7, np.mean(ratios[False])


def plain_greedy(X, groups, lower, upper, k, util):
    """Textbook greedy on the extendable-set matroid: every gain recomputed at every step."""
    S: list[int] = []
    while len(S) < k:
        best, best_gain = -1, -1.0
        for i in range(X.shape[0]):
            if i in S:
                continue
            counts = np.bincount(groups[S + [i]], minlength=lower.shape[0])
            if (counts > upper).any() or np.maximum(counts, lower).sum() > k:
                continue
            g = value_reference(util, X[S + [i]]) - value_reference(util, X[S])
            if g > best_gain + 1e-12:
                best, best_gain = i, g
        if best < 0:
            break
        S.append(best)
    return sorted(S)


@pytest.mark.parametrize("seed", range(5))
def test_lazy_greedy_equals_the_textbook_greedy(seed):
    X, groups, lower, upper = instance(seed, 40, 3, 3, 8)
    util = Utility("exemplar", X)
    res = fair_greedy(X, groups, lower, upper, 8, util)
    assert res.rows.tolist() == plain_greedy(X, groups, lower, upper, 8, util)


def test_checking_only_upper_bounds_misses_the_rare_group():
    """MSM (upper bounds and k only) fills k with the common group; FSM meets every bound."""
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(size=(300, 2)) * 3, rng.normal(size=(5, 2)) * 0.1])
    groups = np.array([0] * 300 + [1] * 5)
    lower, upper = [2, 2], [8, 8]
    msm = msm_stream(X, groups, lower, upper, 8)
    fsm = fair_stream(X, groups, lower, upper, 8)
    assert msm.counts[1] < 2 and msm.error > 0
    assert fsm.error == 0 and fsm.counts.tolist() == [6, 2]
    assert random_subset(X, groups, lower, upper, 8, seed=1).rows.shape == (8,)


def test_utility_kernels_match_numpy():
    rng = np.random.default_rng(0)
    E, S = rng.normal(size=(50, 4)), rng.normal(size=(6, 4))
    for name in ("exemplar", "facility"):
        u = Utility(name, E)
        assert np.isclose(u.value(S), value_reference(u, S))
        assert u.value(S[:0]) == 0.0
        assert u.value(S) >= u.value(S[:3]) >= 0  # monotone
    assert Utility("facility", E, gamma=0.5).kernel_gamma == 0.5


def test_same_input_same_result_and_inputs_untouched():
    X, groups, lower, upper = instance(7, 500, 4, 4, 10)
    X0, c0 = X.copy(), groups.copy()
    a = fair_stream(X, groups, lower, upper, 10)
    b = fair_stream(X, groups, lower, upper, 10)
    assert np.array_equal(a.rows, b.rows) and a.value == b.value
    assert np.array_equal(X, X0) and np.array_equal(groups, c0)


def test_bound_error_counts_both_sides():
    assert bound_error([0, 5, 3], [1, 1, 1], [2, 2, 3]) == 1 + 3


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lower=[3, 3], upper=[4, 4], k=5), "lower bounds add up to 6"),
        (dict(lower=[3, 1], upper=[2, 4], k=5), "Group 0 has lower bound 3 above its upper bound 2"),
        (dict(lower=[1, 4], upper=[4, 4], k=5), "Group 1 has 3 elements in the data but its lower bound is 4"),
        (dict(lower=[-1, 0], upper=[4, 4], k=5), "lower bound of group 0 must be a non-negative"),
        (dict(lower=[0, 0], upper=[4, 1.5], k=5), "upper bound of group 1 must be a non-negative"),
        (dict(lower=[0], upper=[4, 4], k=5), "Upper bounds were given for 2 groups"),
        (dict(lower=[0, 0], upper=[4, 4], k=9), "k = 9 is larger than the 8 elements"),
        (dict(lower=[0, 0], upper=[4, 4], k=0), "'k' parameter of the summary must be a positive"),
    ],
)  # fmt: skip
def test_bad_bounds_are_named(kw, match):
    X = np.arange(16, dtype=float).reshape(8, 2)
    groups = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    with pytest.raises(FairpipeInputError, match=match):
        fair_stream(X, groups, kw["lower"], kw["upper"], kw["k"])


def test_bad_rows_and_groups_are_named():
    X = np.arange(16, dtype=float).reshape(8, 2)
    groups = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    bad = X.copy()
    bad[5, 1] = np.nan
    with pytest.raises(
        FairpipeInputError, match="Row 6 of fair_stream holds a NaN value in column 2"
    ):
        fair_stream(bad, groups, [1, 1], [4, 4], 4)
    with pytest.raises(FairpipeInputError, match="Row 3 of fair_stream has group -1"):
        fair_stream(X, np.array([0, 0, -1, 0, 0, 1, 1, 1]), [1, 1], [4, 4], 4)
    with pytest.raises(
        FairpipeInputError,
        match="Row 1 of fair_stream has group 3; groups must be integers from 0 to 2",
    ):
        fair_stream(X, np.array([3, 0, 0, 0, 0, 1, 1, 1]), [0, 0, 0], [4, 4, 4], 5)
    with pytest.raises(FairpipeInputError, match="Row 2 of fair_stream has group 0.5"):
        fair_stream(X, np.array([0, 0.5, 0, 0, 0, 1, 1, 1]), [1, 1], [4, 4], 4)
    with pytest.raises(FairpipeInputError, match="got 3 groups for 8 elements"):
        fair_stream(X, np.array([0, 1, 1]), [1, 1], [4, 4], 4)
    with pytest.raises(FairpipeInputError, match="'factor' parameter of fair_stream"):
        fair_stream(X, groups, [1, 1], [4, 4], 4, factor=0)
    with pytest.raises(FairpipeInputError, match="'utility' parameter of Utility must be one of"):
        fair_stream(X, groups, [1, 1], [4, 4], 4, utility="coverage")


def test_random_feasible_rows_meet_the_bounds_and_draw_every_row_alike():
    """Each draw has k rows of the choosable ones within the bounds; over 1,000 draws every
    choosable row of a group is drawn about equally often (a chi-square bound at a false-failure
    rate of about 1e-6)."""
    from scipy.stats import chi2

    from fairpipe.summary import random_feasible_rows

    group = np.repeat([0, 1, 2], [20, 30, 50])
    group[[3, 40, 77]] = -1  # rows that cannot be chosen (forgotten)
    lower, upper = [2, 1, 0], [4, 3, 6]
    rng = np.random.default_rng(0)
    seen = np.zeros(group.size)
    for _ in range(1000):
        rows = random_feasible_rows(group, lower, upper, 8, rng)
        counts = np.bincount(group[rows], minlength=3)
        assert rows.size == 8 == np.unique(rows).size and (group[rows] >= 0).all()
        assert (counts >= lower).all() and (counts <= upper).all()
        seen[rows] += 1
    assert (seen[[3, 40, 77]] == 0).all()
    for c in range(3):
        drawn = seen[group == c]
        stat = ((drawn - drawn.mean()) ** 2 / drawn.mean()).sum()
        assert stat < chi2.ppf(1 - 1e-6, drawn.size - 1), (c, stat)
