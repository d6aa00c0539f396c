"""AEQUITAS with its fully-directed local search (Udeshi, Arora & Chattopadhyay, ASE 2018): the
baseline ADF is compared with (Tables IV, VI, VII, X, XII of the ADF paper).

- **Global phase**: ``n_global`` inputs drawn uniformly from the domain; the discriminatory ones
  seed the local phase.
- **Local phase, fully directed**: one probability per non-protected attribute (which one to
  perturb; uniform at first) and one per attribute (the chance of moving it down, 1/2 at first),
  shared by every walk. Each step moves the chosen attribute by ``step`` (a random direction at a
  bound), clips, and checks the result. A discriminatory result raises the attribute's probability
  by 0.001 and pushes its direction probability toward the direction taken; a fair result does the
  opposite; the attribute probabilities are renormalised. As in the released code, which runs the
  walk through scipy's basinhopping at temperature 1, a walk always moves to a discriminatory input
  and moves to a fair one with probability exp(-1) (``accept="metropolis"``); ``accept="improving"``
  keeps only discriminatory moves, like ADF's local phase.

Differences from the released code, all so that the comparison measures the search and nothing
else: walks are advanced together, a batch at a time, and the shared probabilities take the
batch's summed updates after each step (the released code updates after every single move);
protected attributes are never perturbed (a perturbed protected value is overwritten by the check
anyway); discrimination is the same check ADF uses (every protected value, not only two).

>>> from fairpipe.audit._discrimination import Domain
>>> domain = Domain.make(["sex", "a", "b"], [0, 0, 0], [1, 9, 9], ["sex"])
>>> class Leans:
...     def predict_proba(self, X):
...         p = (2 * X[:, 0] + X[:, 1] > 9).astype(float)
...         return np.c_[1 - p, p]
>>> res = aequitas_search(Leans(), domain, n_global=200, n_local=50, seed=0)
>>> bool((res.discriminatory[:, 1] >= 8).all()), res.discriminatory.shape[0] > 0
(True, True)
"""

from __future__ import annotations

import math

import numpy as np

from fairpipe.audit._discrimination import Domain, SearchResult, Tally, check_discrimination
from fairpipe.errors import check_one_of, check_positive_int

CHANGE = 0.001  # AEQUITAS's probability change size (attribute and direction)
ACCEPT = ("metropolis", "improving")


def aequitas_global(adapter, domain: Domain, n_global: int, rng: np.random.Generator,
                    tally: Tally | None = None) -> np.ndarray:  # fmt: skip
    """Uniform random inputs; returns the distinct discriminatory ones (sorted rows)."""
    tally = tally or Tally(domain)
    X = domain.uniform(rng, n_global)
    disc, _ = check_discrimination(adapter, X, domain)
    tally.add(X, disc)
    return np.unique(X[disc], axis=0)


def aequitas_local(adapter, starts, domain: Domain, n_local: int, rng: np.random.Generator,
                   step: int = 1, accept: str = "metropolis",
                   tally: Tally | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Fully-directed local search: ``n_local`` steps from each start, all walks together.

    Returns the learned probabilities, one entry per attribute (protected ones 0 and NaN):
    ``attribute`` (of being perturbed) and ``down`` (of a move down).
    """
    check_one_of(accept, ACCEPT, "accept", "aequitas_local")
    tally = tally or Tally(domain)
    X = np.asarray(starts, dtype=np.int64).copy()
    m = X.shape[0]
    free = np.flatnonzero(domain.free)
    p_attr = np.full(free.size, 1.0 / free.size)
    p_down = np.full(free.size, 0.5)
    current_disc = np.ones(m, dtype=bool)
    rows = np.arange(m)
    lo, hi = domain.lower, domain.upper
    keep_worse = math.exp(-1.0)  # basinhopping's Metropolis rule at T = 1 for a 0 -> 1 step
    for _ in range(n_local if m else 0):
        a = np.searchsorted(np.cumsum(p_attr), rng.random(m) * p_attr.sum(), side="right")
        a = a.clip(0, free.size - 1)
        j = free[a]
        at_bound = (X[rows, j] == lo[j]) | (X[rows, j] == hi[j])
        r = rng.random(m)
        down = np.where(at_bound, r < 0.5, r < p_down[a])
        moved = X.copy()
        moved[rows, j] = np.clip(X[rows, j] + np.where(down, -step, step), lo[j], hi[j])
        disc, _ = check_discrimination(adapter, moved, domain)
        tally.add(moved, disc)
        toward_down = disc == down
        p_down += np.bincount(a, np.where(toward_down, CHANGE, -CHANGE), free.size)
        np.clip(p_down, 0.0, 1.0, out=p_down)
        p_attr += np.bincount(a, np.where(disc, CHANGE, -CHANGE), free.size)
        np.clip(p_attr, 0.0, None, out=p_attr)
        total = p_attr.sum()
        p_attr = p_attr / total if total > 0 else np.full(free.size, 1.0 / free.size)
        if accept == "metropolis":
            ok = disc | ~current_disc | (rng.random(m) < keep_worse)
        else:
            ok = disc
        X[ok] = moved[ok]
        current_disc[ok] = disc[ok]
    attribute, down = np.zeros(domain.d), np.full(domain.d, np.nan)
    attribute[free], down[free] = p_attr, p_down
    return {"attribute": attribute, "down": down}


def aequitas_search(adapter, domain: Domain, n_global: int = 1000, n_local: int = 1000,
                    seed: int = 0, step: int = 1, accept: str = "metropolis") -> SearchResult:  # fmt: skip
    """AEQUITAS (fully directed): random global phase, then local search from what it found."""
    check_positive_int(n_global, "n_global", "aequitas_search")
    check_positive_int(n_local, "n_local", "aequitas_search")
    check_one_of(accept, ACCEPT, "accept", "aequitas_search")
    rng = np.random.default_rng(seed)
    tally = Tally(domain)
    starts = aequitas_global(adapter, domain, n_global, rng, tally)
    tally.global_found = starts.shape[0]
    aequitas_local(adapter, starts, domain, n_local, rng, step, accept, tally)
    return tally.result()
