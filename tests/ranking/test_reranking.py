"""Re-ranking: each algorithm against a scalar transcription of the paper, the feasibility
guarantees (property-based), metrics against hand-computed values, bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpipe.errors import FairpipeInputError
from fairpipe.ranking import ALGORITHMS, infeasible_index, ndcg, ndkl, ranking_metrics, rerank, skew

TOL = 1e-9


def fl(x):
    return math.floor(x + TOL)


def ce(x):
    return math.ceil(x - TOL)


def queues(scores, groups, n_groups):
    """Per group, candidate indices best score first (ties: earlier candidate)."""
    q = {a: [] for a in range(n_groups)}
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        if groups[i] >= 0:
            q[groups[i]].append(i)
    return q


def best_of(q, taken, scores, allowed):
    best = None
    for a in allowed:
        if taken[a] < len(q[a]):
            s = scores[q[a][taken[a]]]
            if best is None or s > best[0]:
                best = (s, a)
    return None if best is None else best[1]


def reference_det(scores, groups, p, k, algorithm, floor=fl, ceil=ce):
    """Algorithm 1 of Geyik et al. as printed, plus the documented fallback. With ``p`` as
    Fractions and ``floor=math.floor, ceil=math.ceil`` it runs in exact arithmetic: groups tie
    exactly when their values are equal (then the better next score wins, then the lower
    group)."""
    A = len(p)
    q = queues(scores, groups, A)
    taken = [0] * A
    out = []
    for j in range(1, k + 1):
        below_min = [a for a in range(A) if taken[a] < floor(j * p[a]) and taken[a] < len(q[a])]
        if below_min:
            a = best_of(q, taken, scores, below_min)
        else:
            below_max = [a for a in range(A) if taken[a] < ceil(j * p[a]) and taken[a] < len(q[a])]
            if algorithm == "detgreedy":
                a = best_of(q, taken, scores, below_max)
            else:

                def key(a, j=j):
                    v = ceil(j * p[a]) / p[a]
                    return float(math.ceil(v - TOL)) if algorithm == "detrelaxed" else v

                lowest = min((key(a) for a in below_max), default=None)
                a = best_of(q, taken, scores, [b for b in below_max if key(b) - lowest <= TOL])
        if a is None:
            a = best_of(q, taken, scores, range(A))
        if a is None:
            break
        out.append(q[a][taken[a]])
        taken[a] += 1
    return out


def reference_constsort(scores, groups, p, k):
    """Algorithm 2 of Geyik et al. with 1-based deadlines, stepping j by one."""
    A = len(p)
    q = queues(scores, groups, A)
    taken = [0] * A
    mins = [0] * A
    items, deadline = [], []
    j = 0
    while len(items) < k:
        if not any(p[a] > 0 and taken[a] < len(q[a]) for a in range(A)):
            break
        j += 1
        temp = [fl(j * p[a]) for a in range(A)]
        changed = [a for a in range(A) if temp[a] > mins[a] and taken[a] < len(q[a])]
        changed.sort(key=lambda a: (-scores[q[a][taken[a]]], a))
        for a in changed:
            items.append(q[a][taken[a]])
            deadline.append(j)
            taken[a] += 1
            pos = len(items) - 1  # 0-based
            while (
                pos > 0
                and deadline[pos - 1] >= pos + 1
                and scores[items[pos - 1]] < scores[items[pos]]
            ):
                items[pos - 1], items[pos] = items[pos], items[pos - 1]
                deadline[pos - 1], deadline[pos] = deadline[pos], deadline[pos - 1]
                pos -= 1
        mins = temp
    items = items[:k]
    while len(items) < k:
        a = best_of(q, taken, scores, range(A))
        if a is None:
            break
        items.append(q[a][taken[a]])
        taken[a] += 1
    return items


def reference(scores, groups, p, k, algorithm):
    if algorithm == "detconstsort":
        return reference_constsort(list(scores), list(groups), list(p), k)
    return reference_det(list(scores), list(groups), list(p), k, algorithm)


def random_lists(seed, n_lists, n, n_groups, ties=False, zero_p=False):
    rng = np.random.default_rng(seed)
    scores = rng.random((n_lists, n))
    if ties:
        scores = np.round(scores * 4) / 4
    groups = rng.integers(0, n_groups, size=(n_lists, n))
    groups[:, rng.random(n) < 0.1] = -1  # padding
    p = rng.random((n_lists, n_groups)) + 0.01
    if zero_p:
        p[:, 0] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    return scores, groups, p


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("ties, zero_p", [(False, False), (True, False), (False, True)])
def test_each_algorithm_equals_the_scalar_reference(algorithm, ties, zero_p):
    for n_groups in (2, 3, 5, 10):
        scores, groups, p = random_lists(n_groups, 40, 30, n_groups, ties, zero_p)
        for k in (1, 7, 30, 40):
            got = rerank(scores, groups, p, k, algorithm)
            for i in range(scores.shape[0]):
                want = reference(scores[i], groups[i], p[i], k, algorithm)
                assert got[i][got[i] >= 0].tolist() == want, (algorithm, n_groups, k, i)
                assert (got[i][len(want) :] == -1).all()


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    n_groups=st.integers(2, 10),
    k=st.integers(1, 60),
    algorithm=st.sampled_from(ALGORITHMS),
)
def test_feasibility_guarantees(seed, n_groups, k, algorithm):
    """With k candidates of every group, DetCons, DetRelaxed and DetConstSort are always feasible
    (InfeasibleIndex 0), DetGreedy for at most 3 groups; every prefix stays below its ceiling for
    Algorithm 1; the output is k distinct candidates."""
    rng = np.random.default_rng(seed)
    scores = rng.random((1, k * n_groups))
    groups = np.repeat(np.arange(n_groups), k)[None, :]
    rng.shuffle(groups[0])
    p = rng.dirichlet(np.ones(n_groups))[None, :]
    out = rerank(scores, groups, p, k, algorithm)
    assert len(set(out[0].tolist())) == k and (out >= 0).all()
    ranked = groups[0][out[0]][None, :]
    if algorithm != "detgreedy" or n_groups <= 3:
        assert infeasible_index(ranked, p)[0] == 0
    if algorithm != "detconstsort":
        counts = np.cumsum(ranked[0][:, None] == np.arange(n_groups), axis=0)
        ceil_ = np.ceil(np.arange(1, k + 1)[:, None] * p[0] - TOL)
        assert (counts <= ceil_).all()


def test_detgreedy_is_infeasible_with_many_groups_but_the_others_are_not():
    """The paper's simulation in miniature: |A| = 8, top 100 of 100 candidates per group."""
    rng = np.random.default_rng(0)
    n_groups, k, n_lists = 8, 100, 200
    groups = np.tile(np.repeat(np.arange(n_groups), 100), (n_lists, 1))
    scores = rng.random(groups.shape)
    p = rng.random((n_lists, n_groups))
    p /= p.sum(axis=1, keepdims=True)
    infeasible = {}
    for algorithm in ALGORITHMS:
        out = rerank(scores, groups, p, k, algorithm)
        ranked = np.take_along_axis(groups, out, axis=1)
        infeasible[algorithm] = infeasible_index(ranked, p).mean()
    assert infeasible["detgreedy"] > 0
    assert infeasible["detcons"] == infeasible["detrelaxed"] == infeasible["detconstsort"] == 0


def test_groups_that_run_out_and_lists_shorter_than_k():
    scores = np.array([[0.9, 0.8, 0.7, 0.6, -1.0]])
    groups = np.array([[0, 0, 0, 1, -1]])
    for algorithm in ALGORITHMS:
        out = rerank(scores, groups, [0.2, 0.8], 6, algorithm)
        assert sorted(out[0][:4].tolist()) == [0, 1, 2, 3] and out[0][4:].tolist() == [-1, -1]
    # Group 1 has p = 1 but only one candidate: it goes first, then group 0 fills the rest.
    out = rerank(scores, groups, [0.0, 1.0], 3, "detconstsort")
    assert out[0].tolist() == [3, 0, 1]


def test_metrics_against_hand_computed_values():
    ranked = np.array([[0, 0, 1, -1]])
    p = np.array([0.5, 0.5])
    s = skew(ranked, p)
    assert np.allclose(s[0], [math.log((2 / 3) / 0.5), math.log((1 / 3) / 0.5)])
    assert skew(ranked, p, k=2)[0, 1] == -np.inf
    assert np.isclose(skew(ranked, p, k=2, smoothing=1.0)[0, 1], math.log((1 / 4) / 0.5))
    # NDKL: KL of the top-1 (1, 0), top-2 (1, 0), top-3 (2/3, 1/3) against (1/2, 1/2).
    kl = [math.log(2), math.log(2), 2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3)]
    w = [1 / math.log2(i + 1) for i in (1, 2, 3)]
    assert np.isclose(ndkl(ranked, p)[0], sum(a * b for a, b in zip(kl, w)) / sum(w))
    # floor(i/2): prefix 2 needs one of each (has 0 of group 1); prefixes 1 and 3 are fine.
    assert infeasible_index(ranked, p)[0] == 1
    m = ranking_metrics(ranked, p)
    assert np.isclose(m["max_skew"][0], s[0].max()) and np.isclose(m["min_skew"][0], s[0].min())
    assert np.isclose(
        ndcg([[3.0, 1.0]], [[1.0, 3.0, 2.0]])[0], (3 + 1 / math.log2(3)) / (3 + 2 / math.log2(3))
    )
    zero = skew(np.array([[1, 1]]), [0.0, 1.0])
    assert np.isnan(zero[0, 0]) and zero[0, 1] == 0.0


@pytest.mark.parametrize(
    "p, match",
    [
        ([0.5, 0.6], "sums to 1.1, not 1"),
        ([1.2, -0.2], "negative share -0.2 for group 1"),
        ([1.0], "List 0 has group 1 at candidate 1, which the desired distribution does not cover"),
    ],
)
def test_bad_input_is_named(p, match):
    with pytest.raises(FairpipeInputError, match=match):
        rerank([[0.5, 0.4]], [[0, 1]], p, 2)


def test_bad_scores_and_parameters():
    with pytest.raises(FairpipeInputError, match="List 1 has a NaN score at candidate 0"):
        rerank([[0.5, 0.4], [np.nan, 0.1]], [[0, 1], [0, 1]], [0.5, 0.5], 2)
    with pytest.raises(FairpipeInputError, match="'algorithm' parameter of rerank"):
        rerank([[0.5]], [[0]], [1.0], 1, "greedy")
    with pytest.raises(FairpipeInputError, match="'k' parameter of rerank"):
        rerank([[0.5]], [[0]], [1.0], 0)
    with pytest.raises(FairpipeInputError, match="of list 1 sums to 0.5"):
        rerank([[0.5], [0.4]], [[0], [0]], [[1.0], [0.5]], 1)


@pytest.mark.parametrize("smoothing", [0.0, 0.5])
def test_compiled_metrics_equal_the_numpy_definitions(smoothing):
    scores, groups, p = random_lists(11, 300, 40, 4, zero_p=False)
    p[:50, 1] = 0.0  # some groups with no desired share
    p /= p.sum(axis=1, keepdims=True)
    out = rerank(scores, groups, p, 30, "detgreedy")
    ranked = np.where(out >= 0, np.take_along_axis(groups, np.maximum(out, 0), axis=1), -1)
    ranked[:5, 10:] = -1  # shorter rankings
    for k in (None, 7):
        m = ranking_metrics(ranked, p, k=k, smoothing=smoothing)
        want = skew(ranked, p, k, smoothing)
        assert np.array_equal(np.isnan(m["skew"]), np.isnan(want))
        assert np.allclose(m["skew"], want, equal_nan=True, rtol=1e-12, atol=1e-12)
        assert np.allclose(m["ndkl"], ndkl(ranked, p), rtol=1e-9, atol=1e-12)
        assert np.array_equal(m["infeasible_index"], infeasible_index(ranked, p))


@pytest.mark.parametrize("algorithm", ["detgreedy", "detconstsort"])
def test_a_large_batch_split_over_threads_equals_each_list_alone(algorithm):
    scores, groups, p = random_lists(5, 15000, 30, 4)  # 450k candidates: split over threads
    together = rerank(scores, groups, p, 12, algorithm)
    for i in range(0, 15000, 1499):
        alone = rerank(scores[i : i + 1], groups[i : i + 1], p[i : i + 1], 12, algorithm)
        assert np.array_equal(together[i], alone[0])


def exact_detcons(scores, groups, shares, k):
    """DetCons in exact arithmetic (``shares`` are Fractions)."""
    return reference_det(scores, groups, shares, k, "detcons", floor=math.floor, ceil=math.ceil)


def test_detcons_ties_are_decided_by_the_next_score_not_by_rounding():
    from fractions import Fraction

    # p = (0.56, 0.44): at position 24 (13 and 10 taken) both groups have ceil(j p_a) / p_a = 25
    # exactly, but in floats 14 / 0.56 = 24.999999999999996 < 11 / 0.44 = 25.0. Group 1's next
    # candidate scores higher, so it must take the position.
    scores = [1.0 - 0.01 * i for i in range(13)] + [1.0 - 0.01 * i for i in range(10)]
    scores += [0.1, 0.9]  # group 0's 14th candidate, group 1's 11th
    groups = [0] * 13 + [1] * 10 + [0, 1]
    order = np.argsort([-s for s in scores], kind="stable")
    S, G = np.array(scores)[order], np.array(groups)[order]
    got = rerank(S[None], G[None], [0.56, 0.44], k=24, algorithm="detcons")[0]
    want = exact_detcons(list(S), list(G), [Fraction(56, 100), Fraction(44, 100)], 24)
    assert got.tolist() == want
    assert G[got[-1]] == 1 and S[got[-1]] == 0.9


def test_detcons_equals_an_exact_fraction_reference_on_random_lists():
    from fractions import Fraction

    rng = np.random.default_rng(13)
    n_lists, n = 2000, 40
    scores = rng.random((n_lists, n)).round(2)  # ties between scores too
    groups = rng.integers(0, 2, size=(n_lists, n))
    hundredths = rng.integers(1, 100, size=n_lists)
    p = np.stack([hundredths / 100, 1 - hundredths / 100], axis=1)
    got = rerank(scores, groups, p, k=30, algorithm="detcons")
    for i in range(n_lists):
        shares = [Fraction(int(hundredths[i]), 100), Fraction(100 - int(hundredths[i]), 100)]
        want = exact_detcons(list(scores[i]), list(groups[i]), shares, 30)
        assert got[i, : len(want)].tolist() == want, (i, hundredths[i])
