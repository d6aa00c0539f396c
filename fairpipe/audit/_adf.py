"""ADF: gradient-guided search for discriminatory inputs (Zhang et al., ICSE 2020 / TSE).

- **The objective** is ADF's: the loss against the model's own decision (``objective="loss"``), so
  a step along its gradient's sign moves an input toward its decision boundary from either side
  (``"probability"``, the probability of the positive class, is there for comparison: it pushes
  inputs decided positive away from the boundary).
- **Global generation** (Algorithm 1), batched over all seeds: up to ``max_iter`` times, record the
  seeds that are discriminatory and stop them; move the others: x' = the counterpart whose
  probability differs most from x's; g, g' = the objective's gradients at x and x'; every
  non-protected attribute whose two signs agree moves ``step`` along that sign; clip to the domain.
  A seed with no agreeing attribute moves one random non-protected attribute along g's sign, as
  the released code does.
- **Local generation** (as EIDIG does, rather than the released code's
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

from fairpipe.audit._discrimination import (
    Domain,
    SearchResult,
    Tally,
    check_discrimination,
    objective_gradient,
)
from fairpipe.errors import check_one_of, check_positive_int
from fairpipe.settings import OBJECTIVES


def _direction(adapter, X, counterpart, free, rng, objective) -> np.ndarray:
    g = np.sign(objective_gradient(adapter, X, objective))
    g2 = np.sign(objective_gradient(adapter, counterpart, objective))
    direction = np.where((g == g2) & free[None, :], g, 0.0)
    stuck = np.flatnonzero(~direction.any(axis=1))
    if stuck.size:  # no agreeing attribute: one random free attribute along g (released code)
        pick = np.flatnonzero(free)[rng.integers(0, int(free.sum()), size=stuck.size)]
        direction[stuck, pick] = g[stuck, pick]
    return direction.astype(np.int64)


def global_generation(adapter, seeds, domain: Domain, max_iter: int = 10, step: int = 1,
                      tally: Tally | None = None, rng: np.random.Generator | None = None,
                      objective: str = "loss") -> np.ndarray:  # fmt: skip
    """ADF's global phase from ``seeds`` (n, d); returns the distinct discriminatory inputs it
    reached (sorted rows). ``rng`` draws the random moves of stuck seeds; without one, a new
    generator with fresh entropy is used (pass one for reproducible results)."""
    check_positive_int(max_iter, "max_iter", "global_generation")
    check_one_of(objective, OBJECTIVES, "objective", "global_generation")
    tally = tally or Tally(domain)
    rng = rng if rng is not None else np.random.default_rng()
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
            move = _direction(adapter, X, counterpart, domain.free, rng, objective)
            X = domain.clip(X + step * move)
    if not found:
        return np.zeros((0, domain.d), np.int64)
    return np.unique(np.concatenate(found), axis=0)


def _pick_cdf(adapter, X, counterpart, free, objective) -> np.ndarray:
    """Cumulative probabilities of picking each free attribute, prop. to 1 / (|g| + |g'|)."""
    g = np.abs(objective_gradient(adapter, X, objective))[:, free]
    g2 = np.abs(objective_gradient(adapter, counterpart, objective))[:, free]
    weight = 1.0 / (g + g2 + 1e-12)
    weight /= weight.sum(axis=1, keepdims=True)
    return weight.cumsum(axis=1)


def local_generation(adapter, starts, domain: Domain, n_local: int, rng: np.random.Generator,
                     step: int = 1, tally: Tally | None = None,
                     objective: str = "loss") -> None:  # fmt: skip
    """ADF's local phase: a walk of ``n_local`` steps from each discriminatory input, all walks
    advanced together; every discriminatory input reached is recorded in ``tally``."""
    check_one_of(objective, OBJECTIVES, "objective", "local_generation")
    tally = tally or Tally(domain)
    X = np.asarray(starts, dtype=np.int64).copy()
    m = X.shape[0]
    if m == 0:
        return
    free = np.flatnonzero(domain.free)
    rows = np.arange(m)
    _, counterpart = check_discrimination(adapter, X, domain)
    cdf = _pick_cdf(adapter, X, counterpart, free, objective)
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
            cdf[disc] = _pick_cdf(adapter, moved[disc], moved_counterpart[disc], free, objective)


def adf_search(adapter, seeds, domain: Domain, n_local: int = 1000, max_iter: int = 10,
               seed: int = 0, objective: str = "loss") -> SearchResult:  # fmt: skip
    """Global then local generation (the whole of ADF) from ``seeds``."""
    check_positive_int(n_local, "n_local", "adf_search")
    check_one_of(objective, OBJECTIVES, "objective", "adf_search")
    tally = Tally(domain)
    rng = np.random.default_rng(seed)
    starts = global_generation(adapter, seeds, domain, max_iter, tally=tally, rng=rng,
                               objective=objective)  # fmt: skip
    tally.global_found = starts.shape[0]
    local_generation(adapter, starts, domain, n_local, rng, tally=tally, objective=objective)
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
