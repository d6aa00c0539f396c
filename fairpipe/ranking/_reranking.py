"""Fairness-aware re-ranking: DetGreedy, DetCons, DetRelaxed and DetConstSort, many lists at once.

Geyik, Ambler, Kenthapadi, "Fairness-Aware Ranking in Search & Recommendation Systems with
Application to LinkedIn Talent Search" (KDD 2019), Algorithms 1 and 2, for any number of groups.
A desired distribution p over the groups asks that each prefix of length j hold at least
floor(j p_a) and at most ceil(j p_a) candidates of group a.

- Each group's candidates are taken best score first (ties: the earlier candidate).
- **DetGreedy / DetCons / DetRelaxed** fill position j = 1..k: if some groups are below their
  minimum floor(j p_a), the best next candidate among them; otherwise among the groups below their
  maximum ceil(j p_a): the best next candidate (DetGreedy), the group minimising ceil(j p_a) / p_a
  (DetCons), or the best next candidate among the groups minimising ceil(ceil(j p_a) / p_a)
  (DetRelaxed). Ties between groups: the better next score, then the lower group number; values
  of ceil(j p_a) / p_a within the tolerance below of each other are ties.
- **DetConstSort** grows j; whenever floor(j p_a) rises for some groups, their next candidates are
  appended (best first) with deadline j and each is moved up past items with lower scores whose own
  deadline allows them to move one place down. The deadline is a 1-based position compared with
  1-based positions (implementations that compare it with 0-based positions let an item slip past
  its deadline and lose the feasibility guarantee). j jumps straight to the next rise, so a tiny
  p_a costs nothing.

Defined behaviour where the paper is silent:

- **A group runs out of candidates**: it is skipped (its bounds can no longer be met; the metrics
  show it). If no group that the rule allows has a candidate left, the position takes the best
  remaining candidate of any group, so the output is as long as it can be: min(k, list length).
- **p_a = 0**: the group's bounds are 0, so it is only used when every other group has run out.
  Tiny p_a works as any other (DetCons divides only by p_a of groups below their maximum, which is
  positive).
- floor and ceil of j p_a are taken with a 1e-9 tolerance (floor(x + 1e-9), ceil(x - 1e-9)), so
  that 0.29 * 100 = 28.999999999999996 counts as 29, as it should.

The kernels run one compiled loop per list, over the lists of a batch (arrays lists x candidates,
padded with group -1); large batches are split over threads (each list is solved alone, so the
split changes nothing).

>>> scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]])
>>> groups = np.array([[0, 0, 0, 0, 1, 1]])
>>> rerank(scores, groups, [0.5, 0.5], k=4, algorithm="detgreedy").tolist()
[[0, 4, 1, 5]]
"""

from __future__ import annotations

import math

import numpy as np

from fairpipe.errors import FairpipeInputError, check_one_of, check_positive_int
from fairpipe.parallel import THREADS, compiled, thread_pool
from fairpipe.settings import ALGORITHMS

TOL = 1e-9
_WORK_PER_THREAD = 200_000  # candidates below which one thread re-ranks the whole batch

NAN_SCORE = "List {list} has a NaN score at candidate {pos}; scores must be numbers."
UNKNOWN_GROUP = (
    "List {list} has group {group} at candidate {pos}, which the desired distribution does not "
    "cover (it has {n} groups, numbered 0 to {last})."
)
BAD_P_NEGATIVE = "The desired distribution{where} has a negative share {value} for group {group}."
BAD_P_NAN = "The desired distribution{where} has the share {value} for group {group}; shares are numbers >= 0."
BAD_P_SUM = "The desired distribution{where} sums to {total}, not 1."
SHAPES = "{what} must have shape {expected}. Got {got}."


@compiled
def _floor(x):
    return math.floor(x + TOL)


@compiled
def _ceil(x):
    return math.ceil(x - TOL)


@compiled
def _queues(scores, groups, n_groups):
    """Candidates by group, best score first (ties: earlier candidate): (order, start, size)."""
    n = scores.shape[0]
    size = np.zeros(n_groups, dtype=np.int64)
    for i in range(n):
        if groups[i] >= 0:
            size[groups[i]] += 1
    start = np.zeros(n_groups + 1, dtype=np.int64)
    for a in range(n_groups):
        start[a + 1] = start[a] + size[a]
    order = np.empty(start[n_groups], dtype=np.int64)
    fill = start[:n_groups].copy()
    by_score = np.argsort(-scores, kind="mergesort")  # stable: ties keep candidate order
    for i in by_score:
        a = groups[i]
        if a >= 0:
            order[fill[a]] = i
            fill[a] += 1
    return order, start, size


@compiled
def _best_next(scores, order, start, taken, size, allowed):
    """The allowed group with a candidate left whose next candidate scores best (-1: none)."""
    best, best_s = -1, -np.inf
    for a in range(size.shape[0]):
        if allowed[a] and taken[a] < size[a]:
            s = scores[order[start[a] + taken[a]]]
            if best < 0 or s > best_s:
                best, best_s = a, s
    return best


@compiled
def _rerank_one(scores, groups, p, k, algorithm, out):
    """Algorithm 1 of the paper (algorithm 0, 1, 2: DetGreedy, DetCons, DetRelaxed) on one list;
    writes candidate indices into ``out`` (-1 after the end) and returns how many."""
    n_groups = p.shape[0]
    order, start, size = _queues(scores, groups, n_groups)
    taken = np.zeros(n_groups, dtype=np.int64)
    allowed = np.zeros(n_groups, dtype=np.bool_)
    for j in range(k):
        out[j] = -1
    filled = 0
    for j in range(1, k + 1):
        any_min = False
        for a in range(n_groups):
            allowed[a] = taken[a] < _floor(j * p[a])
            any_min = any_min or (allowed[a] and taken[a] < size[a])
        if any_min:
            best = _best_next(scores, order, start, taken, size, allowed)
        else:
            for a in range(n_groups):
                allowed[a] = taken[a] < _ceil(j * p[a]) and taken[a] < size[a]
            if algorithm == 0:
                best = _best_next(scores, order, start, taken, size, allowed)
            else:
                key = np.inf
                for a in range(n_groups):
                    if allowed[a]:
                        v = _ceil(j * p[a]) / p[a]
                        if algorithm == 2:
                            v = float(math.ceil(v - TOL))
                        key = min(key, v)
                for a in range(n_groups):
                    if allowed[a]:
                        v = _ceil(j * p[a]) / p[a]
                        if algorithm == 2:
                            v = float(math.ceil(v - TOL))
                        # Within the floor/ceil tolerance: 14 / 0.56 = 24.999999999999996 and
                        # 11 / 0.44 = 25.0 tie, and the better next score decides.
                        allowed[a] = v - key <= TOL
                best = _best_next(scores, order, start, taken, size, allowed)
        if best < 0:  # the rule allows only groups that ran out: the best candidate left
            for a in range(n_groups):
                allowed[a] = True
            best = _best_next(scores, order, start, taken, size, allowed)
        if best < 0:
            break
        out[j - 1] = order[start[best] + taken[best]]
        taken[best] += 1
        filled += 1
    return filled


@compiled
def _constsort_one(scores, groups, p, k, out):
    """Algorithm 2 of the paper (DetConstSort) on one list, with 1-based deadlines."""
    n_groups = p.shape[0]
    order, start, size = _queues(scores, groups, n_groups)
    taken = np.zeros(n_groups, dtype=np.int64)
    mins = np.zeros(n_groups, dtype=np.int64)
    cap = k + n_groups
    items = np.full(cap, -1, dtype=np.int64)
    item_s = np.zeros(cap)
    deadline = np.zeros(cap, dtype=np.int64)
    changed = np.zeros(n_groups, dtype=np.bool_)
    last = 0
    j = 0
    while last < k:
        # The next j at which floor(j p_a) rises for a group with candidates left.
        nxt = -1
        for a in range(n_groups):
            if p[a] > 0 and taken[a] < size[a]:
                t = max(j + 1, math.ceil((mins[a] + 1 - TOL) / p[a]))
                while t > j + 1 and _floor((t - 1) * p[a]) > mins[a]:
                    t -= 1
                while _floor(t * p[a]) <= mins[a]:
                    t += 1
                if nxt < 0 or t < nxt:
                    nxt = t
        if nxt < 0:
            break
        j = nxt
        for a in range(n_groups):
            m = _floor(j * p[a])
            changed[a] = m > mins[a] and taken[a] < size[a]
            mins[a] = m
        while last < cap:  # changed groups, best next candidate first
            a = _best_next(scores, order, start, taken, size, changed)
            if a < 0:
                break
            changed[a] = False
            c = order[start[a] + taken[a]]
            taken[a] += 1
            items[last], item_s[last], deadline[last] = c, scores[c], j
            pos = last  # 0-based; the item above is at pos - 1 and would move to 1-based pos + 1
            while pos > 0 and deadline[pos - 1] >= pos + 1 and item_s[pos - 1] < item_s[pos]:
                items[pos - 1], items[pos] = items[pos], items[pos - 1]
                item_s[pos - 1], item_s[pos] = item_s[pos], item_s[pos - 1]
                deadline[pos - 1], deadline[pos] = deadline[pos], deadline[pos - 1]
                pos -= 1
            last += 1
    filled = min(last, k)
    for i in range(k):
        out[i] = items[i] if i < filled else -1
    # No group with a positive share has candidates left: the best remaining candidates follow.
    allowed = np.ones(n_groups, dtype=np.bool_)
    while filled < k:
        a = _best_next(scores, order, start, taken, size, allowed)
        if a < 0:
            break
        out[filled] = order[start[a] + taken[a]]
        taken[a] += 1
        filled += 1
    return filled


@compiled
def _rerank_batch(scores, groups, p, k, algorithm, out, lengths):
    for i in range(scores.shape[0]):
        if algorithm == 3:
            lengths[i] = _constsort_one(scores[i], groups[i], p[i], k, out[i])
        else:
            lengths[i] = _rerank_one(scores[i], groups[i], p[i], k, algorithm, out[i])


def check_desired(p, n_lists: int, n_groups: int | None = None) -> np.ndarray:
    """The desired distribution as (n_lists, n_groups) float64, or an error naming the list."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim == 1:
        p = np.broadcast_to(p, (n_lists, p.shape[0]))
    if p.ndim != 2 or p.shape[0] != n_lists or (n_groups is not None and p.shape[1] != n_groups):
        raise FairpipeInputError(
            SHAPES.format(what="The desired distribution", expected="(groups,) or (lists, groups)",
                          got=p.shape)
        )  # fmt: skip
    bad = np.argwhere(~((p >= 0) & np.isfinite(p)))  # negative, NaN or infinite
    if bad.size:
        i, a = bad[0]
        where = "" if p.shape[0] == 1 else f" of list {int(i)}"
        value = float(p[i, a])
        template = BAD_P_NEGATIVE if value < 0 and math.isfinite(value) else BAD_P_NAN
        raise FairpipeInputError(template.format(where=where, value=value, group=int(a)))
    total = p.sum(axis=1)
    off = np.flatnonzero(np.abs(total - 1.0) > 1e-6)
    if off.size:
        i = int(off[0])
        where = "" if n_lists == 1 else f" of list {i}"
        raise FairpipeInputError(BAD_P_SUM.format(where=where, total=float(total[i])))
    return np.ascontiguousarray(p)


def check_lists(scores, groups, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores (lists, candidates) float64 and groups int64 (-1 = no candidate), checked."""
    scores = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    groups = np.atleast_2d(np.asarray(groups))
    if groups.shape != scores.shape:
        raise FairpipeInputError(
            SHAPES.format(what="groups", expected=scores.shape, got=groups.shape)
        )
    groups = groups.astype(np.int64)
    real = groups >= 0
    nan = np.argwhere(np.isnan(scores) & real)
    if nan.size:
        raise FairpipeInputError(NAN_SCORE.format(list=int(nan[0, 0]), pos=int(nan[0, 1])))
    unknown = np.argwhere(groups >= n_groups)
    if unknown.size:
        i, j = unknown[0]
        raise FairpipeInputError(
            UNKNOWN_GROUP.format(list=int(i), group=int(groups[i, j]), pos=int(j), n=n_groups,
                                 last=n_groups - 1)
        )  # fmt: skip
    return np.ascontiguousarray(scores), np.ascontiguousarray(groups)


def rerank(scores, groups, p, k: int, algorithm: str = "detconstsort") -> np.ndarray:
    """Re-rank every list (a row of ``scores``/``groups``; group -1 marks padding) toward the
    desired distribution ``p`` ((groups,) for all lists or (lists, groups)). Returns the top-k
    candidate indices of each list, in rank order, padded with -1 where a list has fewer than k."""
    check_one_of(algorithm, ALGORITHMS, "algorithm", "rerank")
    k = check_positive_int(k, "k", "rerank")
    p_arr = np.asarray(p, dtype=np.float64)
    n_groups = p_arr.shape[-1]
    scores, groups = check_lists(scores, groups, n_groups)
    p_arr = check_desired(p_arr, scores.shape[0], n_groups)
    out = np.full((scores.shape[0], k), -1, dtype=np.int64)
    lengths = np.zeros(scores.shape[0], dtype=np.int64)
    code = ALGORITHMS.index(algorithm)
    n = scores.shape[0]
    threads = min(THREADS, n * scores.shape[1] // _WORK_PER_THREAD)
    if threads <= 1:
        _rerank_batch(scores, groups, p_arr, k, code, out, lengths)
        return out
    cuts = np.linspace(0, n, threads + 1).astype(np.int64)  # each list is solved alone: any split
    jobs = [
        thread_pool().submit(_rerank_batch, scores[a:b], groups[a:b], p_arr[a:b], k, code, out[a:b],
                       lengths[a:b])
        for a, b in zip(cuts[:-1], cuts[1:])
    ]  # fmt: skip
    for job in jobs:
        job.result()
    return out
