"""Ranking-fairness metrics of Geyik et al. (KDD 2019), for many rankings at once.

A ranking is a row of group labels in rank order (-1 after its end, so rankings of different
lengths share one array); p is the desired distribution over the groups.

- Skew_a@k = ln((count_k(a) / k) / p_a), natural log, k the ranking's length (or a given k).
  **Zero counts**: with ``smoothing`` alpha = 0 (the paper's definition) a group absent from the
  top k has Skew -inf, and so has MinSkew; alpha > 0 uses (count + alpha) / (k + alpha |A|) instead,
  which is finite. Groups with p_a = 0 have no Skew (NaN) and are left out of MinSkew and MaxSkew.
- NDKL = (1/Z) sum_{i=1}^{|tau|} KL(D_{tau^i} || p) / log2(i + 1), Z = sum_i 1 / log2(i + 1),
  D_{tau^i} the groups' shares in the top i (0 ln 0 = 0; a group with p_a = 0 in the top i makes
  it infinite).
- InfeasibleIndex = #{i <= |tau| : some group has count_i(a) < floor(p_a i)} (floor with the
  re-rankers' 1e-9 tolerance).
- NDCG with the scores as gains: DCG of the ranking / DCG of the list's best k scores.

>>> ranked = np.array([[0, 1, 0, 1]])
>>> m = ranking_metrics(ranked, [0.5, 0.5])
>>> round(float(m["ndkl"][0]), 4), int(m["infeasible_index"][0]), float(m["max_skew"][0])
(0.2816, 0, 0.0)
"""

from __future__ import annotations

import math

import numpy as np

from fairpipe.parallel import compiled
from fairpipe.ranking._reranking import TOL


def prefix_counts(ranked: np.ndarray, n_groups: int) -> np.ndarray:
    """(lists, k, groups) int64: count_i(a) for every prefix length i = 1..k."""
    ranked = np.asarray(ranked)
    onehot = ranked[:, :, None] == np.arange(n_groups)[None, None, :]
    return np.cumsum(onehot, axis=1, dtype=np.int64)


def _p(p, n_lists: int) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return np.broadcast_to(p, (n_lists, p.shape[-1])) if p.ndim == 1 else p


def skew(ranked, p, k: int | None = None, smoothing: float = 0.0) -> np.ndarray:
    """Skew_a@k (lists, groups); k defaults to each ranking's length."""
    ranked = np.atleast_2d(np.asarray(ranked))
    p = _p(p, ranked.shape[0])
    length = (ranked >= 0).sum(axis=1)
    at = length if k is None else np.minimum(length, k)
    counts = prefix_counts(ranked, p.shape[1])
    idx = np.maximum(at - 1, 0)
    c = counts[np.arange(ranked.shape[0]), idx].astype(np.float64)
    c[at == 0] = 0.0
    a = float(smoothing)
    share = (c + a) / np.maximum(at[:, None] + a * p.shape[1], 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(share / p)
    out[np.broadcast_to(p == 0, out.shape)] = np.nan
    return out


def ndkl(ranked, p) -> np.ndarray:
    ranked = np.atleast_2d(np.asarray(ranked))
    p = _p(p, ranked.shape[0])
    k = ranked.shape[1]
    counts = prefix_counts(ranked, p.shape[1]).astype(np.float64)
    i = np.arange(1, k + 1, dtype=np.float64)
    share = counts / i[None, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(share > 0, share * np.log(share / p[:, None, :]), 0.0)
    kl = terms.sum(axis=2)
    w = 1.0 / np.log2(i + 1.0)
    valid = ranked >= 0
    return (kl * w * valid).sum(axis=1) / np.maximum((w * valid).sum(axis=1), 1e-300)


def infeasible_index(ranked, p) -> np.ndarray:
    ranked = np.atleast_2d(np.asarray(ranked))
    p = _p(p, ranked.shape[0])
    k = ranked.shape[1]
    counts = prefix_counts(ranked, p.shape[1])
    i = np.arange(1, k + 1, dtype=np.float64)
    need = np.floor(i[None, :, None] * p[:, None, :] + TOL)
    short = (counts < need).any(axis=2) & (ranked >= 0)
    return short.sum(axis=1)


def ndcg(ranked_scores, ideal_scores) -> np.ndarray:
    """NDCG of rankings (lists, k) of scores (NaN after the end) against each list's best scores
    (lists, >= k, NaN padded; any order)."""
    ranked_scores = np.atleast_2d(np.asarray(ranked_scores, dtype=np.float64))
    k = ranked_scores.shape[1]
    ideal = -np.sort(-np.nan_to_num(np.atleast_2d(ideal_scores), nan=-np.inf), axis=1)[:, :k]
    ideal = np.where(np.isfinite(ideal), ideal, 0.0)
    w = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
    dcg = (np.nan_to_num(ranked_scores, nan=0.0) * w).sum(axis=1)
    best = (ideal * w[: ideal.shape[1]]).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(best != 0, dcg / best, np.nan)


@compiled
def _metrics_batch(ranked, p, at, smoothing, skew_out, ndkl_out, infeasible_out):
    """One pass per ranking: NDKL through running sums (sum_a c_a ln c_a and sum_a c_a ln p_a),
    InfeasibleIndex by prefix, Skew at ``at[i]``."""
    n_lists, k = ranked.shape
    n_groups = p.shape[1]
    c_ln_c = np.zeros(k + 1)
    for c in range(2, k + 1):
        c_ln_c[c] = c * math.log(c)
    counts = np.zeros(n_groups, dtype=np.int64)
    ln_p = np.empty(n_groups)
    for i in range(n_lists):
        for a in range(n_groups):
            counts[a] = 0
            ln_p[a] = math.log(p[i, a]) if p[i, a] > 0 else -np.inf
        s1 = 0.0  # sum_a c_a ln c_a
        s2 = 0.0  # sum_a c_a ln p_a
        num, den = 0.0, 0.0
        short = 0
        for j in range(k):
            g = ranked[i, j]
            if g < 0:
                break
            n = j + 1
            s1 += c_ln_c[counts[g] + 1] - c_ln_c[counts[g]]
            s2 += ln_p[g]
            counts[g] += 1
            kl = (s1 - n * math.log(n) - s2) / n
            w = 1.0 / math.log2(n + 1.0)
            num += kl * w
            den += w
            for a in range(n_groups):
                if counts[a] < math.floor(n * p[i, a] + TOL):
                    short += 1
                    break
            if n == at[i]:
                for a in range(n_groups):
                    if p[i, a] == 0:
                        skew_out[i, a] = np.nan
                    else:
                        share = (counts[a] + smoothing) / (n + smoothing * n_groups)
                        skew_out[i, a] = math.log(share / p[i, a]) if share > 0 else -np.inf
        ndkl_out[i] = num / den if den > 0 else 0.0
        infeasible_out[i] = short


def ranking_metrics(ranked, p, k: int | None = None, smoothing: float = 0.0) -> dict:
    """Skew per group, MinSkew, MaxSkew (at k or the full length), NDKL and InfeasibleIndex of
    every ranking, in one compiled pass each (the functions above are the reference)."""
    ranked = np.ascontiguousarray(np.atleast_2d(ranked), dtype=np.int64)
    p = np.ascontiguousarray(_p(p, ranked.shape[0]), dtype=np.float64)
    length = (ranked >= 0).sum(axis=1)
    at = (length if k is None else np.minimum(length, k)).astype(np.int64)
    s = np.full((ranked.shape[0], p.shape[1]), np.nan)
    s[at == 0] = np.where(p[at == 0] > 0, -np.inf if smoothing == 0 else 0.0, np.nan)
    d = np.zeros(ranked.shape[0])
    inf_idx = np.zeros(ranked.shape[0], dtype=np.int64)
    _metrics_batch(ranked, p, at, float(smoothing), s, d, inf_idx)
    none = np.isnan(s).all(axis=1)  # every group has p_a = 0: no skew at all
    lo = np.where(np.isnan(s), np.inf, s).min(axis=1)
    hi = np.where(np.isnan(s), -np.inf, s).max(axis=1)
    lo[none], hi[none] = np.nan, np.nan
    return {"skew": s, "min_skew": lo, "max_skew": hi, "ndkl": d, "infeasible_index": inf_idx}
