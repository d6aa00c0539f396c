"""Fair summaries merged up a tree, with deletions that recompute only leaf-to-root paths.

The tree is DC-k-means' (:mod:`fairpipe.tree`): ``fanout ** height`` leaves, a point's leaf a hash
of (seed, id). Every node runs the fair streaming selector (:func:`fair_stream`'s kernel) on its
stream and passes up its **candidates**: its summary plus its backups (at most k + sum l_c
elements). A leaf streams its live points; a parent streams the union of its children's
candidates; the root's summary is the summary.

- Stream order: by a hash of (seed, id), so it depends on neither file order nor chunking.
- Evaluation points: a node's utility is measured on the ``eval_size`` points of its subtree with
  the smallest hash of (seed, id) (another salt). A parent's are the smallest among its children's,
  so the root evaluates on a uniform hash sample of all live points, and a deletion changes the
  sample of the deleted point's ancestors only.
- Lower bounds at a node are capped by the elements of each group in its stream (a leaf may hold
  no element of a rare group). Each node passes up at least min(l_c, elements of c below it) of
  every group c, so the root's stream can always meet the real bounds: error(S) = 0 at the root
  whenever the bounds are feasible for the data.

Deletion equivalence: a node's output is a function of the seed and its own inputs only, so
deleting ids and recomputing their leaves and those leaves' ancestors (:meth:`SummaryTree.refresh`:
:func:`fairpipe.tree.refresh` with the :class:`MergeRule`, which the flows use too) gives exactly
the summary of a fresh run on the remaining points.

>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(3000, 4)); groups = rng.integers(0, 3, size=3000)
>>> params = dict(k=9, lower=[2, 2, 2], upper=[4, 4, 4], fanout=4, height=2)
>>> model = FairSummary(**params).fit(X, groups=groups)
>>> bool((model.counts_ >= 2).all() and (model.counts_ <= 4).all()), model.error_
(True, 0)
>>> gone = model.summary_ids_[:2]
>>> _ = model.delete(gone)
>>> keep = np.setdiff1d(np.arange(3000), gone)
>>> fresh = FairSummary(**params).fit(X[keep], ids=keep, groups=groups[keep])
>>> bool(np.array_equal(model.summary_ids_, fresh.summary_ids_))
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field

import numpy as np

from fairpipe.base import BaseEstimator, DeletionReport, rows_from_arrays
from fairpipe.errors import (
    K_TOO_LARGE,
    FairpipeInputError,
    check_seed,
)
from fairpipe.hashing import stable_hash
from fairpipe.parallel import thread_pool
from fairpipe.settings import (
    EVAL_SIZE,
    FACTOR,
    FANOUT,
    GAMMA,
    RULE,
    SEED,
    SUMMARY_HEIGHT,
    SUMMARY_K,
    SUMMARY_NODE,
    UTILITY,
    check_settings,
)
from fairpipe.summary._fair_streaming import bound_error, check_bounds, check_groups, stream_kernel
from fairpipe.summary._utilities import Utility
from fairpipe.tree import check_tree, gather_parts, leaf_of, level_key, nodes_per_level, refresh
from fairpipe.validation import check_points_and_ids

STREAM_SALT, EVAL_SALT = 0x5C, 0xE5
_ROWS_PER_THREAD = 20_000  # below this, one thread solves all the leaves asked for
NEEDS_ROWS = "FairSummary.from_arrays needs the rows: the array {name!r} is missing."


@dataclass(frozen=True)
class SummaryParams:
    """Everything a node's result depends on (besides its inputs)."""

    k: int
    lower: tuple[int, ...]
    upper: tuple[int, ...]
    utility: str = UTILITY.default
    gamma: float | None = GAMMA.default
    eval_size: int = EVAL_SIZE.default
    rule: str = RULE.default
    factor: float = FACTOR.default
    seed: int = SEED.default

    def check(self, owner: str = "FairSummary") -> SummaryParams:
        check_settings(owner, SUMMARY_NODE, self)
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
        """Most candidates a node passes up: its summary plus one backup set per group."""
        return int(self.k) + int(sum(self.lower))


@dataclass
class NodeOutput:
    """What a node passes to its parent (and, at the root, the summary)."""

    candidates: np.ndarray  # ids, in stream order
    cand_points: np.ndarray  # (len(candidates), d) float64
    cand_groups: np.ndarray  # int64
    evaluation: np.ndarray  # ids of the evaluation points, in eval-key order
    eval_points: np.ndarray  # (len(evaluation), d) float64
    summary: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ids, sorted
    value: float = 0.0
    calls: int = 0

    @classmethod
    def empty(cls, d: int) -> NodeOutput:
        z = np.zeros(0, np.int64)
        return cls(z, np.zeros((0, d)), z, z, np.zeros((0, d)))


def solve_node(X, ids, groups, eval_X, eval_ids, params: SummaryParams) -> NodeOutput:
    """One node: the fair selector over the elements (X, ids, groups) in stream order, measured on
    the ``eval_size`` points of (eval_X, eval_ids) with the smallest eval keys (valid input
    assumed; the inputs may come in any order)."""
    d = X.shape[1]
    if ids.shape[0] == 0:
        return NodeOutput.empty(d)
    seed = int(params.seed)
    order = np.argsort(stable_hash(seed, ids, salt=STREAM_SALT), kind="stable")
    X = np.ascontiguousarray(X[order], dtype=np.float64)
    ids, groups = ids[order], groups[order]
    pick = np.argsort(stable_hash(seed, eval_ids, salt=EVAL_SALT), kind="stable")
    pick = pick[: int(params.eval_size)]
    eval_X = np.ascontiguousarray(eval_X[pick], dtype=np.float64)
    util = Utility(params.utility, eval_X, params.gamma)
    lower = np.asarray(params.lower, dtype=np.int64)
    upper = np.asarray(params.upper, dtype=np.int64)
    res = stream_kernel(
        X, groups, lower, upper, int(params.k), util, params.factor, fair=True,
        swap=params.rule == "swap",
    )  # fmt: skip
    cand = res.candidates
    return NodeOutput(
        candidates=ids[cand],
        cand_points=X[cand],
        cand_groups=groups[cand],
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
        np.concatenate([c.cand_groups for c in children]),
        np.concatenate([c.eval_points for c in children]),
        np.concatenate([c.evaluation for c in children]),
        params,
    )


def merge_many(families: list[list[NodeOutput]], params: SummaryParams) -> list[NodeOutput]:
    """Parents from their children's outputs (one list of children per parent), over the thread
    pool when there are several (the kernels release the GIL)."""
    if len(families) > 1:
        return list(thread_pool().map(lambda kids: merge_children(kids, params), families))
    return [merge_children(kids, params) for kids in families]


def summarize_leaves(X, ids, groups, leaf, leaves, params: SummaryParams) -> list[NodeOutput]:
    """The outputs of ``leaves`` (sorted) from their live rows (any order, these leaves only)."""
    leaves = np.asarray(leaves, dtype=np.int64)
    if leaves.size == 0:
        return []
    order = np.argsort(leaf, kind="stable")
    X, ids, groups, leaf = X[order], ids[order], groups[order], leaf[order]
    bounds = np.searchsorted(leaf, np.concatenate([leaves, leaves[-1:] + 1]))

    def one(j: int) -> NodeOutput:
        a, b = bounds[j], bounds[j + 1]
        return solve_node(X[a:b], ids[a:b], groups[a:b], X[a:b], ids[a:b], params)

    if leaves.shape[0] > 1 and ids.shape[0] > _ROWS_PER_THREAD:
        return list(thread_pool().map(one, range(leaves.shape[0])))  # the kernels release the GIL
    return [one(j) for j in range(leaves.shape[0])]


def summarize_leaf_group(leaves, params: SummaryParams, d, *given) -> list[tuple[int, NodeOutput]]:
    """A leaf group's job: gather its rows from the chunk jobs' parts and summarize its leaves."""
    X, ids, leaf, groups = gather_parts(d, given)
    mine = np.isin(leaf, leaves)
    out = summarize_leaves(
        X[mine], ids[mine], groups[mine].astype(np.int64), leaf[mine], leaves, params
    )
    return list(zip(leaves.tolist(), out))


Levels = list[MutableMapping[int, NodeOutput]]


@dataclass(frozen=True)
class MergeRule:
    """The summary's parents (:class:`fairpipe.tree.NodeRule`): each streams the union of its
    children's candidates (:func:`merge_children`)."""

    fanout: int
    params: SummaryParams

    def parents(
        self, level: int, nodes: np.ndarray, children: list[NodeOutput]
    ) -> list[NodeOutput]:
        f = self.fanout
        return merge_many([children[i * f : (i + 1) * f] for i in range(nodes.shape[0])],
                          self.params)  # fmt: skip


class SummaryTree:
    """A fair-summary tree as a node store (:class:`fairpipe.tree.NodeStore`): per level, leaves
    first, node -> :class:`NodeOutput`; a batch is a list of outputs. The nodes a level lacks
    are asked of ``load(level, nodes)`` (a tree in a store reads them back:
    :func:`fairpipe.storage.summary.stored_summary_tree`); an emptied node is ``NodeOutput.empty(d)``."""

    def __init__(self, fanout: int, height: int, params: SummaryParams, d: int,
                 load: Callable[[int, np.ndarray], list[NodeOutput]] | None = None,
                 levels: Levels | None = None) -> None:  # fmt: skip
        self.fanout, self.height, self.params, self.d = int(fanout), int(height), params, int(d)
        self.load = load
        self.levels: Levels = levels if levels is not None else [{} for _ in range(height + 1)]

    def read(self, level: int, nodes: np.ndarray) -> list[NodeOutput]:
        held = self.levels[level]
        missing = [j for j in nodes.tolist() if j not in held]
        if missing:
            if self.load is None:
                raise KeyError(f"level {level} lacks nodes {missing[:5]} and nothing loads them")
            held.update(zip(missing, self.load(level, np.asarray(missing, dtype=np.int64))))
        return [held[j] for j in nodes.tolist()]

    def write(self, level: int, nodes: np.ndarray, batch: list[NodeOutput]) -> None:
        self.levels[level].update(zip(nodes.tolist(), batch))

    def empty(self, level: int, nodes: np.ndarray) -> None:
        empty = NodeOutput.empty(self.d)
        self.levels[level].update((j, empty) for j in nodes.tolist())

    def refresh(self, leaves, got: Mapping[int, NodeOutput]) -> list[np.ndarray]:
        """Bring the tree up to date after the leaves ``leaves`` changed: ``got`` holds the
        outputs of those that hold a live row (:func:`summarize_leaves`), the others become
        empty, then only their ancestors are merged again (:func:`fairpipe.tree.refresh`).
        Returns the nodes recomputed, per level."""
        solved = np.array(sorted(got), dtype=np.int64)
        return refresh(self.fanout, self.height, leaves, solved, [got[j] for j in solved.tolist()],
                       MergeRule(self.fanout, self.params), self)  # fmt: skip

    @property
    def root(self) -> NodeOutput:
        return self.levels[-1][0]

    def in_order(self) -> list[list[NodeOutput]]:
        """Every level's nodes in order (a tree whose every node is held)."""
        return [[level[j] for j in sorted(level)] for level in self.levels]


def padded(rows: list[np.ndarray], width: int) -> np.ndarray:
    """Ragged id lists as one (len(rows), width) int64 array padded with -1."""
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def level_arrays(outputs: list[NodeOutput], params: SummaryParams) -> dict[str, np.ndarray]:
    """One level's nodes as arrays: ``candidates`` and ``evaluation`` ids (padded with -1),
    ``value`` and ``calls``."""
    return {
        "candidates": padded([o.candidates for o in outputs], params.capacity),
        "evaluation": padded([o.evaluation for o in outputs], int(params.eval_size)),
        "value": np.array([o.value for o in outputs], dtype=np.float64),
        "calls": np.array([o.calls for o in outputs], dtype=np.int64),
    }


def summary_arrays(levels: list[list[NodeOutput]], params: SummaryParams,
                summary_ids: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """A whole summary tree as :meth:`FairSummary.to_arrays` names it (without the rows):
    ``level_<j>/...`` for every level (leaves first, nodes in order) and ``summary_ids``."""
    out = {}
    for j, level in enumerate(levels):
        out.update({level_key(j, name): v for name, v in level_arrays(level, params).items()})
    out["summary_ids"] = np.asarray(summary_ids, dtype=np.int64)
    return out


def nodes_from_arrays(candidates: np.ndarray, evaluation: np.ndarray, fetch,
                      value=None, calls=None) -> list[NodeOutput]:  # fmt: skip
    """Nodes back from :func:`level_arrays` rows; ``fetch(ids)`` gives (points float64, groups)
    of sorted distinct ids (only the candidates and evaluation points of these nodes)."""
    wanted = np.unique(np.concatenate([candidates[candidates >= 0], evaluation[evaluation >= 0]]))
    X, groups = fetch(wanted)
    out = []
    for i, (c_row, e_row) in enumerate(zip(candidates, evaluation)):
        c_ids, e_ids = c_row[c_row >= 0], e_row[e_row >= 0]
        ci, ei = np.searchsorted(wanted, c_ids), np.searchsorted(wanted, e_ids)
        node = NodeOutput(c_ids, X[ci], groups[ci], e_ids, X[ei])
        if value is not None:
            node.value, node.calls = float(value[i]), int(calls[i])
        out.append(node)
    return out


def root_figures(root: NodeOutput, params: SummaryParams, names, groups_of) -> dict:
    """The summary as reports show it: ids, value, counts and bounds per group name, error(S);
    ``groups_of(ids)`` gives the group of each summary id."""
    counts = np.bincount(groups_of(root.summary), minlength=len(names))
    return {
        "ids": root.summary.tolist(),
        "value": float(root.value),
        "counts": dict(zip(names, counts.tolist())),
        "bounds": {n: [lo, up] for n, lo, up in zip(names, params.lower, params.upper)},
        "error": bound_error(counts, params.lower, params.upper),
    }


@dataclass(kw_only=True, repr=False, eq=False)
class FairSummary(BaseEstimator):
    """A fair summary of k elements, selected by streaming up a tree; batch deletion is exact.

    Parameters
    ----------
    k : int
        Summary size (at most k elements).
    lower, upper : sequences of int
        Per group, the fewest and most elements of that group in the summary.
    utility : {"exemplar", "facility"}
    fanout, height : int
        The tree: ``fanout ** height`` leaves (height 0: one node streams everything).
    eval_size : int
        Evaluation points per node (a hash sample of the node's subtree).
    rule : {"swap", "ck"}
        "swap": an element that does not fit replaces the circuit member whose exchange raises f
        most, when it does (measured above offline greedy on the benchmarks); "ck": the
        Chakrabarti-Kale rule (a provable 1/4-approximation per stream).
    factor : float
        The "ck" rule's swap threshold.
    gamma : float or None
        The facility-location utility's RBF kernel coefficient (None: 1 / d).
    seed : int
    """

    _fitted_attribute = "nodes_"

    k: int = SUMMARY_K.default
    lower: tuple | list = ()
    upper: tuple | list = ()
    utility: str = UTILITY.default
    fanout: int = FANOUT.default
    height: int = SUMMARY_HEIGHT.default
    eval_size: int = EVAL_SIZE.default
    rule: str = RULE.default
    factor: float = FACTOR.default
    gamma: float | None = GAMMA.default
    seed: int = SEED.default

    def _check_params(self) -> tuple[SummaryParams, int]:
        """The node parameters and the number of leaves, validated."""
        check_seed(self.seed, "seed", "FairSummary")
        lo, up = check_bounds(self.k, self.lower, self.upper)
        params = SummaryParams(
            k=int(self.k), lower=tuple(int(v) for v in lo), upper=tuple(int(v) for v in up),
            utility=self.utility, gamma=self.gamma, eval_size=self.eval_size, rule=self.rule,
            factor=self.factor, seed=int(self.seed),
        ).check()  # fmt: skip
        return params, check_tree(self.fanout, self.height, "FairSummary")

    def node_params(self) -> SummaryParams:
        """The parameters every node of the tree uses, validated (what :meth:`fit` checks
        first); the flows build the same tree on Dask with them."""
        return self._check_params()[0]

    def fit(self, X, y=None, *, ids=None, groups=None) -> FairSummary:
        """Select the summary of the rows of ``X``; ``groups`` (one integer per row, 0 to
        len(lower) - 1) defaults to one group for every row; ``ids`` to the row numbers; ``y``
        is ignored (scikit-learn's convention for estimators without a target)."""
        params, n_leaves = self._check_params()
        X, ids = check_points_and_ids(X, ids, "FairSummary")
        n_groups = len(params.lower)
        if groups is None:
            groups = np.zeros(X.shape[0], dtype=np.int64)
        groups = check_groups(groups, X.shape[0], n_groups, "FairSummary.fit")
        check_bounds(params.k, params.lower, params.upper, np.bincount(groups, minlength=n_groups))
        if params.k > X.shape[0]:
            raise FairpipeInputError(
                K_TOO_LARGE.format(name="k", k=params.k, n=X.shape[0], what="elements of the data")
            )
        self._install(params, n_leaves, X.astype(np.float64), ids, groups, None)
        self._recompute(np.arange(n_leaves))
        return self

    def _install(self, params, n_leaves, points, ids, groups, alive) -> None:
        self.params_ = params
        self.n_leaves_ = n_leaves
        self._set_rows(points, ids, alive)
        self.groups_ = np.asarray(groups, dtype=np.int64)
        self.n_features_in_ = int(points.shape[1])
        self.leaf_of_ = leaf_of(self.ids_, int(self.seed), n_leaves)
        empty = NodeOutput.empty(self.n_features_in_)
        # nodes_[level][node]: leaves first, the root last.
        self.nodes_: list[list[NodeOutput]] = [
            [empty] * nodes for nodes in nodes_per_level(int(self.fanout), int(self.height))
        ]

    def _recompute(self, leaves: np.ndarray) -> list[np.ndarray]:
        leaves = np.unique(leaves)
        rows = np.flatnonzero(self.alive_ & np.isin(self.leaf_of_, leaves))
        got = summarize_leaves(
            self.points_[rows], self.ids_[rows], self.groups_[rows], self.leaf_of_[rows], leaves,
            self.params_,
        )  # fmt: skip
        tree = SummaryTree(int(self.fanout), int(self.height), self.params_, self.n_features_in_,
                           levels=[dict(enumerate(level)) for level in self.nodes_])  # fmt: skip
        changed = tree.refresh(leaves, dict(zip(leaves.tolist(), got)))
        for level, nodes in enumerate(changed):
            for j in nodes.tolist():
                self.nodes_[level][j] = tree.levels[level][j]
        return changed

    def delete(self, ids) -> DeletionReport:
        """Forget ``ids``: recompute their leaves, then only those leaves' ancestors."""
        report, rows = self._start_deletion(ids)
        if rows.size:
            report.changed = self._recompute(self.leaf_of_[rows])
        return report

    # -- persistence ---------------------------------------------------------------------------
    def to_arrays(self, data: bool = True) -> dict[str, np.ndarray]:
        """Per level j (0: the leaves) ``level_<j>/candidates`` and ``level_<j>/evaluation``
        (ids, padded with -1), ``level_<j>/value`` and ``level_<j>/calls``; ``summary_ids`` (the
        root's summary, sorted); with ``data`` the rows (``points``, ``ids``, ``alive``,
        ``groups``)."""
        self._check_fitted()
        out = summary_arrays(self.nodes_, self.params_, self.summary_ids_)
        if data:
            out.update(self._row_arrays(True), groups=self.groups_)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], **params) -> FairSummary:
        """A fitted summary from :meth:`to_arrays` output (with its rows) and the parameters."""
        model = cls(**params)
        node_params, n_leaves = model._check_params()
        rows = rows_from_arrays(arrays)
        for name in ("points", "ids", "groups"):
            if rows is None or name not in rows:
                raise FairpipeInputError(NEEDS_ROWS.format(name=name))
        assert rows is not None
        points = np.asarray(rows["points"], dtype=np.float64)
        model._install(
            node_params, n_leaves, points, rows["ids"], rows["groups"], rows.get("alive")
        )

        def fetch(wanted: np.ndarray):
            at, _ = model._lookup.rows(wanted)
            return model.points_[at], model.groups_[at]

        for j in range(len(model.nodes_)):
            stored = {name: np.asarray(arrays[level_key(j, name)])
                      for name in ("candidates", "evaluation", "value", "calls")}  # fmt: skip
            model.nodes_[j] = nodes_from_arrays(stored["candidates"], stored["evaluation"], fetch,
                                                stored["value"], stored["calls"])  # fmt: skip
        model.nodes_[-1][0].summary = np.sort(np.asarray(arrays["summary_ids"], dtype=np.int64))
        return model

    # -- the summary ---------------------------------------------------------------------------
    @property
    def root_(self) -> NodeOutput:
        self._check_fitted()
        return self.nodes_[-1][0]

    @property
    def summary_ids_(self) -> np.ndarray:
        return self.root_.summary

    @property
    def value_(self) -> float:
        return self.root_.value

    @property
    def counts_(self) -> np.ndarray:
        rows, _ = self._lookup.rows(self.summary_ids_)
        return np.bincount(self.groups_[rows], minlength=len(self.params_.lower))

    @property
    def error_(self) -> int:
        return bound_error(self.counts_, self.params_.lower, self.params_.upper)

    @property
    def oracle_calls_(self) -> int:
        return int(sum(node.calls for level in self.nodes_ for node in level))
