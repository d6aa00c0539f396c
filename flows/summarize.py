"""Summarize flow: the store's live points -> a fair summary tree -> one commit.

Each leaf of the tree (a hash of (seed, id), as DC-k-means' tree) streams its live points through
the fair selector, as a Dask job per run of leaves (the same shuffle by leaf as the fit flow);
parents stream their children's candidates, bottom-up, in the flow (each holds at most
width * (k + sum l) elements); the root's summary is committed with every node's candidates and
evaluation ids, so that a deletion recomputes only the deleted rows' leaves and their ancestors
(:func:`update_summary_after_forget`, called by the forget flow).

Bounds are given as fractions of k for every group (l_c = floor(lower * k), u_c = ceil(upper * k))
or per group name in a JSON file: ``{"female": [3, 6], "male": {"lower": 3, "upper": 6}}``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.dc_kmeans import leaf_of
from fairpipe.errors import FairpipeInputError, check_positive_int
from fairpipe.fair_streaming import K_TOO_LARGE, bound_error, check_bounds
from fairpipe.fair_summary import NodeOutput, SummaryParams, merge_many, solve_leaves
from fairpipe.validation import IdLookup
from flows.fit import _gather, _split_chunk, shuffle_by_leaf
from flows.ingest import _default_task_runner
from storage.store import FairpipeStore, read_array
from storage.summary import (
    has_summary,
    padded,
    read_level,
    read_rows,
    summary_attrs,
    unpadded,
    update_summary,
    write_root,
    write_summary,
)

NO_BOUNDS = "No fairness bounds: give --lower and --upper (fractions of k) or --bounds FILE.json."
BOTH_BOUNDS = "Give either --lower/--upper or --bounds FILE.json, not both."
BAD_FRACTION = "--{which} must be a fraction of k between 0 and 1. Got {value!r} instead."
NO_BOUNDS_FILE = "The bounds file {path} does not exist."
BAD_BOUNDS_FILE = (
    "The bounds file {path} must hold a JSON object mapping each group name to [lower, upper] or "
    '{{"lower": L, "upper": U}}; {problem}.'
)
UNKNOWN_GROUP = (
    "The bounds file {path} names group {name!r}, which the store does not have (it has {known})."
)
MISSING_GROUP = "The bounds file {path} gives no bounds for group {name!r} of the store."
K_TOO_LARGE_STORE = K_TOO_LARGE.replace("the data", "the store {url}")


@dataclass
class SummarizeOptions:
    k: int = 10
    lower: float | None = None  # fraction of k, for every group
    upper: float | None = None
    bounds_file: str | None = None  # per group name, counts
    utility: str = "exemplar"
    rule: str = "swap"
    factor: float = 2.0
    eval_size: int = 2048
    gamma: float | None = None
    width: int = 16
    height: int = 2
    seed: int = 0
    lock_timeout: float = 0.0


def resolve_bounds(o: SummarizeOptions, names: list[str]) -> tuple[list[int], list[int]]:
    """Per-group (lower, upper) counts from the options, or an error naming what is wrong."""
    k = check_positive_int(o.k, "k", "summarize")
    if o.bounds_file is not None:
        if o.lower is not None or o.upper is not None:
            raise FairpipeInputError(BOTH_BOUNDS)
        return _bounds_from_file(o.bounds_file, names)
    if o.lower is None and o.upper is None:
        raise FairpipeInputError(NO_BOUNDS)
    lower = 0.0 if o.lower is None else o.lower
    upper = 1.0 if o.upper is None else o.upper
    for which, value in (("lower", lower), ("upper", upper)):
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise FairpipeInputError(BAD_FRACTION.format(which=which, value=value))
    lo = math.floor(lower * k + 1e-9)
    up = math.ceil(upper * k - 1e-9)
    return [lo] * len(names), [up] * len(names)


def _bounds_from_file(path: str, names: list[str]) -> tuple[list[int], list[int]]:
    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(NO_BOUNDS_FILE.format(path=path))
    try:
        spec = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise FairpipeInputError(
            BAD_BOUNDS_FILE.format(path=path, problem=f"it is not valid JSON ({exc})")
        ) from None
    if not isinstance(spec, dict):
        raise FairpipeInputError(BAD_BOUNDS_FILE.format(path=path, problem="it is not an object"))
    for name in spec:
        if name not in names:
            raise FairpipeInputError(UNKNOWN_GROUP.format(path=path, name=name, known=names))
    lower, upper = [], []
    for name in names:
        if name not in spec:
            raise FairpipeInputError(MISSING_GROUP.format(path=path, name=name))
        entry = spec[name]
        if isinstance(entry, dict) and set(entry) <= {"lower", "upper"}:
            pair = [entry.get("lower", 0), entry.get("upper", None)]
        elif isinstance(entry, list) and len(entry) == 2:
            pair = list(entry)
        else:
            problem = f"group {name!r} has {entry!r}"
            raise FairpipeInputError(BAD_BOUNDS_FILE.format(path=path, problem=problem))
        for value in pair:
            if value is not None and not isinstance(value, (int, float)):
                problem = f"group {name!r} has the non-numeric bound {value!r}"
                raise FairpipeInputError(BAD_BOUNDS_FILE.format(path=path, problem=problem))
        lower.append(pair[0])
        upper.append(pair[1])
    return lower, upper


def _names(attrs: dict) -> list[str]:
    return list(attrs.get("group_names") or ["all"])


def summary_params(o: SummarizeOptions, names: list[str]) -> SummaryParams:
    lower, upper = resolve_bounds(o, names)
    upper = [int(o.k) if u is None else u for u in upper]
    lo, up = check_bounds(o.k, lower, upper, names=names)
    params = SummaryParams(
        k=int(o.k), lower=tuple(int(v) for v in lo), upper=tuple(int(v) for v in up),
        utility=o.utility, gamma=o.gamma, eval_size=o.eval_size, rule=o.rule, factor=o.factor,
        seed=int(o.seed),
    )  # fmt: skip
    params.check("summarize")
    check_positive_int(o.width, "width", "summarize")
    if isinstance(o.height, bool) or not isinstance(o.height, int) or o.height < 0:
        raise FairpipeInputError(
            f"The 'height' parameter of summarize must be a non-negative integer. Got {o.height!r} instead."
        )
    return params


# -- the tree -------------------------------------------------------------------------------------
def _summarize_group(leaves, params: SummaryParams, d, *given) -> list[tuple[int, NodeOutput]]:
    X, ids, leaf, colours = _gather(d, given)
    mine = np.isin(leaf, leaves)
    out = solve_leaves(
        X[mine], ids[mine], colours[mine].astype(np.int64), leaf[mine], leaves, params
    )
    return list(zip(leaves.tolist(), out))


def level_arrays(outputs: list[NodeOutput], params: SummaryParams) -> dict[str, np.ndarray]:
    return {
        "candidates": padded([o.candidates for o in outputs], params.capacity),
        "evaluation": padded([o.evaluation for o in outputs], int(params.eval_size)),
        "value": np.array([o.value for o in outputs], dtype=np.float64),
        "calls": np.array([o.calls for o in outputs], dtype=np.int64),
    }


def merge_levels(levels, changed, width: int, height: int, params, load) -> list[np.ndarray]:
    """Recompute the ancestors of ``changed`` (leaves) level by level into ``levels`` (per level,
    {node: NodeOutput}); ``load(level, nodes)`` supplies children not already in ``levels``.
    Returns the nodes recomputed per level."""
    done = [np.asarray(changed, dtype=np.int64)]
    for level in range(1, height + 1):
        nodes = np.unique(done[-1] // width)
        kids = (nodes[:, None] * width + np.arange(width)).ravel()
        missing = np.array([c for c in kids if int(c) not in levels[level - 1]], dtype=np.int64)
        if missing.size:
            levels[level - 1].update(zip(missing.tolist(), load(level - 1, missing)))
        families = [[levels[level - 1][node * width + j] for j in range(width)] for node in nodes]
        levels[level].update(zip(nodes.tolist(), merge_many(families, params)))
        done.append(nodes)
    return done


def root_figures(root: NodeOutput, params: SummaryParams, names, colours_of) -> dict:
    counts = np.bincount(colours_of(root.summary), minlength=len(names))
    return {
        "ids": root.summary.tolist(),
        "value": float(root.value),
        "counts": dict(zip(names, counts.tolist())),
        "bounds": {n: [lo, up] for n, lo, up in zip(names, params.lower, params.upper)},
        "error": bound_error(counts, params.lower, params.upper),
    }


def check_request(store_url: str, o: SummarizeOptions):
    """Every option checked against the store, before anything is written: (store, its attrs,
    group names, params, groups of every row)."""
    store = FairpipeStore.open(store_url)
    attrs = store.require_data()
    names = _names(attrs)
    params = summary_params(o, names)
    n_alive = int(attrs["n_alive"])
    if params.k > n_alive:
        raise FairpipeInputError(K_TOO_LARGE_STORE.format(k=params.k, n=n_alive, url=store.url))
    session = store.readonly_session()
    alive, groups = read_array(session, "alive"), read_array(session, "groups")
    check_bounds(
        params.k, params.lower, params.upper,
        np.bincount(groups[alive], minlength=len(names)), names,
    )  # fmt: skip
    return store, attrs, names, params, groups


@task(name="summarize-leaves", cache_policy=NO_CACHE)
def summarize_leaves_task(session, n_rows, chunk_rows, params, n_leaves, leaves, rows=None):
    results = shuffle_by_leaf(
        session, n_rows, chunk_rows, int(params.seed), n_leaves, leaves, _summarize_group,
        (params,), rows,
    )  # fmt: skip
    return dict(pair for part in results for pair in part)


@flow(name="fairpipe-summarize", log_prints=False, task_runner=_default_task_runner())
def summarize_flow(store_url: str, options: SummarizeOptions | None = None) -> dict:
    """Summarize the live points of the store at ``store_url``: one commit."""
    o = options or SummarizeOptions()
    t_start = time.perf_counter()
    store, attrs, names, params, groups = check_request(store_url, o)
    n_alive, d = int(attrs["n_alive"]), int(attrs["d"])
    timings: dict[str, float] = {}
    n_leaves = int(o.width) ** int(o.height)
    with store.transaction(f"summarize k={params.k}", lock_timeout=o.lock_timeout) as txn:
        t0 = time.perf_counter()
        fork = txn.fork()
        leaves = summarize_leaves_task.submit(
            fork, int(attrs["n"]), int(attrs["chunk_rows"]), params, n_leaves, np.arange(n_leaves)
        ).result()
        txn.merge([fork])  # read only
        timings["leaves"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        levels: list[dict[int, NodeOutput]] = [
            {j: leaves.get(j, NodeOutput.empty(d)) for j in range(n_leaves)}
        ] + [{} for _ in range(o.height)]
        merge_levels(levels, np.arange(n_leaves), o.width, o.height, params, None)
        timings["parents"] = time.perf_counter() - t0
        root = levels[-1][0]
        lookup = IdLookup(read_array(txn.session, "ids"))
        figures = root_figures(root, params, names, lambda ids: groups[lookup.rows(ids)[0]])
        tree = {"width": int(o.width), "height": int(o.height)}
        summary = {k: v for k, v in figures.items() if k != "ids"}
        write_summary(
            txn.root,
            {**params.as_attrs(), **tree, "group_names": names, **summary},
            [level_arrays([lv[j] for j in sorted(lv)], params) for lv in levels],
            np.asarray(figures["ids"], dtype=np.int64),
        )
    timings["total"] = time.perf_counter() - t_start
    calls = int(sum(node.calls for lv in levels for node in lv.values()))
    return {
        "store": store.url,
        "commit": txn.commit_id,
        "k": params.k,
        "utility": params.utility,
        "rule": params.rule,
        **figures,
        "eval_points": int(root.eval_points.shape[0]),
        "oracle_calls": calls,
        "n_alive": n_alive,
        "leaves": n_leaves,
        "elements_per_second": n_alive / timings["total"],
        "timings": timings,
    }


# -- deletions ------------------------------------------------------------------------------------
def _load_nodes(session, lookup: IdLookup, d: int):
    """``load(level, nodes)`` for :func:`merge_levels`: stored nodes with their points read back."""

    def load(level: int, nodes: np.ndarray) -> list[NodeOutput]:
        cand = read_level(session, level, "candidates", nodes)
        evals = read_level(session, level, "evaluation", nodes)
        wanted = np.unique(np.concatenate([cand[cand >= 0], evals[evals >= 0]]))
        rows, _ = lookup.rows(wanted)
        order = np.argsort(rows)
        X = np.empty((wanted.shape[0], d), dtype=np.float64)
        colours = np.empty(wanted.shape[0], dtype=np.int64)
        X[order] = read_rows(session, "points", rows[order])
        colours[order] = read_rows(session, "groups", rows[order])
        out = []
        for c_row, e_row in zip(cand, evals):
            c_ids, e_ids = unpadded(c_row), unpadded(e_row)
            ci, ei = np.searchsorted(wanted, c_ids), np.searchsorted(wanted, e_ids)
            out.append(NodeOutput(c_ids, X[ci], colours[ci], e_ids, X[ei]))
        return out

    return load


def update_summary_after_forget(txn, all_ids, alive_after, rows, n_rows, chunk_rows, local_rows):
    """Recompute the summary nodes the erased ``rows`` reach: their leaves from the remaining
    points (in this process when they hold at most ``local_rows`` rows, else on Dask), then those
    leaves' ancestors. Call after the rows are erased (groups and alive)."""
    if not has_summary(txn.session):
        return {}
    a = summary_attrs(txn.session)
    params = SummaryParams.from_attrs(a)
    width, height = int(a["width"]), int(a["height"])
    n_leaves = width**height
    d = int(read_array(txn.session, "points", slice(0, 1)).shape[1])
    leaf_all = leaf_of(all_ids, params.seed, n_leaves)
    leaves = np.unique(leaf_all[rows])
    leaf_rows = np.flatnonzero(alive_after & np.isin(leaf_all, leaves))
    if leaf_rows.size <= local_rows:  # the same functions as the Dask path, without round trips
        parts = [
            _split_chunk(txn.session, int(c), min(int(c) + chunk_rows, n_rows), params.seed,
                         n_leaves, np.zeros(1, np.int64), leaf_rows).get(0)
            for c in np.unique(leaf_rows // chunk_rows) * chunk_rows
        ]  # fmt: skip
        got = dict(_summarize_group(leaves, params, d, *parts))
    else:
        fork = txn.fork()
        got = summarize_leaves_task.submit(
            fork, n_rows, chunk_rows, params, n_leaves, leaves, leaf_rows
        ).result()
        txn.merge([fork])  # read only
    levels: list[dict[int, NodeOutput]] = [
        {int(j): got.get(int(j), NodeOutput.empty(d)) for j in leaves}
    ] + [{} for _ in range(height)]
    lookup = IdLookup(all_ids)
    changed = merge_levels(
        levels, leaves, width, height, params, _load_nodes(txn.session, lookup, d)
    )
    for level, nodes in enumerate(changed):
        outs = [levels[level][int(j)] for j in nodes]
        update_summary(txn.root, level, nodes, level_arrays(outs, params))
    groups = read_array(txn.session, "groups")
    names = list(a["group_names"])
    figures = root_figures(levels[-1][0], params, names, lambda ids: groups[lookup.rows(ids)[0]])
    write_root(
        txn.root,
        {k: v for k, v in figures.items() if k != "ids"},
        np.asarray(figures["ids"], dtype=np.int64),
    )
    return {
        "summary_nodes_recomputed": int(sum(n.size for n in changed)),
        "summary_error": figures["error"],
    }


def run_summarize(store_url, options=None, dask_address=None, n_workers=2, processes=True):
    from flows.runtime import prefect_api, task_runner

    check_request(str(store_url), options or SummarizeOptions())  # bad input: no cluster started
    with prefect_api():
        runner = task_runner(dask_address, n_workers=n_workers, processes=processes)
        return summarize_flow.with_options(task_runner=runner)(
            str(store_url), options or SummarizeOptions()
        )


if __name__ == "__main__":
    import sys

    print(json.dumps(run_summarize(sys.argv[1], SummarizeOptions(k=10, lower=0.1, upper=0.3))))
