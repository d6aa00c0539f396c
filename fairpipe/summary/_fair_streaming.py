"""Fair streaming submodular maximisation (FSM) and its baselines, on one stream.

Groups c = 0..C-1 partition the elements; a summary S of at most k elements is **feasible** if
l_c <= |S n V_c| <= u_c for every group, and **extendable** if |S n V_c| <= u_c for every group
and sum_c max(|S n V_c|, l_c) <= k. Extendable sets form a matroid (El Halabi, Mitrovic,
Norouzi-Fard, Tardos, Tarnawski, NeurIPS 2020, Definition 2).

FSM runs a Chakrabarti-Kale streaming algorithm on that matroid: an arriving element e gets weight
w(e), its marginal gain over every element ever accepted (one gain evaluation); it enters if S + e
is independent, else it replaces the lightest element s of the circuit of S + e when
w(e) >= factor * w(s) (factor 2: a 1/4-approximation for monotone f). The circuit is the elements
of e's group when that group is at its upper bound, else e's group plus every group above its
lower bound (removing one of those frees a slot of the k). In parallel it keeps, per group, a
backup set B_c of the l_c elements of that group with the largest weights; at the end each group
short of l_c is completed greedily from its backups. Because S stayed extendable, this never
breaks k or an upper bound: error(S) = 0 whenever the bounds are feasible. Memory O(k + sum l_c).

Checking only the upper bounds and k (the baseline **MSM**, the same streaming algorithm on the
partition matroid) lets over-represented groups fill k; the lower bounds then fail.

Baselines: ``msm_stream``, ``random_subset`` and ``fair_greedy`` (offline lazy greedy on the
extendable-set matroid: a basis of it is feasible, so it is the reference utility).

>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(500, 3)); groups = (np.arange(500) % 50 == 0).astype(np.int64)
>>> res = fair_stream(X, groups, lower=[2, 2], upper=[8, 8], k=8, utility="exemplar")
>>> res.counts.tolist(), res.error
([6, 2], 0)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from fairpipe.errors import (
    K_TOO_LARGE,
    FairpipeInputError,
    check_positive_float,
    check_positive_int,
    plain,
)
from fairpipe.parallel import compiled
from fairpipe.summary._utilities import (
    Utility,
    absorb,
    base_scores,
    gain,
    set_scores,
    sq_dists,
    to_score,
    value_of,
)
from fairpipe.validation import check_points

NEGATIVE_BOUND = (
    "The {which} bound of group {name} must be a non-negative integer. Got {value} instead."
)
LOWER_ABOVE_UPPER = (
    "Group {name} has lower bound {lower} above its upper bound {upper}; no summary can meet both."
)
LOWER_SUM = (
    "The lower bounds add up to {total} (groups {detail}), more than k = {k}; no summary of at "
    "most k elements can meet them."
)
TOO_FEW = (
    "Group {name} has {count} elements in the data but its lower bound is {lower}; no summary can "
    "meet it."
)
BOUNDS_LENGTH = "{which} bounds were given for {got} groups; the data has {expected} groups."
BAD_GROUP = (
    "Row {row} of {where} has group {value}; groups must be integers from 0 to {last} "
    "(one per bound)."
)
GROUPS_LENGTH = "{where} got {got} groups for {n} elements; one group per element is needed."


@dataclass
class SelectionResult:
    """A selected summary of one stream (rows index the stream as given)."""

    rows: np.ndarray  # selected rows, in stream order
    value: float  # f(S) on the utility's evaluation points
    counts: np.ndarray  # elements of each group in S
    calls: int  # marginal-gain (oracle) evaluations
    error: int  # sum over groups of lower- and upper-bound violations
    candidates: np.ndarray  # S plus the backups: what a parent node streams (stream order)


def bound_error(counts, lower, upper) -> int:
    """error(S): elements missing below the lower bounds plus elements above the upper bounds."""
    counts, lower, upper = (np.asarray(a, dtype=np.int64) for a in (counts, lower, upper))
    return int(np.maximum(lower - counts, 0).sum() + np.maximum(counts - upper, 0).sum())


def check_bounds(k, lower, upper, counts=None, names=None) -> tuple[np.ndarray, np.ndarray]:
    """Bounds as int64 arrays, or an error naming the group and why they cannot be met.

    ``counts`` (elements of each group in the data), when given, must reach every lower bound.
    """
    k = check_positive_int(k, "k", "the summary")
    lower_l, upper_l = list(np.atleast_1d(lower)), list(np.atleast_1d(upper))
    if len(lower_l) != len(upper_l):
        raise FairpipeInputError(
            BOUNDS_LENGTH.format(which="Upper", got=len(upper_l), expected=len(lower_l))
        )
    names = [str(c) for c in range(len(lower_l))] if names is None else [str(n) for n in names]
    out = []
    for which, values in (("lower", lower_l), ("upper", upper_l)):
        for name, value in zip(names, values):
            if isinstance(value, (bool, np.bool_)) or not float(value).is_integer() or value < 0:
                raise FairpipeInputError(
                    NEGATIVE_BOUND.format(which=which, name=name, value=plain(value))
                )
        out.append(np.array([int(v) for v in values], dtype=np.int64))
    lo, up = out
    for name, a, b in zip(names, lo, up):
        if a > b:
            raise FairpipeInputError(LOWER_ABOVE_UPPER.format(name=name, lower=a, upper=b))
    if lo.sum() > k:
        detail = ", ".join(f"{n}: {v}" for n, v in zip(names, lo) if v)
        raise FairpipeInputError(LOWER_SUM.format(total=int(lo.sum()), detail=detail, k=k))
    if counts is not None:
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape[0] != lo.shape[0]:
            raise FairpipeInputError(
                BOUNDS_LENGTH.format(which="Lower", got=lo.shape[0], expected=counts.shape[0])
            )
        for name, c, a in zip(names, counts, lo):
            if c < a:
                raise FairpipeInputError(TOO_FEW.format(name=name, count=int(c), lower=a))
    return lo, up


def check_groups(groups, n: int, n_groups: int, where: str) -> np.ndarray:
    """Groups as int64 in [0, n_groups), or an error naming the first bad row."""
    c = np.asarray(groups)
    if c.shape != (n,):
        raise FairpipeInputError(GROUPS_LENGTH.format(where=where, got=c.size, n=n))
    if c.size and c.dtype.kind not in "iu":
        bad = np.flatnonzero(~np.isfinite(c.astype(float)) | (c != np.round(c)))
        if bad.size:
            raise FairpipeInputError(
                BAD_GROUP.format(
                    row=int(bad[0]) + 1, where=where, value=plain(c[bad[0]]), last=n_groups - 1
                )  # fmt: skip
            )
    c = c.astype(np.int64)
    bad = np.flatnonzero((c < 0) | (c >= n_groups))
    if bad.size:
        raise FairpipeInputError(
            BAD_GROUP.format(
                row=int(bad[0]) + 1, where=where, value=int(c[bad[0]]), last=n_groups - 1
            )  # fmt: skip
        )
    return c


# -- compiled kernels (valid input assumed) --------------------------------------------------------
@compiled
def _rescan(base, scores, size, v, best1, best2, owner):
    """Best and second-best cost of evaluation point v over the base and the members."""
    b1, b2, o = base[v], np.inf, -1
    for t in range(size):
        x = scores[t, v]
        if x < b1:
            b1, b2, o = x, b1, t
        elif x < b2:
            b2 = x
    best1[v], best2[v], owner[v] = b1, b2, o


@compiled
def _replace(base, scores, size, j, new, best1, best2, owner):
    """Member j's costs become ``new``: update the best and second-best of every point, rescanning
    only the points where j was the best or the runner-up (the same costs as a full rescan; of
    tied members, the one already best stays the owner)."""
    for v in range(base.shape[0]):
        old = scores[j, v]
        scores[j, v] = new[v]
        if owner[v] == j or old == best2[v]:
            _rescan(base, scores, size, v, best1, best2, owner)
        elif new[v] < best1[v]:
            best2[v], best1[v], owner[v] = best1[v], new[v], j
        elif new[v] < best2[v]:
            best2[v] = new[v]


@compiled
def _stream(kind, gamma, ET, X, group, lower, upper, k, factor, fair, swap):
    """One pass on the extendable-set matroid (``fair``) or on the partition matroid of the upper
    bounds and k (MSM). ``swap`` False: Chakrabarti-Kale (weights = gains over every element ever
    accepted; swap the circuit's lightest when outweighed ``factor`` times). ``swap`` True: gains
    over the current S; swap in the element for the circuit member whose exchange raises f(S) most,
    when it does. Returns (members, weights, backups (C, max l) padded with -1, backups per group,
    gain evaluations, swaps)."""
    n, m = X.shape[0], ET.shape[1]
    n_groups = lower.shape[0]
    base = base_scores(kind, ET)
    cur = base.copy()  # CK: best cost over every element ever accepted; swap: over S
    best2 = np.full(m, np.inf)
    owner = np.full(m, -1, dtype=np.int64)
    scores = np.empty((k, m)) if swap else np.empty((0, m))
    loss = np.zeros(k)
    score = np.empty(m)
    members = np.full(k, -1, dtype=np.int64)
    weights = np.zeros(k)
    counts = np.zeros(n_groups, dtype=np.int64)
    width = 1
    for c in range(n_groups):
        width = max(width, lower[c])
    backups = np.full((n_groups, width), -1, dtype=np.int64)
    backup_w = np.zeros((n_groups, width))
    n_backups = np.zeros(n_groups, dtype=np.int64)
    used = 0  # sum_c max(count_c, lower_c): slots of the k taken or reserved
    for c in range(n_groups):
        used += lower[c]
    size = 0
    calls = 0
    swaps = 0
    for i in range(n):
        c = group[i]
        sq_dists(ET, X[i], score)
        to_score(kind, gamma, score)
        g = gain(kind, cur, score) / m
        calls += 1
        if fair and lower[c] > 0:  # the backup set keeps the l_c heaviest of group c
            if n_backups[c] < lower[c]:
                backups[c, n_backups[c]] = i
                backup_w[c, n_backups[c]] = g
                n_backups[c] += 1
            else:
                j = 0
                for t in range(1, lower[c]):
                    if backup_w[c, t] < backup_w[c, j]:
                        j = t
                if g > backup_w[c, j]:
                    backups[c, j] = i
                    backup_w[c, j] = g
        if g <= 0.0:
            continue  # adds nothing (a duplicate of accepted elements)
        grows = 1 if counts[c] >= lower[c] else 0
        if fair:
            fits = counts[c] < upper[c] and used + grows <= k
        else:
            fits = counts[c] < upper[c] and size < k
        if fits:
            members[size] = i
            weights[size] = g
            if swap:
                scores[size, :] = score
                for v in range(m):
                    x = score[v]
                    if x < cur[v]:
                        best2[v], cur[v], owner[v] = cur[v], x, size
                    elif x < best2[v]:
                        best2[v] = x
            else:
                absorb(kind, cur, score)
            size += 1
            counts[c] += 1
            if fair:
                used += grows
            continue
        # S + e is dependent: a member of its circuit may make way.
        full_group = counts[c] >= upper[c]
        if swap:  # loss[t]: what f loses when member t leaves and e joins (beyond e's gain)
            for t in range(size):
                loss[t] = 0.0
            for v in range(m):
                o = owner[v]
                if o >= 0:
                    x = score[v]
                    loss[o] += min(best2[v], x) - min(cur[v], x)
        j = -1
        for t in range(size):
            ct = group[members[t]]
            if full_group or not fair:
                in_circuit = ct == c or not full_group
            else:
                in_circuit = ct == c or counts[ct] > lower[ct]
            if not in_circuit:
                continue
            if swap:
                if j < 0 or loss[t] < loss[j]:
                    j = t
            elif j < 0 or weights[t] < weights[j]:
                j = t
        if j < 0:
            continue
        if swap:
            if g - loss[j] / m <= 0.0:
                continue
        elif g < factor * weights[j]:
            continue
        out_c = group[members[j]]
        if out_c != c:
            if fair:
                used -= 1  # out_c was above its lower bound (circuit rule)
                used += grows
            counts[out_c] -= 1
            counts[c] += 1
        members[j] = i
        weights[j] = g
        swaps += 1
        if swap:
            _replace(base, scores, size, j, score, cur, best2, owner)
        else:
            absorb(kind, cur, score)
    return members[:size], weights[:size], backups, n_backups, calls, swaps


@compiled
def _extend(kind, gamma, ET, X, group, members, backups, n_backups, lower):
    """Complete every group short of its lower bound from its backups, greedily by marginal gain
    over the final S. Returns (members, gain evaluations)."""
    m, n_groups = ET.shape[1], lower.shape[0]
    counts = np.zeros(n_groups, dtype=np.int64)
    for t in range(members.shape[0]):
        counts[group[members[t]]] += 1
    deficit = 0
    for c in range(n_groups):
        deficit += max(lower[c] - counts[c], 0)
    if deficit == 0:
        return members, 0
    cur = set_scores(kind, gamma, ET, X, members, members.shape[0])
    chosen = np.zeros(X.shape[0], dtype=np.bool_)
    for t in range(members.shape[0]):
        chosen[members[t]] = True
    out = np.empty(members.shape[0] + deficit, dtype=np.int64)
    out[: members.shape[0]] = members
    size = members.shape[0]
    score = np.empty(m)
    calls = 0
    for _ in range(deficit):
        best, best_g = -1, -1.0
        for c in range(n_groups):
            if counts[c] >= lower[c]:
                continue
            for j in range(n_backups[c]):
                r = backups[c, j]
                if chosen[r]:
                    continue
                sq_dists(ET, X[r], score)
                to_score(kind, gamma, score)
                g = gain(kind, cur, score)
                calls += 1
                if g > best_g or (g == best_g and r < best):
                    best, best_g = r, g
        if best < 0:
            break
        sq_dists(ET, X[best], score)
        to_score(kind, gamma, score)
        absorb(kind, cur, score)
        chosen[best] = True
        counts[group[best]] += 1
        out[size] = best
        size += 1
    return out[:size], calls


@compiled
def _greedy(kind, gamma, ET, X, group, lower, upper, k):
    """Offline lazy greedy on the extendable-set matroid (a heap of stale gains; ties: the lowest
    row). Returns (members, gain evaluations)."""
    n, m, n_groups = X.shape[0], ET.shape[1], lower.shape[0]
    cur = base_scores(kind, ET)
    score = np.empty(m)
    stamp = np.zeros(n, dtype=np.int64)  # |S| when the heap entry of row i was computed
    heap = []
    for i in range(n):
        sq_dists(ET, X[i], score)
        to_score(kind, gamma, score)
        heap.append((-gain(kind, cur, score), i))
    heapq.heapify(heap)
    calls = n
    counts = np.zeros(n_groups, dtype=np.int64)
    used = 0
    for c in range(n_groups):
        used += lower[c]
    out = np.empty(k, dtype=np.int64)
    size = 0
    while size < k and len(heap) > 0:
        _, best = heapq.heappop(heap)
        c = group[best]
        grows = 1 if counts[c] >= lower[c] else 0
        if counts[c] >= upper[c] or used + grows > k:
            continue  # never addable again: counts and used only grow
        sq_dists(ET, X[best], score)
        to_score(kind, gamma, score)
        if stamp[best] != size:  # stale gain: refresh it and put it back
            stamp[best] = size
            calls += 1
            heapq.heappush(heap, (-gain(kind, cur, score), best))
            continue
        absorb(kind, cur, score)
        out[size] = best
        size += 1
        counts[c] += 1
        used += grows
    return out[:size], calls


# -- public functions -----------------------------------------------------------------------------
def _prepare(X, groups, lower, upper, k, utility, where, names=None):
    X = check_points(X, where=where).astype(np.float64)
    lo, up = check_bounds(k, lower, upper, names=names)
    group = check_groups(groups, X.shape[0], lo.shape[0], where)
    counts = np.bincount(group, minlength=lo.shape[0])
    check_bounds(k, lo, up, counts=counts, names=names)
    if k > X.shape[0]:
        raise FairpipeInputError(
            K_TOO_LARGE.format(name="k", k=k, n=X.shape[0], what="elements of the data")
        )
    if isinstance(utility, str):
        utility = Utility(utility, X)
    return X, group, lo, up, utility


def _result(util: Utility, X, group, rows, lower, upper, calls, candidates=None) -> SelectionResult:
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    counts = np.bincount(group[rows], minlength=lower.shape[0])
    cur = set_scores(util.kind, util.kernel_gamma, util.ET, X, rows, rows.shape[0])
    value = float(value_of(util.kind, cur, base_scores(util.kind, util.ET)))
    return SelectionResult(
        rows=rows,
        value=value,
        counts=counts,
        calls=int(calls),
        error=bound_error(counts, lower, upper),
        candidates=rows if candidates is None else candidates,
    )


def stream_kernel(X, group, lower, upper, k, util: Utility, factor=2.0, fair=True, swap=False):
    """FSM (or MSM) on a validated stream: X float64 in stream order, groups in range, any
    lower bounds (each is capped at the group's count in this stream)."""
    lower_eff = np.minimum(lower, np.bincount(group, minlength=lower.shape[0]))
    members, _, backups, n_backups, calls, _swaps = _stream(
        util.kind,
        util.kernel_gamma,
        util.ET,
        X,
        group,
        lower_eff,
        upper,
        int(k),
        float(factor),
        fair,
        swap,
    )
    if fair:
        members, more = _extend(
            util.kind, util.kernel_gamma, util.ET, X, group, members, backups, n_backups, lower_eff
        )
        calls += more
        kept = backups[backups >= 0]
        candidates = np.unique(np.concatenate([members, kept]))
    else:
        candidates = np.sort(members)
    return _result(util, X, group, members, lower, upper, calls, candidates)


def fair_stream(X, groups, lower, upper, k, utility="exemplar", factor=2.0, names=None, swap=False):
    """FSM over the rows of ``X`` in order. ``utility``: a :class:`Utility` or its name (then the
    evaluation set is ``X`` itself)."""
    X, group, lo, up, util = _prepare(X, groups, lower, upper, k, utility, "fair_stream", names)
    factor = check_positive_float(factor, "factor", "fair_stream")
    return stream_kernel(X, group, lo, up, k, util, factor, fair=True, swap=swap)


def msm_stream(X, groups, lower, upper, k, utility="exemplar", factor=2.0, names=None):
    """Baseline: the same streaming algorithm checking only the upper bounds and k."""
    X, group, lo, up, util = _prepare(X, groups, lower, upper, k, utility, "msm_stream", names)
    factor = check_positive_float(factor, "factor", "msm_stream")
    return stream_kernel(X, group, lo, up, k, util, factor, fair=False)


def fair_greedy(X, groups, lower, upper, k, utility="exemplar", names=None):
    """Baseline and reference: offline lazy greedy under the fairness constraint."""
    X, group, lo, up, util = _prepare(X, groups, lower, upper, k, utility, "fair_greedy", names)
    members, calls = _greedy(util.kind, util.kernel_gamma, util.ET, X, group, lo, up, int(k))
    return _result(util, X, group, members, lo, up, calls)


def random_subset(X, groups, lower, upper, k, utility="exemplar", seed=0, names=None):
    """Baseline: k elements drawn uniformly without replacement (groups ignored)."""
    X, group, lo, up, util = _prepare(X, groups, lower, upper, k, utility, "random_subset", names)
    rows = np.random.default_rng(seed).choice(X.shape[0], size=int(k), replace=False)
    return _result(util, X, group, rows, lo, up, 0)


def random_feasible_rows(group: np.ndarray, lower, upper, k: int, rng: np.random.Generator):
    """A uniformly random feasible selection: the rows of ``lower[c]`` random elements of every
    group c, then ``k - sum(lower)`` more drawn uniformly from the rest without passing any
    ``upper[c]`` (``group``: each row's group, -1 for a row that cannot be chosen). Sorted rows;
    fewer than k only where the groups hold too few elements. The reference a summary's utility
    is compared with: what the bounds alone give, with no selection."""
    lower, upper = np.asarray(lower, np.int64), np.asarray(upper, np.int64)
    chosen, extra = [], []
    for c in range(lower.shape[0]):
        pool = np.flatnonzero(group == c)
        draw = rng.choice(pool, size=int(min(upper[c], pool.size)), replace=False)
        chosen.append(draw[: lower[c]])
        extra.append(draw[lower[c] :])
    taken = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
    rest = np.concatenate(extra) if extra else np.zeros(0, np.int64)
    more = rng.choice(rest, size=int(min(max(k - taken.size, 0), rest.size)), replace=False)
    return np.sort(np.concatenate([taken, more]).astype(np.int64))
