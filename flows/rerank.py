"""Rerank flow: a candidates table (one row per (list, candidate)) -> the fair top-k of every list,
with the ranking-fairness metrics before and after.

The table is read and checked in the flow process (:func:`fairpipe.ranking.read_candidates`:
missing columns, an empty file, NaN scores, groups that the desired distribution does not cover,
and the reverse, are errors that name the row and the column; nothing is written then). Lists are
re-ranked in batches by :func:`fairpipe.ranking.rerank_lists`: in the flow process for small
inputs, as Dask tasks of ``LISTS_PER_TASK`` lists each for large ones.

The output keeps the input columns of the re-ranked top-k of each list, in rank order, with a
``rank`` column (1 = top); a list shorter than k keeps all its candidates. A metrics table (one row
per list: Skew per group, MinSkew, MaxSkew, NDKL, InfeasibleIndex, NDCG, before = the top-k by
score, and after) is written beside it as ``<out stem>.metrics.csv``. Both are written to
temporary files and renamed at the end.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
from prefect.cache_policies import NO_CACHE

from fairpipe.flows.dask_map import on_cluster
from fairpipe.flows.options import RerankOptions
from fairpipe.flows.outputs import TABLE_KINDS, check_output_file
from fairpipe.flows.private import flow, task
from fairpipe.flows.task_runner import default_task_runner, run_flow
from fairpipe.ranking import (
    METRICS,
    CandidateLists,
    mean_over_lists,
    metrics_table,
    read_candidates,
    rerank_lists,
)
from fairpipe.settings import RERANK, check_settings

LISTS_PER_TASK = 50_000
LOCAL_LISTS = 200_000  # up to this many lists, the flow process re-ranks them itself
PRECHECK_BYTES = 64 << 20  # smaller files are checked before the flow (and its cluster) starts


def prepare(path: str, o: RerankOptions) -> CandidateLists:
    """Check the options and read and check the table; nothing is written."""
    check_settings("rerank", RERANK, o)
    lists = read_candidates(path, o.desired, o.list_column, o.score_column, o.group_column)
    return lists


@task(name="rerank-batch", cache_policy=NO_CACHE)
def rerank_batch_task(scores, codes, starts, p, k, algorithm, smoothing) -> dict:
    """A batch of lists re-ranked by a Dask job (the task runs in the flow's process)."""
    return on_cluster(rerank_lists, scores, codes, starts, p, k, algorithm, smoothing)


def _write(frame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if path.name.lower().endswith(".parquet"):
        frame.to_parquet(tmp, index=False)
    else:
        frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


@flow(name="fairpipe-rerank", log_prints=False, task_runner=default_task_runner())
def rerank_flow(candidates: str, out: str, options: RerankOptions | None = None) -> dict:
    o = options or RerankOptions()
    t_start = time.perf_counter()
    out_path = Path(out)
    check_output_file(out_path, "--out", TABLE_KINDS)
    lists = prepare(candidates, o)
    t_read = time.perf_counter() - t_start
    n_lists = lists.list_ids.shape[0]
    per = LISTS_PER_TASK if o.partitions is None else max(1, math.ceil(n_lists / o.partitions))
    edges = list(range(0, n_lists, per)) + [n_lists]
    args = (o.k, o.algorithm, float(o.smoothing))

    def batch(a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = lists.starts[a], lists.starts[b]
        return (lists.scores[lo:hi], lists.codes[lo:hi], lists.starts[a : b + 1] - lo, lists.p[a:b])

    t0 = time.perf_counter()
    if o.partitions is None and n_lists <= LOCAL_LISTS:
        parts = [rerank_lists(*batch(a, b), *args) for a, b in zip(edges[:-1], edges[1:])]
    else:
        futures = [
            rerank_batch_task.submit(*batch(a, b), *args) for a, b in zip(edges[:-1], edges[1:])
        ]
        parts = [f.result() for f in futures]
    for a, part in zip(edges[:-1], parts):
        part["rows"] = part["rows"] + lists.starts[a]
    t_rank = time.perf_counter() - t0
    rows = np.concatenate([part["rows"] for part in parts])
    result_frame = lists.frame.iloc[rows].reset_index(drop=True)  # type: ignore[attr-defined]
    result_frame["rank"] = np.concatenate([part["rank"] for part in parts])
    metrics = metrics_table(lists, parts, o.list_column)
    metrics_path = out_path.with_name(out_path.name.split(".")[0] + ".metrics.csv")
    _write(result_frame, out_path)
    _write(metrics, metrics_path)
    summary = {
        when: {key: mean_over_lists(metrics[f"{key}_{when}"]) for key in METRICS}
        for when in ("before", "after")
    }
    for when in ("before", "after"):
        summary[when]["infeasible_lists"] = int((metrics[f"infeasible_index_{when}"] > 0).sum())
    return {
        "out": str(out_path),
        "metrics": str(metrics_path),
        "algorithm": o.algorithm,
        "k": o.k,
        "lists": int(n_lists),
        "rows_in": int(lists.scores.shape[0]),
        "rows_out": int(rows.shape[0]),
        "groups": lists.names,
        "mean": summary,
        "lists_per_second": n_lists / t_rank if t_rank > 0 else None,
        "timings": {"read": t_read, "rerank": t_rank, "total": time.perf_counter() - t_start},
    }


def run_rerank(
    candidates, out, options=None, dask_address=None, n_workers=2, processes=True, dask_cluster=None
):
    o = options or RerankOptions()
    check_output_file(str(out), "--out")  # before a cluster starts (the flow checks again)
    path = Path(str(candidates))
    if not path.is_file() or path.stat().st_size < PRECHECK_BYTES:
        prepare(str(candidates), o)  # bad input fails here, before a cluster starts
    return run_flow(rerank_flow, str(candidates), str(out), o, dask_address=dask_address,
                    n_workers=n_workers, processes=processes, dask_cluster=dask_cluster)  # fmt: skip


if __name__ == "__main__":
    import sys

    print(json.dumps(run_rerank(sys.argv[1], sys.argv[2]), default=str))
