"""ADF: gradient-guided search for discriminatory inputs (Zhang et al., ICSE 2020 / TSE).

Inputs live in a box of integers (every attribute a bounded integer domain). An input x is
**discriminatory** if some x' that differs from x only in the protected attributes gets a different
decision; the check enumerates every combination of protected values (Algorithm 2), batched over
many inputs.

- **Global generation** (Algorithm 1), batched over all seeds: up to ``max_iter`` times, record the
  seeds that are discriminatory and stop them; move the others: x' = the counterpart whose
  probability differs most from x's; g, g' = the objective's gradients at x and x'; every
  non-protected attribute whose two signs agree moves ``step`` along that sign; clip to the domain.
- **Local generation** (the issue's rule, as EIDIG does rather than the released code's
  basinhopping, which accepted non-discriminatory moves ~37% of the time): from each discriminatory
  input, ``n_local`` times: pick a non-protected attribute with probability proportional to
  1 / (|g_a| + |g'_a|) (attributes that barely move the decision), move it +-1 at random, clip; if the
  result is discriminatory, record it and continue from it, else stay.
- **Random** baseline (THEMIS-like): uniform inputs from the domain, the same budget.

All randomness comes from ``numpy.random.Generator`` objects made from the given seed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from fairpipe.errors import FairpipeInputError, check_positive_int

BAD_DOMAIN = "Attribute {name!r} has lower bound {lo} above its upper bound {hi}."
UNKNOWN_PROTECTED = "Protected attribute {name!r} is not in the data; its attributes are {names}."
NO_PROTECTED = "Give at least one protected attribute."


@dataclass(frozen=True)
class Domain:
    """Bounded integer attributes: names, lower and upper bounds (inclusive), protected indices."""

    names: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    protected: tuple[int, ...]

    @classmethod
    def make(cls, names, lower, upper, protected) -> Domain:
        names = tuple(str(n) for n in names)
        lower = np.asarray(lower, dtype=np.int64)
        upper = np.asarray(upper, dtype=np.int64)
        for n, lo, hi in zip(names, lower, upper):
            if lo > hi:
                raise FairpipeInputError(BAD_DOMAIN.format(name=n, lo=int(lo), hi=int(hi)))
        if not protected:
            raise FairpipeInputError(NO_PROTECTED)
        idx = []
        for p in protected:
            if p not in names:
                raise FairpipeInputError(UNKNOWN_PROTECTED.format(name=p, names=list(names)))
            idx.append(names.index(p))
        return cls(names, lower, upper, tuple(idx))

    @property
    def d(self) -> int:
        return len(self.names)

    @property
    def free(self) -> np.ndarray:
        mask = np.ones(self.d, dtype=bool)
        mask[list(self.protected)] = False
        return mask

    def protected_values(self) -> np.ndarray:
        """Every combination of protected values, (P, len(protected))."""
        ranges = [range(int(self.lower[j]), int(self.upper[j]) + 1) for j in self.protected]
        return np.array(list(itertools.product(*ranges)), dtype=np.int64)

    def clip(self, X: np.ndarray) -> np.ndarray:
        return np.clip(X, self.lower, self.upper)

    def uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.lower, self.upper + 1, size=(n, self.d))


def check_discrimination(adapter, X: np.ndarray, domain: Domain):
    """(discriminatory mask (n,), the most different counterpart of each row (n, d))."""
    X = np.asarray(X, dtype=np.int64)
    values = domain.protected_values()
    n, P = X.shape[0], values.shape[0]
    cand = np.repeat(X[:, None, :], P, axis=1)
    cand[:, :, list(domain.protected)] = values[None, :, :]
    proba = adapter.predict_proba(cand.reshape(n * P, domain.d).astype(np.float64))
    label = proba.argmax(axis=1).reshape(n, P)
    pos = proba[:, -1].reshape(n, P)
    # x itself is one of its counterparts when its protected values lie in the domain.
    match = (values[None, :, :] == X[:, None, list(domain.protected)]).all(axis=2)
    rows = np.arange(n)
    own = match.argmax(axis=1)
    own_label, own_pos = label[rows, own], pos[rows, own]
    outside = ~match.any(axis=1)
    if outside.any():
        own_proba = adapter.predict_proba(X[outside].astype(np.float64))
        own_label[outside], own_pos[outside] = own_proba.argmax(axis=1), own_proba[:, -1]
    disc = (label != own_label[:, None]).any(axis=1)
    far = np.abs(pos - own_pos[:, None]).argmax(axis=1)
    return disc, cand[rows, far]


@dataclass
class SearchResult:
    discriminatory: np.ndarray  # distinct discriminatory inputs found (rows)
    generated: int  # distinct inputs generated and checked (#GDiff)
    global_found: int = 0
    trace: list[tuple[int, int]] = field(default_factory=list)  # (checked so far, #ID so far)

    @property
    def success_rate(self) -> float:
        return self.discriminatory.shape[0] / self.generated if self.generated else 0.0


class _Tally:
    """Distinct generated inputs and distinct discriminatory ones, with a progress trace."""

    def __init__(self):
        self.seen: set[bytes] = set()
        self.found: dict[bytes, np.ndarray] = {}
        self.trace: list[tuple[int, int]] = []

    def add(self, X: np.ndarray, disc: np.ndarray) -> None:
        for row, d in zip(np.ascontiguousarray(X, dtype=np.int64), disc):
            key = row.tobytes()
            self.seen.add(key)
            if d and key not in self.found:
                self.found[key] = row.copy()
        self.trace.append((len(self.seen), len(self.found)))

    def result(self, d: int, global_found: int = 0) -> SearchResult:
        rows = np.array(list(self.found.values()), dtype=np.int64).reshape(-1, d)
        return SearchResult(rows, len(self.seen), global_found, self.trace)


def _direction(adapter, X, counterpart, free) -> np.ndarray:
    g = adapter.gradient(X.astype(np.float64))
    g2 = adapter.gradient(counterpart.astype(np.float64))
    agree = (np.sign(g) == np.sign(g2)) & free[None, :]
    return np.where(agree, np.sign(g), 0.0).astype(np.int64)


def global_generation(adapter, seeds, domain: Domain, max_iter: int = 10, step: int = 1,
                      tally: _Tally | None = None) -> np.ndarray:  # fmt: skip
    """ADF's global phase from ``seeds`` (n, d); returns the discriminatory inputs it reached."""
    check_positive_int(max_iter, "max_iter", "global_generation")
    tally = tally or _Tally()
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
    return np.unique(np.concatenate(found), axis=0) if found else np.zeros((0, domain.d), np.int64)


def local_generation(adapter, starts, domain: Domain, n_local: int, rng: np.random.Generator,
                     step: int = 1, tally: _Tally | None = None) -> None:  # fmt: skip
    """ADF's local phase: a walk of ``n_local`` steps from each discriminatory input, all walks
    advanced together; every discriminatory input reached is recorded in ``tally``."""
    tally = tally or _Tally()
    X = np.asarray(starts, dtype=np.int64).copy()
    if X.shape[0] == 0:
        return
    free = np.flatnonzero(domain.free)
    for _ in range(n_local):
        _, counterpart = check_discrimination(adapter, X, domain)
        g = np.abs(adapter.gradient(X.astype(np.float64)))[:, free]
        g2 = np.abs(adapter.gradient(counterpart.astype(np.float64)))[:, free]
        weight = 1.0 / (g + g2 + 1e-12)
        weight /= weight.sum(axis=1, keepdims=True)
        u = np.asarray(rng.random(X.shape[0]))
        pick = free[(weight.cumsum(axis=1) < u[:, None]).sum(axis=1).clip(0, free.size - 1)]
        sign = rng.choice(np.array([-1, 1]), size=X.shape[0])
        moved = X.copy()
        moved[np.arange(X.shape[0]), pick] += step * sign
        moved = domain.clip(moved)
        disc, _ = check_discrimination(adapter, moved, domain)
        tally.add(moved, disc)
        X[disc] = moved[disc]


def adf_search(adapter, seeds, domain: Domain, n_local: int = 1000, max_iter: int = 10,
               seed: int = 0) -> SearchResult:  # fmt: skip
    """Global then local generation (the whole of ADF) from ``seeds``."""
    check_positive_int(n_local, "n_local", "adf_search")
    tally = _Tally()
    starts = global_generation(adapter, seeds, domain, max_iter, tally=tally)
    local_generation(adapter, starts, domain, n_local, np.random.default_rng(seed), tally=tally)
    return tally.result(domain.d, global_found=starts.shape[0])


def random_search(adapter, domain: Domain, budget: int, seed: int = 0,
                  batch: int = 10_000) -> SearchResult:  # fmt: skip
    """Baseline: ``budget`` uniform inputs from the domain, checked in batches."""
    check_positive_int(budget, "budget", "random_search")
    rng = np.random.default_rng(seed)
    tally = _Tally()
    done = 0
    while done < budget:
        X = domain.uniform(rng, min(batch, budget - done))
        disc, _ = check_discrimination(adapter, X, domain)
        tally.add(X, disc)
        done += X.shape[0]
    return tally.result(domain.d)


def discrimination_rate(adapter, domain: Domain, n: int = 10_000, seed: int = 0) -> float:
    """Share of discriminatory inputs among ``n`` uniform random ones."""
    X = domain.uniform(np.random.default_rng(seed), n)
    return float(check_discrimination(adapter, X, domain)[0].mean())


def cluster_seeds(X, n_seeds: int, n_clusters: int = 4, seed: int = 0) -> np.ndarray:
    """ADF's seeds: the data clustered (k-means), rows drawn from the clusters in turn."""
    from sklearn.cluster import KMeans

    X = np.asarray(X)
    labels = KMeans(n_clusters=n_clusters, n_init=1, random_state=seed).fit_predict(X)
    rng = np.random.default_rng(seed)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(n_clusters)]
    rows = [pool[i] for i in range(max(map(len, pools))) for pool in pools if i < len(pool)]
    return X[np.array(rows[:n_seeds], dtype=np.int64)]
