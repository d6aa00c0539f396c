"""Monotone submodular utilities of a summary, with one-pass marginal gains.

Both are defined over an evaluation set E (m points; in a tree, a hash sample of the node's data):

- **exemplar** (k-medoid): f(S) = L({e0}) - L(S + {e0}) with L(S) = (1/m) sum_v min_{e in S}
  ||v - e||^2 and e0 a phantom exemplar at the origin (Krause and Gomes; El Halabi et al. 2020).
  Standardise the features first, or the origin is a poor phantom.
- **facility** location: f(S) = (1/m) sum_v max_{e in S} exp(-gamma ||v - e||^2) (0 for the empty
  set); gamma defaults to 1 / d, scikit-learn's default for the RBF kernel.

Both are written as f(S) = (1/m) sum_v [base_v - cur_v(S)], with cur_v(S) the best (smallest)
cost of v over S and the empty set's ``base``: the cost is the squared distance (exemplar; base: the
distance to the phantom) or minus the similarity (facility; base 0). A stream keeps ``cur``, so one
element's marginal gain is one pass over E, and accepting an element updates ``cur`` in one pass. The kernels are compiled
(numba) without fastmath, so every sum runs in a fixed order and gives the same bits everywhere.

>>> E = np.array([[0.0, 0.0], [2.0, 0.0]])
>>> u = Utility("exemplar", E)
>>> round(u.value(np.array([[2.0, 0.0]])), 6)  # L({e0}) = 2, L({e0, (2, 0)}) = 0
2.0
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fairpipe.errors import check_one_of, check_positive_float
from fairpipe.parallel import compiled
from fairpipe.settings import UTILITIES

EXEMPLAR, FACILITY = 0, 1


@compiled
def sq_dists(ET, x, out):
    """Squared distances from every evaluation point (the columns of ``ET``, E transposed) to x,
    into ``out``: each a sum over j in order. Looping over the points inside the loop over j
    keeps every sum's order (so its bits) and lets the compiler run several points at once
    (4x faster at d = 32 than a loop over j inside the loop over points)."""
    d, m = ET.shape
    for v in range(m):
        out[v] = 0.0
    for j in range(d):
        xj = x[j]
        for v in range(m):
            diff = ET[j, v] - xj
            out[v] += diff * diff


@compiled
def to_score(kind, gamma, dv):
    """Turn squared distances into the utility's per-point cost in place, smaller is better
    (exemplar: the distance; facility: minus the similarity exp(-gamma d))."""
    if kind == FACILITY:
        for v in range(dv.shape[0]):
            dv[v] = -np.exp(-gamma * dv[v])


@compiled
def gain(kind, cur, score):
    """Marginal gain (times m) of an element with per-point cost ``score`` given ``cur``."""
    acc = 0.0
    for v in range(cur.shape[0]):
        if score[v] < cur[v]:
            acc += cur[v] - score[v]
    return acc


@compiled
def absorb(kind, cur, score):
    """Update ``cur`` with an accepted element's costs."""
    for v in range(cur.shape[0]):
        if score[v] < cur[v]:
            cur[v] = score[v]


@compiled
def base_scores(kind, ET):
    """``cur`` of the empty set: the squared distance to the phantom (exemplar), or 0 (facility:
    no similarity yet). ``ET``: the evaluation points transposed (d, m)."""
    d, m = ET.shape
    out = np.zeros(m)
    if kind == EXEMPLAR:
        for j in range(d):
            for v in range(m):
                out[v] += ET[j, v] * ET[j, v]
    return out


@compiled
def set_scores(kind, gamma, ET, X, rows, n_rows):
    """``cur`` of the set {X[rows[0..n_rows)]} (added in that order)."""
    cur = base_scores(kind, ET)
    score = np.empty(ET.shape[1])
    for i in range(n_rows):
        sq_dists(ET, X[rows[i]], score)
        to_score(kind, gamma, score)
        absorb(kind, cur, score)
    return cur


@compiled
def value_of(kind, cur, base):
    """f(S) from its ``cur`` and the empty set's ``base`` (a mean over the evaluation points)."""
    acc = 0.0
    m = cur.shape[0]
    for v in range(m):
        acc += base[v] - cur[v]
    return acc / m if m else 0.0


@dataclass(frozen=True)
class Utility:
    """A utility over the evaluation points ``E`` (float64 (m, d); the kernels read ``ET``, its
    transpose)."""

    name: str
    E: np.ndarray
    gamma: float | None = None  # facility only; None: 1 / d
    ET: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        check_one_of(self.name, UTILITIES, "utility", "Utility")
        object.__setattr__(self, "E", np.ascontiguousarray(self.E, dtype=np.float64))
        object.__setattr__(self, "ET", np.ascontiguousarray(self.E.T))
        if self.gamma is not None:
            check_positive_float(self.gamma, "gamma", "Utility")

    @property
    def kind(self) -> int:
        return EXEMPLAR if self.name == "exemplar" else FACILITY

    @property
    def kernel_gamma(self) -> float:
        """The facility kernel's gamma (1 / d unless given)."""
        return float(self.gamma) if self.gamma is not None else 1.0 / max(self.E.shape[1], 1)

    def value(self, X_S: np.ndarray) -> float:
        """f(S) for the points ``X_S`` (rows = the elements of S)."""
        X_S = np.ascontiguousarray(X_S, dtype=np.float64).reshape(-1, self.E.shape[1])
        rows = np.arange(X_S.shape[0], dtype=np.int64)
        cur = set_scores(self.kind, self.kernel_gamma, self.ET, X_S, rows, rows.shape[0])
        return float(value_of(self.kind, cur, base_scores(self.kind, self.ET)))
