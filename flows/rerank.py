"""Rerank flow: a candidates table (one row per (list, candidate)) -> the fair top-k of every list,
with the ranking-fairness metrics before and after.

The table is read and checked in the flow process (missing columns, an empty file, NaN scores,
groups that the desired distribution does not cover, and the reverse, are errors that name the
row and the column; nothing is written then). Lists are packed into padded batches (lists x
candidates) and re-ranked by the compiled kernels of :mod:`fairpipe.reranking`: in the flow
process for small inputs, as Dask tasks of ``LISTS_PER_TASK`` lists each for large ones.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.errors import FairpipeInputError, check_one_of, check_positive_int
from fairpipe.ranking_metrics import ndcg, ranking_metrics
from fairpipe.reranking import ALGORITHMS, check_desired, rerank
from flows.ingest import _default_task_runner

NO_FILE = "The candidates file {path} does not exist."
EMPTY = "The candidates file {path} holds no rows."
BAD_FORMAT = "The candidates file {path} must be .csv, .csv.gz or .parquet."
MISSING_COLUMN = "Column {col!r} ({option}) is not in {path}; its columns are {columns}."
NAN_SCORE = "Row {row} of {path} has no number in the score column {col!r} (list {list!r})."
NAN_GROUP = "Row {row} of {path} has no value in the group column {col!r}."
GROUP_NOT_DESIRED = (
    "Row {row} of {path} (list {list!r}) has group {group!r}, which the desired distribution "
    "{desired} does not cover (it covers {known})."
)
DESIRED_NOT_IN_DATA = (
    "The desired distribution {desired} names group {group!r}, which no row of {path} has "
    "(its groups are {known})."
)
BAD_DESIRED = (
    "The desired distribution file {path} must hold a JSON object mapping each group to its "
    "share; {problem}."
)
LISTS_PER_TASK = 50_000
LOCAL_LISTS = 200_000  # up to this many lists, the flow process re-ranks them itself
PRECHECK_BYTES = 64 << 20  # smaller files are checked before the flow (and its cluster) starts


@dataclass
class RerankOptions:
    algorithm: str = "detconstsort"
    k: int = 10
    desired: str = "population"  # a JSON file, or "population": each list's own distribution
    list_column: str = "list"
    score_column: str = "score"
    group_column: str = "group"
    smoothing: float = 0.0  # Skew's zero-count smoothing (0: -inf, the paper's definition)
    partitions: int | None = None  # force Dask with this many tasks (tests); None: by size


def _read(path: str):
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(NO_FILE.format(path=path))
    name = p.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        try:
            frame = pd.read_csv(p)
        except pd.errors.EmptyDataError:
            raise FairpipeInputError(EMPTY.format(path=path)) from None
    elif name.endswith(".parquet"):
        frame = pd.read_parquet(p)
    else:
        raise FairpipeInputError(BAD_FORMAT.format(path=path))
    if frame.shape[0] == 0:
        raise FairpipeInputError(EMPTY.format(path=path))
    return frame


def _desired_file(path: str) -> dict[str, float]:
    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(BAD_DESIRED.format(path=path, problem="the file does not exist"))
    try:
        spec = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise FairpipeInputError(
            BAD_DESIRED.format(path=path, problem=f"it is not valid JSON ({exc})")
        ) from None
    if not isinstance(spec, dict) or not spec:
        raise FairpipeInputError(BAD_DESIRED.format(path=path, problem="it is not an object"))
    for name, share in spec.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise FairpipeInputError(
                BAD_DESIRED.format(path=path, problem=f"group {name!r} has {share!r}")
            )
        if not share >= 0:
            raise FairpipeInputError(
                BAD_DESIRED.format(
                    path=path, problem=f"group {name!r} has the negative share {share!r}"
                )
            )
    total = sum(float(v) for v in spec.values())
    if abs(total - 1.0) > 1e-6:
        raise FairpipeInputError(
            BAD_DESIRED.format(path=path, problem=f"the shares sum to {total:g}, not 1")
        )
    return {str(k): float(v) for k, v in spec.items()}


@dataclass
class Prepared:
    frame: object  # the input table, rows in list order then input order
    list_ids: np.ndarray  # one per list, in order
    starts: np.ndarray  # (lists + 1,) row offsets of each list in ``frame``
    scores: np.ndarray  # float64 (rows,)
    codes: np.ndarray  # int64 (rows,) group codes
    names: list[str]
    p: np.ndarray  # (lists, groups)


def prepare(path: str, o: RerankOptions) -> Prepared:
    """Read and check the table and the options; nothing is written."""
    check_one_of(o.algorithm, ALGORITHMS, "algorithm", "rerank")
    check_positive_int(o.k, "k", "rerank")
    if not (isinstance(o.smoothing, (int, float)) and o.smoothing >= 0):
        raise FairpipeInputError(
            f"The 'smoothing' parameter of rerank must be a non-negative number. Got {o.smoothing!r} instead."
        )
    desired = None if o.desired == "population" else _desired_file(o.desired)
    frame = _read(path)
    columns = list(map(str, frame.columns))
    for col, option in ((o.list_column, "--list-column"), (o.score_column, "--score-column"),
                        (o.group_column, "--group-column")):  # fmt: skip
        if col not in frame.columns:
            raise FairpipeInputError(
                MISSING_COLUMN.format(col=col, option=option, path=path, columns=columns)
            )
    frame = frame.reset_index(drop=True)
    groups = frame[o.group_column]
    missing = groups.isna().to_numpy()
    if missing.any():
        raise FairpipeInputError(
            NAN_GROUP.format(row=int(np.argmax(missing)), path=path, col=o.group_column)
        )
    groups = groups.astype(str)
    import pandas as pd

    scores = pd.to_numeric(frame[o.score_column], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        r = int(bad[0])
        raise FairpipeInputError(
            NAN_SCORE.format(row=r, path=path, col=o.score_column, list=frame[o.list_column][r])
        )
    present = sorted(groups.unique().tolist())
    if desired is None:
        names = present
    else:
        names = sorted(desired)
        unknown = ~groups.isin(names).to_numpy()
        if unknown.any():
            r = int(np.argmax(unknown))
            raise FairpipeInputError(
                GROUP_NOT_DESIRED.format(row=r, path=path, list=frame[o.list_column][r],
                                         group=groups[r], desired=o.desired, known=names)
            )  # fmt: skip
        for name in names:
            if name not in present:
                raise FairpipeInputError(
                    DESIRED_NOT_IN_DATA.format(desired=o.desired, group=name, path=path,
                                               known=present)
                )  # fmt: skip
    codes = groups.map({n: i for i, n in enumerate(names)}).to_numpy(dtype=np.int64)
    # Lists in order of first appearance; rows of a list keep their input order.
    list_codes, list_ids = pd.factorize(frame[o.list_column], sort=False)
    order = np.argsort(list_codes, kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    scores, codes, list_codes = scores[order], codes[order], list_codes[order]
    sizes = np.bincount(list_codes, minlength=len(list_ids))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if desired is None:
        counts = np.zeros((len(list_ids), len(names)))
        np.add.at(counts, (list_codes, codes), 1.0)
        p = counts / sizes[:, None]
    else:
        p = check_desired(np.array([desired[n] for n in names]), 1, len(names))
        p = np.broadcast_to(p[0], (len(list_ids), len(names)))
    return Prepared(frame, np.asarray(list_ids), starts, scores, codes, names, np.asarray(p))


def rerank_lists(scores, codes, starts, p, k, algorithm, smoothing) -> dict:
    """Re-rank the lists [starts[i], starts[i+1]) of the flat arrays (one batch): the output rows
    (flat positions, in rank order per list, with ranks) and per-list metrics before and after."""
    n_lists = starts.shape[0] - 1
    sizes = np.diff(starts)
    width = int(sizes.max()) if n_lists else 0
    col = np.arange(width)[None, :]
    valid = col < sizes[:, None]
    flat = np.where(valid, starts[:-1, None] + col, 0)
    S = np.where(valid, scores[flat], -np.inf)
    G = np.where(valid, codes[flat], -1)
    after = rerank(S, G, p, k, algorithm)
    before = np.argsort(-S, axis=1, kind="stable")[:, :k]  # the top-k by score
    before = np.where(np.take_along_axis(valid, before, axis=1), before, -1)
    out: dict = {}
    for name, ranking in (("before", before), ("after", after)):
        ok = ranking >= 0
        safe = np.maximum(ranking, 0)
        ranked_groups = np.where(ok, np.take_along_axis(G, safe, axis=1), -1)
        ranked_scores = np.where(ok, np.take_along_axis(S, safe, axis=1), np.nan)
        m = ranking_metrics(ranked_groups, p, smoothing=smoothing)
        m["ndcg"] = ndcg(ranked_scores, np.where(valid, S, np.nan))
        out[name] = m
    ok = after >= 0
    out["rows"] = np.take_along_axis(flat, np.maximum(after, 0), axis=1)[ok]
    out["rank"] = np.broadcast_to(np.arange(1, after.shape[1] + 1), after.shape)[ok]
    return out


@task(name="rerank-batch", cache_policy=NO_CACHE)
def rerank_batch_task(scores, codes, starts, p, k, algorithm, smoothing) -> dict:
    return rerank_lists(scores, codes, starts, p, k, algorithm, smoothing)


def _metrics_table(prep: Prepared, parts: list[dict], list_column: str):
    import pandas as pd

    table: dict = {list_column: prep.list_ids}
    for when in ("before", "after"):
        merged = {
            key: np.concatenate([part[when][key] for part in parts]) for key in parts[0][when]
        }
        for j, name in enumerate(prep.names):
            table[f"skew_{name}_{when}"] = merged["skew"][:, j]
        for key in ("min_skew", "max_skew", "ndkl", "infeasible_index", "ndcg"):
            table[f"{key}_{when}"] = merged[key]
    return pd.DataFrame(table)


def _mean(values) -> float | None:
    """Mean over lists; None where it is not a finite number (e.g. MinSkew -inf)."""
    v = float(np.mean(values)) if len(values) else float("nan")
    return v if math.isfinite(v) else None


def _write(frame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if path.name.lower().endswith(".parquet"):
        frame.to_parquet(tmp, index=False)
    else:
        frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


@flow(name="fairpipe-rerank", log_prints=False, task_runner=_default_task_runner())
def rerank_flow(candidates: str, out: str, options: RerankOptions | None = None) -> dict:
    o = options or RerankOptions()
    t_start = time.perf_counter()
    out_path = Path(out)
    if not out_path.name.lower().endswith((".csv", ".parquet")):
        raise FairpipeInputError(f"--out must end in .csv or .parquet. Got {out!r}.")
    prep = prepare(candidates, o)
    t_read = time.perf_counter() - t_start
    n_lists = prep.list_ids.shape[0]
    per = LISTS_PER_TASK if o.partitions is None else max(1, math.ceil(n_lists / o.partitions))
    edges = list(range(0, n_lists, per)) + [n_lists]
    args = (o.k, o.algorithm, float(o.smoothing))

    def batch(a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = prep.starts[a], prep.starts[b]
        return (prep.scores[lo:hi], prep.codes[lo:hi], prep.starts[a : b + 1] - lo, prep.p[a:b])

    t0 = time.perf_counter()
    if o.partitions is None and n_lists <= LOCAL_LISTS:
        parts = [rerank_lists(*batch(a, b), *args) for a, b in zip(edges[:-1], edges[1:])]
    else:
        futures = [
            rerank_batch_task.submit(*batch(a, b), *args) for a, b in zip(edges[:-1], edges[1:])
        ]
        parts = [f.result() for f in futures]
    for a, part in zip(edges[:-1], parts):
        part["rows"] = part["rows"] + prep.starts[a]
    t_rank = time.perf_counter() - t0
    rows = np.concatenate([part["rows"] for part in parts])
    result_frame = prep.frame.iloc[rows].reset_index(drop=True)  # type: ignore[attr-defined]
    result_frame["rank"] = np.concatenate([part["rank"] for part in parts])
    metrics = _metrics_table(prep, parts, o.list_column)
    metrics_path = out_path.with_name(out_path.name.split(".")[0] + ".metrics.csv")
    _write(result_frame, out_path)
    _write(metrics, metrics_path)
    summary = {
        when: {
            key: _mean(metrics[f"{key}_{when}"])
            for key in ("min_skew", "max_skew", "ndkl", "infeasible_index", "ndcg")
        }
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
        "rows_in": int(prep.scores.shape[0]),
        "rows_out": int(rows.shape[0]),
        "groups": prep.names,
        "mean": summary,
        "lists_per_second": n_lists / t_rank if t_rank > 0 else None,
        "timings": {"read": t_read, "rerank": t_rank, "total": time.perf_counter() - t_start},
    }


def run_rerank(candidates, out, options=None, dask_address=None, n_workers=2, processes=True):
    from flows.runtime import prefect_api, task_runner

    o = options or RerankOptions()
    path = Path(str(candidates))
    if not path.is_file() or path.stat().st_size < PRECHECK_BYTES:
        prepare(str(candidates), o)  # bad input fails here, before a cluster starts
    with prefect_api():
        runner = task_runner(dask_address, n_workers=n_workers, processes=processes)
        return rerank_flow.with_options(task_runner=runner)(str(candidates), str(out), o)


if __name__ == "__main__":
    import sys

    print(json.dumps(run_rerank(sys.argv[1], sys.argv[2]), default=str))
