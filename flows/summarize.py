"""Summarize flow: the store's live points -> a fair summary tree -> one commit.

Each leaf of the tree (a hash of (seed, id), as DC-k-means' tree) streams its live points through
the fair selector, as a Dask job per run of leaves (the same shuffle by leaf as the fit flow);
parents stream their children's candidates, bottom-up, in the flow (each holds at most
fanout * (k + sum l) elements); the root's summary is committed with every node's candidates and
evaluation ids, so that a deletion or an append recomputes only the leaves its rows reach and
their ancestors (:func:`fairpipe.flows.update.update_summary_tree`, called by the forget and ingest flows).
The nodes are computed by the same functions as :class:`fairpipe.summary.FairSummary` in memory,
so the stored arrays are its arrays.

Bounds are given as fractions of k for every group (l_c = floor(lower * k), u_c = ceil(upper * k))
or per group name in a JSON file: ``{"female": [3, 6], "male": {"lower": 3, "upper": 6}}``.
"""

from __future__ import annotations

import json
import time

import numpy as np
from prefect.cache_policies import NO_CACHE

from fairpipe.errors import K_TOO_LARGE, FairpipeInputError
from fairpipe.flows.leaf_shuffle import shuffle_by_leaf
from fairpipe.flows.options import SummarizeOptions
from fairpipe.flows.private import flow, task
from fairpipe.flows.task_runner import default_task_runner, run_flow
from fairpipe.storage.lineage import options_record, record
from fairpipe.storage.rows import RowBlocks, read_alive, read_groups, read_ids, read_points_at
from fairpipe.storage.store import FairpipeStore
from fairpipe.storage.summary import (
    summary_store_attrs,
    write_summary,
)
from fairpipe.summary import (
    FairSummary,
    NodeOutput,
    SummaryParams,
    SummaryTree,
    Utility,
    bound_error,
    check_bounds,
    fair_greedy,
    random_feasible_rows,
    resolve_bounds,
    root_figures,
    summarize_leaf_group,
    summary_arrays,
)
from fairpipe.validation import IdLookup


def _names(attrs: dict) -> list[str]:
    return list(attrs.get("group_names") or ["all"])


def summary_params(o: SummarizeOptions, names: list[str]) -> SummaryParams:
    """The node parameters of the summary the options ask for, checked (FairSummary's rules)."""
    lower, upper = resolve_bounds(o.k, names, o.lower, o.upper, o.bounds)
    model = FairSummary(
        k=o.k, lower=lower, upper=upper, utility=o.utility, fanout=o.fanout, height=o.height,
        eval_size=o.eval_size, rule=o.rule, factor=o.factor, gamma=o.gamma, seed=o.seed,
    )  # fmt: skip
    check_bounds(o.k, lower, upper, names=names)  # errors name the groups
    return model.node_params()


# -- the tree -------------------------------------------------------------------------------------
def check_request(store_url: str, o: SummarizeOptions, session=None):
    """Every option checked against the store (at ``session``, default its tip), before anything
    is written: (store, its attrs, group names, params, groups of every row). The flow checks
    twice: before a cluster starts, and again inside the writer lock, on what it will read."""
    store = FairpipeStore.open(store_url)
    store.require_data()
    session = session if session is not None else store.readonly_session()
    attrs = store.attrs(session)
    names = _names(attrs)
    params = summary_params(o, names)
    n_alive = int(attrs["n_alive"])
    if params.k > n_alive:
        what = f"elements of the store {store.url}"
        raise FairpipeInputError(K_TOO_LARGE.format(name="k", k=params.k, n=n_alive, what=what))
    alive, groups = read_alive(session), read_groups(session)
    check_bounds(
        params.k, params.lower, params.upper,
        np.bincount(groups[alive], minlength=len(names)), names,
    )  # fmt: skip
    return store, attrs, names, params, groups


# Random feasible selections drawn for the reference utility (their mean is reported).
REFERENCE_DRAWS = 5


def reference_utilities(session, root: NodeOutput, params: SummaryParams, groups: np.ndarray,
                        alive: np.ndarray, lookup: IdLookup) -> dict:  # fmt: skip
    """What the summary's utility is compared with, measured on the root's evaluation points:

    - ``random``: the mean utility of REFERENCE_DRAWS random selections of the same size within
      the same bounds (the gain of selecting over drawing). They are drawn from the evaluation
      points themselves, a uniform sample of the live rows held in memory, and each is measured
      on the other evaluation points (a point drawn would otherwise count as perfectly
      represented). A group with fewer evaluation points than its lower bound is topped up with
      random live rows of it: only those are read.
    - ``unconstrained``: the lazy greedy over the root's candidates without the bounds (what
      the bounds cost on the same candidates; no row is read).
    """
    rng = np.random.default_rng(int(params.seed))
    lower, upper, k = np.asarray(params.lower), np.asarray(params.upper), int(params.k)
    E = root.eval_points
    m = E.shape[0]
    eval_rows = lookup.rows(root.evaluation)[0]
    pool_groups, pool_X = groups[eval_rows].astype(np.int64), E
    short = lower - np.bincount(pool_groups, minlength=lower.size)[: lower.size]
    if (short > 0).any():
        outside = alive.copy()
        outside[eval_rows] = False
        extra = np.concatenate([
            rng.choice(np.flatnonzero(outside & (groups == c)),
                       size=int(min(short[c], (outside & (groups == c)).sum())), replace=False)
            for c in np.flatnonzero(short > 0)
        ]).astype(np.int64)  # fmt: skip
        extra.sort()
        pool_X = np.vstack([E, read_points_at(session, extra)])
        pool_groups = np.concatenate([pool_groups, groups[extra].astype(np.int64)])
    values = []
    for _ in range(REFERENCE_DRAWS):
        drawn = random_feasible_rows(pool_groups, lower, upper, k, rng)
        others = np.ones(m, bool)
        others[drawn[drawn < m]] = False
        measured = E[others] if others.any() else E  # (every point drawn: eval_size <= k)
        values.append(Utility(params.utility, measured, params.gamma).value(pool_X[drawn]))
    out = {"random": {"value": float(np.mean(values)), "draws": REFERENCE_DRAWS}}
    n_cand = int(root.candidates.shape[0])
    if n_cand:
        util = Utility(params.utility, E, params.gamma)
        k_free = min(k, n_cand)
        n_groups = lower.size
        free = fair_greedy(root.cand_points, root.cand_groups, [0] * n_groups,
                           [k_free] * n_groups, k_free, utility=util)  # fmt: skip
        out["unconstrained"] = {"value": free.value,
                                "error": int(bound_error(free.counts, lower, upper))}  # fmt: skip
    return out


@task(name="summarize-leaves", cache_policy=NO_CACHE)
def summarize_leaves_task(session, blocks: RowBlocks, params, n_leaves, leaves,
                          rows=None) -> dict:  # fmt: skip
    results = shuffle_by_leaf(
        session, blocks, int(params.seed), n_leaves, leaves, summarize_leaf_group, (params,), rows
    )
    return dict(pair for part in results for pair in part)


@flow(name="fairpipe-summarize", log_prints=False, task_runner=default_task_runner())
def summarize_flow(store_url: str, options: SummarizeOptions | None = None) -> dict:
    """Summarize the live points of the store at ``store_url``: one commit."""
    o = options or SummarizeOptions()
    t_start = time.perf_counter()
    store, *_ = check_request(store_url, o)
    timings: dict[str, float] = {}
    n_leaves = int(o.fanout) ** int(o.height)
    with store.transaction(f"summarize k={o.k}", lock_timeout=o.lock_timeout) as txn:
        # What the summary is built from is read inside the lock (a concurrent ingest may have
        # committed since the first check).
        _, attrs, names, params, groups = check_request(store_url, o, txn.session)
        n_alive, d = int(attrs["n_alive"]), int(attrs["d"])
        t0 = time.perf_counter()
        leaves = txn.reading(summarize_leaves_task, RowBlocks.of(attrs), params, n_leaves,
                             np.arange(n_leaves))  # fmt: skip
        timings["leaves"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tree = SummaryTree(o.fanout, o.height, params, d)
        tree.refresh(np.arange(n_leaves), leaves)
        timings["parents"] = time.perf_counter() - t0
        root = tree.root
        lookup = IdLookup(read_ids(txn.session))
        figures = root_figures(root, params, names, lambda ids: groups[lookup.rows(ids)[0]])
        arrays = summary_arrays(tree.in_order(), params, np.asarray(figures["ids"]))
        summary = {k: v for k, v in figures.items() if k != "ids"}
        store_attrs = summary_store_attrs(params, o.fanout, o.height)
        write_summary(txn.root, {**store_attrs, "group_names": names, **summary}, arrays)
        t0 = time.perf_counter()
        alive = read_alive(txn.session)
        reference = reference_utilities(txn.session, root, params, groups, alive, lookup)
        timings["reference"] = time.perf_counter() - t0
        record(txn, "summarize", options_record(o), rows={"n_alive": n_alive},
               figures={"utility": figures["value"], "error": figures["error"],
                        "random_utility": reference["random"]["value"]})  # fmt: skip
    timings["total"] = time.perf_counter() - t_start
    calls = int(sum(node.calls for lv in tree.levels for node in lv.values()))
    return {
        "store": store.url,
        "commit": txn.commit_id,
        "k": params.k,
        "utility": params.utility,
        "rule": params.rule,
        **figures,
        "eval_points": int(root.eval_points.shape[0]),
        "reference": reference,
        "oracle_calls": calls,
        "n_alive": n_alive,
        "leaves": n_leaves,
        "elements_per_second": n_alive / timings["total"],
        "timings": timings,
    }


def run_summarize(
    store_url, options=None, dask_address=None, n_workers=2, processes=True, dask_cluster=None
):
    o = options or SummarizeOptions()
    check_request(str(store_url), o)  # bad input: no cluster started
    return run_flow(summarize_flow, str(store_url), o, dask_address=dask_address,
                    n_workers=n_workers, processes=processes, dask_cluster=dask_cluster)  # fmt: skip


if __name__ == "__main__":
    import sys

    print(json.dumps(run_summarize(sys.argv[1], SummarizeOptions(k=10, lower=0.1, upper=0.3))))
