"""Individual discrimination: the input box, the batched check, and counting what a search found.

Inputs live in a box of integers (every attribute a bounded integer domain, :class:`Domain`). An
input x is **discriminatory** if some x' that differs from x only in the protected attributes gets
a different decision; :func:`check_discrimination` enumerates every combination of protected values
(ADF's Algorithm 2) for a whole batch of inputs in one prediction call.

Searches (ADF in :mod:`fairpipe.audit._adf`, AEQUITAS in :mod:`fairpipe.audit._aequitas`, the random baseline
here) count what they generate with a :class:`Tally`: the distinct inputs checked (#GDiff), the
distinct discriminatory ones (#ID), and a trace of both against time.

>>> domain = Domain.make(["sex", "a"], [0, 0], [1, 3], ["sex"])
>>> class Leans:  # decides on sex + a > 2
...     def predict_proba(self, X):
...         p = (X[:, 0] + X[:, 1] > 2).astype(float)
...         return np.c_[1 - p, p]
>>> disc, counterpart = check_discrimination(Leans(), np.array([[0, 2], [1, 0]]), domain)
>>> disc.tolist(), counterpart.tolist()
([True, False], [[1, 2], [0, 0]])
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from itertools import compress

import numpy as np

from fairpipe.errors import FairpipeInputError, check_positive_int

BAD_DOMAIN = "Attribute {name!r} has lower bound {lo} above its upper bound {hi}."
UNKNOWN_PROTECTED = "Protected attribute {name!r} is not in the data; its attributes are {names}."
NO_PROTECTED = "Give at least one protected attribute."
ALL_PROTECTED = "Every attribute is protected; a search needs at least one attribute it may change."
CONSTANT_PROTECTED = (
    "Protected attribute {name!r} takes only the value {value} in the data; no decision can change "
    "with it."
)


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
            if lower[idx[-1]] == upper[idx[-1]]:
                raise FairpipeInputError(
                    CONSTANT_PROTECTED.format(name=p, value=int(lower[idx[-1]]))
                )
        if len(set(idx)) == len(names):
            raise FairpipeInputError(ALL_PROTECTED)
        return cls(names, lower, upper, tuple(dict.fromkeys(idx)))

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

    def variants(self, X: np.ndarray) -> np.ndarray:
        """Each row with every combination of protected values, (n, P, d)."""
        values = self.protected_values()
        out = np.repeat(np.asarray(X, dtype=np.int64)[:, None, :], values.shape[0], axis=1)
        out[:, :, list(self.protected)] = values[None, :, :]
        return out


def check_discrimination(adapter, X: np.ndarray, domain: Domain):
    """(discriminatory mask (n,), the most different counterpart of each row (n, d)).

    The most different counterpart is the protected variant whose probability of the last class
    is farthest from x's own (ADF's x'); one prediction call covers every variant of every row.
    """
    X = np.asarray(X, dtype=np.int64)
    values = domain.protected_values()
    n, P = X.shape[0], values.shape[0]
    cand = domain.variants(X)
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


def objective_gradient(adapter, X: np.ndarray, objective: str = "loss") -> np.ndarray:
    """The gradient of the search objective with respect to each input row, (n, d).

    ``"loss"`` (ADF's): the cross-entropy loss against the model's own decision, J = -log p_c(x)
    with c = argmax p(x); a step along its sign moves x toward its decision boundary, whichever
    side it is on. ``"probability"``: the probability of the last class (a step along its sign
    raises it, away from the boundary for inputs already decided positive).
    """
    X = np.asarray(X, dtype=np.float64)
    if objective == "probability":
        return np.asarray(adapter.gradient(X))
    proba = adapter.predict_proba(X)
    c = proba.argmax(axis=1)
    if proba.shape[1] == 2:  # p_0 = 1 - p_1: one gradient serves both classes
        d_pc = np.where(c == 1, 1.0, -1.0)[:, None] * adapter.gradient(X)
    else:
        d_pc = adapter.gradient(X, target=c)
    return -d_pc / np.maximum(proba[np.arange(X.shape[0]), c], 1e-12)[:, None]


@dataclass
class SearchResult:
    """What a search found: distinct discriminatory inputs (sorted rows) and its counts."""

    discriminatory: np.ndarray  # distinct discriminatory inputs found (rows)
    generated: int  # distinct inputs generated and checked (#GDiff)
    global_found: int = 0  # distinct discriminatory inputs of the global phase
    # (seconds since the search started, #GDiff so far, #ID so far), one entry per checked batch
    trace: list[tuple[float, int, int]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def success_rate(self) -> float:
        return self.discriminatory.shape[0] / self.generated if self.generated else 0.0

    def time_to(self, ids: int) -> float | None:
        """Seconds until the search had found ``ids`` distinct discriminatory inputs (None: never)."""
        for t, _, found in self.trace:
            if found >= ids:
                return t
        return None


class Tally:
    """Distinct generated inputs and distinct discriminatory ones, with a trace against time.

    Rows are packed into one integer each (mixed radix over the domain, in row-major order, so
    sorted keys are sorted rows) when the domain has fewer than 2**62 points, otherwise into their
    bytes; the sets are Python sets filled in C-speed bulk updates.
    """

    def __init__(self, domain: Domain):
        self.domain = domain
        span = (domain.upper - domain.lower + 1).astype(np.int64)
        self._span = span
        self._mult: np.ndarray | None = None
        if sum(math.log2(int(s)) for s in span) < 62:
            mult = np.ones(domain.d, dtype=np.int64)
            for j in range(domain.d - 2, -1, -1):
                mult[j] = mult[j + 1] * span[j + 1]
            self._mult = mult
        self.seen: set = set()
        self.found: set = set()
        self.global_found = 0
        self.trace: list[tuple[float, int, int]] = []
        self._t0 = time.perf_counter()

    def keys(self, X: np.ndarray) -> list:
        X = np.ascontiguousarray(X, dtype=np.int64)
        if self._mult is not None:
            return ((X - self.domain.lower) @ self._mult).tolist()
        return X.view(np.dtype((np.void, 8 * self.domain.d))).ravel().tolist()

    def add(self, X: np.ndarray, disc: np.ndarray) -> None:
        keys = self.keys(X)
        self.seen.update(keys)
        if disc.any():
            self.found.update(compress(keys, disc.tolist()))
        self.trace.append((time.perf_counter() - self._t0, len(self.seen), len(self.found)))

    def rows(self, keys) -> np.ndarray:
        keys = sorted(keys)
        if not keys:
            return np.zeros((0, self.domain.d), dtype=np.int64)
        if self._mult is not None:
            k = np.array(keys, dtype=np.int64)
            return (k[:, None] // self._mult) % self._span + self.domain.lower
        return np.frombuffer(b"".join(keys), dtype=np.int64).reshape(-1, self.domain.d).copy()

    def result(self) -> SearchResult:
        return SearchResult(
            self.rows(self.found),
            len(self.seen),
            self.global_found,
            self.trace,
            time.perf_counter() - self._t0,
        )


def random_search(adapter, domain: Domain, budget: int, seed: int = 0,
                  batch: int = 10_000) -> SearchResult:  # fmt: skip
    """Baseline (THEMIS-like): ``budget`` uniform inputs from the domain, checked in batches."""
    check_positive_int(budget, "budget", "random_search")
    rng = np.random.default_rng(seed)
    tally = Tally(domain)
    done = 0
    while done < budget:
        X = domain.uniform(rng, min(batch, budget - done))
        disc, _ = check_discrimination(adapter, X, domain)
        tally.add(X, disc)
        done += X.shape[0]
    return tally.result()


def discrimination_rate(adapter, domain: Domain, n: int = 10_000, seed: int = 0) -> float:
    """Share of discriminatory inputs among ``n`` uniform random ones (AEQUITAS's estimate)."""
    X = domain.uniform(np.random.default_rng(seed), n)
    return float(check_discrimination(adapter, X, domain)[0].mean())
