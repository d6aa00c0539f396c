"""ADF: gradient-guided search for discriminatory inputs (Zhang et al., ICSE 2020 / TSE).

- **Global generation** (Algorithm 1), batched over all seeds: up to ``max_iter`` times, record the
  seeds that are discriminatory and stop them; move the others: x' = the counterpart whose
  probability differs most from x's; g, g' = the objective's gradients at x and x'; every
  non-protected attribute whose two signs agree moves ``step`` along that sign; clip to the domain.
- **Local generation** (the issue's rule, as EIDIG does rather than the released code's
  basinhopping, which accepted non-discriminatory moves ~37% of the time): from each discriminatory
  input, ``n_local`` times: pick a non-protected attribute with probability proportional to
  1 / (|g_a| + |g'_a|) (attributes that barely move the decision), move it +-1 at random, clip; if the
  result is discriminatory, record it and continue from it, else stay. A walker's counterpart and
  gradients are recomputed only when it moves.
- Seeds: :func:`cluster_seeds` clusters the data (k-means) and draws rows from the clusters in turn.

All randomness comes from ``numpy.random.Generator`` objects made from the given seed.

>>> domain = Domain.make(["sex", "a", "b"], [0, 0, 0], [1, 9, 9], ["sex"])
>>> class Leans:  # a logistic model that leans on sex
...     w = np.array([2.0, 0.5, 0.3])
...     def predict_proba(self, X):
...         p = 1 / (1 + np.exp(-(X @ self.w - 4.0)))
...         return np.c_[1 - p, p]
...     def gradient(self, X):
...         p = self.predict_proba(X)[:, 1]
...         return (p * (1 - p))[:, None] * self.w
>>> res = adf_search(Leans(), np.array([[0, 1, 1], [1, 2, 2]]), domain, n_local=20, seed=0)
>>> res.global_found, res.discriminatory.shape[0] > 2
(2, True)
"""

from __future__ import annotations

import numpy as np

from fairpipe.discrimination import Domain, SearchResult, Tally, check_discrimination
from fairpipe.errors import check_positive_int

__all__ = ["adf_search", "cluster_seeds", "global_generation", "local_generation"]


def _direction(adapter, X, counterpart, free) -> np.ndarray:
    g = adapter.gradient(X.astype(np.float64))
    g2 = adapter.gradient(counterpart.astype(np.float64))
    agree = (np.sign(g) == np.sign(g2)) & free[None, :]
    return np.where(agree, np.sign(g), 0.0).astype(np.int64)


def global_generation(adapter, seeds, domain: Domain, max_iter: int = 10, step: int = 1,
                      tally: Tally | None = None) -> np.ndarray:  # fmt: skip
    """ADF's global phase from ``seeds`` (n, d); returns the distinct discriminatory inputs it
    reached (sorted rows)."""
    check_positive_int(max_iter, "max_iter", "global_generation")
    tally = tally or Tally(domain)
    X = domain.clip(np.asarray(seeds, dtype=np.int64))
    found = []
    for _ in range(max_iter):
        if X.shape[0] == 0:
            break
        disc, counterpart = check_discrimination(adapter, X, domain)
        tally.add(X, disc)
        found.append(X[disc])
        X, counterpart = X[~disc], counterpart[~disc]
        if X.shape[0]:
            X = domain.clip(X + step * _direction(adapter, X, counterpart, domain.free))
    if not found:
        return np.zeros((0, domain.d), np.int64)
    return np.unique(np.concatenate(found), axis=0)


def _pick_cdf(adapter, X, counterpart, free) -> np.ndarray:
    """Cumulative probabilities of picking each free attribute, prop. to 1 / (|g| + |g'|)."""
    g = np.abs(adapter.gradient(X.astype(np.float64)))[:, free]
    g2 = np.abs(adapter.gradient(counterpart.astype(np.float64)))[:, free]
    weight = 1.0 / (g + g2 + 1e-12)
    weight /= weight.sum(axis=1, keepdims=True)
    return weight.cumsum(axis=1)


def local_generation(adapter, starts, domain: Domain, n_local: int, rng: np.random.Generator,
                     step: int = 1, tally: Tally | None = None) -> None:  # fmt: skip
    """ADF's local phase: a walk of ``n_local`` steps from each discriminatory input, all walks
    advanced together; every discriminatory input reached is recorded in ``tally``."""
    tally = tally or Tally(domain)
    X = np.asarray(starts, dtype=np.int64).copy()
    m = X.shape[0]
    if m == 0:
        return
    free = np.flatnonzero(domain.free)
    rows = np.arange(m)
    _, counterpart = check_discrimination(adapter, X, domain)
    cdf = _pick_cdf(adapter, X, counterpart, free)
    lo, hi = domain.lower, domain.upper
    for _ in range(n_local):
        u = np.asarray(rng.random(m))
        pick = free[(cdf < u[:, None]).sum(axis=1).clip(0, free.size - 1)]
        sign = 2 * rng.integers(0, 2, size=m) - 1
        moved = X.copy()
        moved[rows, pick] = np.clip(X[rows, pick] + step * sign, lo[pick], hi[pick])
        disc, moved_counterpart = check_discrimination(adapter, moved, domain)
        tally.add(moved, disc)
        if disc.any():
            X[disc] = moved[disc]
            cdf[disc] = _pick_cdf(adapter, moved[disc], moved_counterpart[disc], free)


def adf_search(adapter, seeds, domain: Domain, n_local: int = 1000, max_iter: int = 10,
               seed: int = 0) -> SearchResult:  # fmt: skip
    """Global then local generation (the whole of ADF) from ``seeds``."""
    check_positive_int(n_local, "n_local", "adf_search")
    tally = Tally(domain)
    starts = global_generation(adapter, seeds, domain, max_iter, tally=tally)
    tally.global_found = starts.shape[0]
    local_generation(adapter, starts, domain, n_local, np.random.default_rng(seed), tally=tally)
    return tally.result()


def cluster_seeds(X, n_seeds: int, n_clusters: int = 4, seed: int = 0) -> np.ndarray:
    """ADF's seeds: the data clustered (k-means), rows drawn from the clusters in turn."""
    from sklearn.cluster import KMeans

    X = np.asarray(X)
    check_positive_int(n_seeds, "n_seeds", "cluster_seeds")
    labels = KMeans(n_clusters=n_clusters, n_init=1, random_state=seed).fit_predict(X)
    rng = np.random.default_rng(seed)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(n_clusters)]
    rows = [pool[i] for i in range(max(map(len, pools))) for pool in pools if i < len(pool)]
    return X[np.array(rows[:n_seeds], dtype=np.int64)]
