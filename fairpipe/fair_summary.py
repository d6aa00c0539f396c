"""Fair summaries merged up a tree, with deletions that recompute only leaf-to-root paths.

The tree is DC-k-means' (:mod:`fairpipe.dc_kmeans`): ``width ** height`` leaves, a point's leaf a
hash of (seed, id). Every node runs the fair streaming selector (:mod:`fairpipe.fair_streaming`)
on its stream and passes up its **candidates**: its summary plus its backups (at most
k + sum l_c elements). A leaf streams its live points; a parent streams the union of its children's
candidates; the root's summary is the summary.

- Stream order: by a hash of (seed, id), so it depends on neither file order nor chunking.
- Evaluation points: a node's utility is measured on the ``eval_size`` points of its subtree with
  the smallest hash of (seed, id) (another salt). A parent's are the smallest among its children's,
  so the root evaluates on a uniform hash sample of all live points, and a deletion changes the
  sample of the deleted point's ancestors only.
- Lower bounds at a node are capped by the elements of each colour in its stream (a leaf may hold
  no element of a rare colour). Each node passes up at least min(l_c, elements of c below it) of
  every colour c, so the root's stream can always meet the real bounds: error(S) = 0 at the root
  whenever the bounds are feasible for the data.

Deletion equivalence: a node's output is a function of the seed and its own inputs only, so
deleting ids and recomputing their leaves and those leaves' ancestors gives exactly the summary of a
fresh run on the remaining points.

>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(3000, 4)); colours = rng.integers(0, 3, size=3000)
>>> model = FairSummary(k=9, lower=[2, 2, 2], upper=[4, 4, 4], width=4, height=2).fit(X, colours)
>>> bool((model.counts_ >= 2).all() and (model.counts_ <= 4).all()), model.error_
(True, 0)
>>> gone = model.summary_ids_[:2]
>>> _ = model.delete(gone)
>>> keep = np.setdiff1d(np.arange(3000), gone)
>>> fresh = FairSummary(k=9, lower=[2, 2, 2], upper=[4, 4, 4], width=4, height=2)
>>> bool(np.array_equal(model.summary_ids_, fresh.fit(X[keep], colours[keep], ids=keep).summary_ids_))
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fairpipe.batched_kmeans import _pool
from fairpipe.dc_kmeans import MAX_LEAVES, TOO_MANY_LEAVES, leaf_of
from fairpipe.errors import (
    FairpipeInputError,
    check_one_of,
    check_positive_float,
    check_positive_int,
)
from fairpipe.fair_streaming import (
    K_TOO_LARGE,
    bound_error,
    check_bounds,
    check_colours,
    stream_kernel,
)
from fairpipe.hashing import stable_hash
from fairpipe.submodular import UTILITIES, Utility
from fairpipe.validation import IdLookup, check_points_and_ids, deletion_request

RULES = ("swap", "ck")
STREAM_SALT, EVAL_SALT = 0x5C, 0xE5
_ROWS_PER_THREAD = 20_000  # below this, one thread solves all the leaves asked for
NOT_FITTED = "This FairSummary instance is not fitted yet. Call 'fit' first."


@dataclass(frozen=True)
class SummaryParams:
    """Everything a node's result depends on (besides its inputs)."""

    k: int
    lower: tuple[int, ...]
    upper: tuple[int, ...]
    utility: str = "exemplar"
    gamma: float | None = None
    eval_size: int = 2048
    rule: str = "swap"
    factor: float = 2.0
    seed: int = 0

    def check(self, owner: str = "FairSummary") -> SummaryParams:
        check_positive_int(self.k, "k", owner)
        check_one_of(self.utility, UTILITIES, "utility", owner)
        check_one_of(self.rule, RULES, "rule", owner)
        check_positive_int(self.eval_size, "eval_size", owner)
        check_positive_float(self.factor, "factor", owner)
        if self.gamma is not None:
            check_positive_float(self.gamma, "gamma", owner)
        check_bounds(self.k, self.lower, self.upper)
        return self

    def as_attrs(self) -> dict:
        return {
            "k": int(self.k),
            "lower": [int(v) for v in self.lower],
            "upper": [int(v) for v in self.upper],
            "utility": self.utility,
            "gamma": None if self.gamma is None else float(self.gamma),
            "eval_size": int(self.eval_size),
            "rule": self.rule,
            "factor": float(self.factor),
            "seed": int(self.seed),
        }

    @classmethod
    def from_attrs(cls, attrs: dict) -> SummaryParams:
        """The parameters back from :meth:`as_attrs` (stored attributes may hold more keys)."""
        p = {f: attrs[f] for f in cls.__dataclass_fields__}
        return cls(**{**p, "lower": tuple(p["lower"]), "upper": tuple(p["upper"])})

    @property
    def capacity(self) -> int:
        """Most candidates a node passes up: its summary plus one backup set per colour."""
        return int(self.k) + int(sum(self.lower))


@dataclass
class NodeOutput:
    """What a node passes to its parent (and, at the root, the summary)."""

    candidates: np.ndarray  # ids, in stream order
    cand_points: np.ndarray  # (len(candidates), d) float64
    cand_colours: np.ndarray  # int64
    evaluation: np.ndarray  # ids of the evaluation points, in eval-key order
    eval_points: np.ndarray  # (len(evaluation), d) float64
    summary: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ids, sorted
    value: float = 0.0
    calls: int = 0

    @classmethod
    def empty(cls, d: int) -> NodeOutput:
        z = np.zeros(0, np.int64)
        return cls(z, np.zeros((0, d)), z, z, np.zeros((0, d)))


def solve_node(X, ids, colours, eval_X, eval_ids, params: SummaryParams) -> NodeOutput:
    """One node: the fair selector over the elements (X, ids, colours) in stream order, measured on
    the ``eval_size`` points of (eval_X, eval_ids) with the smallest eval keys (valid input
    assumed; the inputs may come in any order)."""
    d = X.shape[1]
    if ids.shape[0] == 0:
        return NodeOutput.empty(d)
    seed = int(params.seed)
    order = np.argsort(stable_hash(seed, ids, salt=STREAM_SALT), kind="stable")
    X = np.ascontiguousarray(X[order], dtype=np.float64)
    ids, colours = ids[order], colours[order]
    pick = np.argsort(stable_hash(seed, eval_ids, salt=EVAL_SALT), kind="stable")
    pick = pick[: int(params.eval_size)]
    eval_X = np.ascontiguousarray(eval_X[pick], dtype=np.float64)
    util = Utility(params.utility, eval_X, params.gamma)
    lower = np.asarray(params.lower, dtype=np.int64)
    upper = np.asarray(params.upper, dtype=np.int64)
    res = stream_kernel(
        X, colours, lower, upper, int(params.k), util, params.factor, fair=True,
        swap=params.rule == "swap",
    )  # fmt: skip
    cand = res.candidates
    return NodeOutput(
        candidates=ids[cand],
        cand_points=X[cand],
        cand_colours=colours[cand],
        evaluation=eval_ids[pick],
        eval_points=eval_X,
        summary=np.sort(ids[res.rows]),
        value=res.value,
        calls=res.calls,
    )


def merge_children(children: list[NodeOutput], params: SummaryParams) -> NodeOutput:
    """A parent from its children's outputs: their candidates are its stream, their evaluation
    points its evaluation pool."""
    d = children[0].cand_points.shape[1]
    ids = np.concatenate([c.candidates for c in children])
    if ids.size == 0:
        return NodeOutput.empty(d)
    return solve_node(
        np.concatenate([c.cand_points for c in children]),
        ids,
        np.concatenate([c.cand_colours for c in children]),
        np.concatenate([c.eval_points for c in children]),
        np.concatenate([c.evaluation for c in children]),
        params,
    )


def merge_many(families: list[list[NodeOutput]], params: SummaryParams) -> list[NodeOutput]:
    """Parents from their children's outputs (one list of children per parent), over the thread
    pool when there are several (the kernels release the GIL)."""
    if len(families) > 1:
        return list(_pool().map(lambda kids: merge_children(kids, params), families))
    return [merge_children(kids, params) for kids in families]


def solve_leaves(X, ids, colours, leaf, leaves, params: SummaryParams) -> list[NodeOutput]:
    """The outputs of ``leaves`` (sorted) from their live rows (any order, these leaves only)."""
    leaves = np.asarray(leaves, dtype=np.int64)
    order = np.argsort(leaf, kind="stable")
    X, ids, colours, leaf = X[order], ids[order], colours[order], leaf[order]
    bounds = np.searchsorted(leaf, np.concatenate([leaves, leaves[-1:] + 1]))

    def one(j: int) -> NodeOutput:
        a, b = bounds[j], bounds[j + 1]
        return solve_node(X[a:b], ids[a:b], colours[a:b], X[a:b], ids[a:b], params)

    if leaves.shape[0] > 1 and ids.shape[0] > _ROWS_PER_THREAD:
        return list(_pool().map(one, range(leaves.shape[0])))  # the kernels release the GIL
    return [one(j) for j in range(leaves.shape[0])]


@dataclass
class SummaryDeletion:
    deleted: np.ndarray
    unknown: np.ndarray
    already_deleted: np.ndarray
    changed: list[np.ndarray] = field(default_factory=list)  # per level, nodes recomputed


class FairSummary:
    """A fair summary of k elements, selected by streaming up a tree; batch deletion is exact.

    Parameters
    ----------
    k : int
        Summary size (at most k elements).
    lower, upper : sequences of int
        Per colour, the fewest and most elements of that colour in the summary.
    utility : {"exemplar", "facility"}
    width, height : int
        The tree: ``width ** height`` leaves (height 0: one node streams everything).
    eval_size : int
        Evaluation points per node (a hash sample of the node's subtree).
    rule : {"swap", "ck"}
        "swap": an element that does not fit replaces the circuit member whose exchange raises f
        most, when it does (measured above offline greedy on the benchmarks); "ck": the
        Chakrabarti-Kale rule (a provable 1/4-approximation per stream).
    factor : float
        The "ck" rule's swap threshold.
    gamma : float or None
        Facility location's kernel width (None: 1 / d).
    seed : int
    """

    def __init__(
        self,
        k: int = 10,
        lower=(),
        upper=(),
        utility: str = "exemplar",
        width: int = 8,
        height: int = 1,
        eval_size: int = 2048,
        rule: str = "swap",
        factor: float = 2.0,
        gamma: float | None = None,
        seed: int = 0,
    ):
        self.k = k
        self.lower = lower
        self.upper = upper
        self.utility = utility
        self.width = width
        self.height = height
        self.eval_size = eval_size
        self.rule = rule
        self.factor = factor
        self.gamma = gamma
        self.seed = seed

    def _params(self) -> SummaryParams:
        lo, up = check_bounds(self.k, self.lower, self.upper)
        return SummaryParams(
            k=int(self.k), lower=tuple(int(v) for v in lo), upper=tuple(int(v) for v in up),
            utility=self.utility, gamma=self.gamma, eval_size=self.eval_size, rule=self.rule,
            factor=self.factor, seed=int(self.seed),
        ).check()  # fmt: skip

    def fit(self, X, colours, ids=None) -> FairSummary:
        params = self._params()
        check_positive_int(self.width, "width", "FairSummary")
        if isinstance(self.height, bool) or not isinstance(self.height, (int, np.integer)):
            raise FairpipeInputError(
                f"The 'height' parameter of FairSummary must be a non-negative integer. "
                f"Got {self.height!r} instead."
            )
        if int(self.width) ** int(self.height) > MAX_LEAVES:
            raise FairpipeInputError(
                TOO_MANY_LEAVES.format(leaves=int(self.width) ** int(self.height), limit=MAX_LEAVES)
            )
        X, ids = check_points_and_ids(X, ids, "FairSummary")
        n_col = len(params.lower)
        colours = check_colours(colours, X.shape[0], n_col, "FairSummary.fit")
        check_bounds(params.k, params.lower, params.upper, np.bincount(colours, minlength=n_col))
        if params.k > X.shape[0]:
            raise FairpipeInputError(K_TOO_LARGE.format(k=params.k, n=X.shape[0]))
        self.params_ = params
        self.n_leaves_ = int(self.width) ** int(self.height)
        self.points_ = X.astype(np.float64)
        self.ids_, self.colours_ = ids, colours
        self._ids = IdLookup(ids)
        self.alive_ = np.ones(X.shape[0], dtype=bool)
        self.leaf_of_ = leaf_of(ids, int(self.seed), self.n_leaves_)
        d = X.shape[1]
        self.nodes_: list[list[NodeOutput]] = [
            [NodeOutput.empty(d)] * (self.n_leaves_ // int(self.width) ** j)
            for j in range(int(self.height) + 1)
        ]
        self._recompute(np.arange(self.n_leaves_))
        return self

    def _recompute(self, leaves: np.ndarray) -> list[np.ndarray]:
        leaves = np.unique(leaves)
        rows = np.flatnonzero(self.alive_ & np.isin(self.leaf_of_, leaves))
        got = solve_leaves(
            self.points_[rows], self.ids_[rows], self.colours_[rows], self.leaf_of_[rows], leaves,
            self.params_,
        )  # fmt: skip
        for leaf, out in zip(leaves, got):
            self.nodes_[0][leaf] = out
        changed = [leaves]
        w = int(self.width)
        for level in range(1, int(self.height) + 1):
            nodes = np.unique(changed[-1] // w)
            families = [self.nodes_[level - 1][node * w : (node + 1) * w] for node in nodes]
            for node, out in zip(nodes, merge_many(families, self.params_)):
                self.nodes_[level][node] = out
            changed.append(nodes)
        return changed

    def delete(self, ids) -> SummaryDeletion:
        """Forget ``ids``: recompute their leaves, then only those leaves' ancestors."""
        if not hasattr(self, "nodes_"):
            raise FairpipeInputError(NOT_FITTED)
        ids, known, rows, live = deletion_request(ids, self._ids, self.alive_)
        report = SummaryDeletion(ids[known][live], ids[~known], ids[known][~live])
        rows = rows[live]
        self.alive_[rows] = False
        if rows.size:
            report.changed = self._recompute(self.leaf_of_[rows])
        return report

    # -- the summary ---------------------------------------------------------------------------
    @property
    def root_(self) -> NodeOutput:
        if not hasattr(self, "nodes_"):
            raise FairpipeInputError(NOT_FITTED)
        return self.nodes_[-1][0]

    @property
    def summary_ids_(self) -> np.ndarray:
        return self.root_.summary

    @property
    def value_(self) -> float:
        return self.root_.value

    @property
    def counts_(self) -> np.ndarray:
        rows, _ = self._ids.rows(self.summary_ids_)
        return np.bincount(self.colours_[rows], minlength=len(self.params_.lower))

    @property
    def error_(self) -> int:
        return bound_error(self.counts_, self.params_.lower, self.params_.upper)

    @property
    def oracle_calls_(self) -> int:
        return int(sum(node.calls for level in self.nodes_ for node in level))
