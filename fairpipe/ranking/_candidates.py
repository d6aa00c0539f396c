"""Candidate tables: one row per (list, candidate), read, checked and re-ranked list by list.

:func:`read_candidates` reads a CSV or Parquet table and checks it against the desired
distribution (a JSON file of shares, or ``"population"``: each list's own group distribution);
missing columns, an empty file, NaN scores, groups that the desired distribution does not cover
(and the reverse) are errors naming the row and the column. :func:`rerank_lists` re-ranks a batch
of consecutive lists (padded into lists x candidates) and measures them before (the top k by
score) and after; :func:`metrics_table` puts the per-list figures into one table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairpipe.errors import (
    FairpipeInputError,
    plain,
)
from fairpipe.ranking._metrics import ndcg, ranking_metrics
from fairpipe.ranking._reranking import check_desired, rerank
from fairpipe.tables import (
    check_flat_columns,
    count_lines,
    csv_errors,
    parquet_errors,
    read_csv_table,
    read_parquet_table,
)
from fairpipe.validation import read_json_object, row_name, text_row_name

NO_FILE = "The candidates file {path} does not exist."
EMPTY = "The candidates file {path} holds no rows."
BAD_FORMAT = "The candidates file {path} must be .csv, .csv.gz or .parquet."
MISSING_COLUMN = "Column {col!r} ({option}) is not in {path}; its columns are {columns}."
NAN_SCORE = "{At} has no number in the score column {col!r} (list {list})."
NAN_GROUP = "{At} has no value in the group column {col!r}."
GROUP_NOT_DESIRED = (
    "{At} (list {list}) has group {group}, which the desired distribution "
    "{desired} does not cover (it covers {known})."
)
DESIRED_NOT_IN_DATA = (
    "The desired distribution {desired} names group {group}, which no row of {path} has "
    "(its groups are {known})."
)
BAD_DESIRED = (
    "The desired distribution file {path} must hold a JSON object mapping each group to its "
    "share; {problem}."
)
METRICS = ("min_skew", "max_skew", "ndkl", "infeasible_index", "ndcg")


def read_table(path: str, flat: dict[str, tuple[str, str]] | None = None):
    """A candidates table (CSV, CSV.gz or Parquet), or an error naming what is wrong (not UTF-8,
    not CSV, not Parquet: :mod:`fairpipe.tables`); in a Parquet file, the columns ``flat`` names
    (:func:`fairpipe.tables.check_flat_columns`) must hold one value per row."""
    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(NO_FILE.format(path=path))
    name = p.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        frame = read_csv_table(p, empty=EMPTY.format(path=path))
    elif name.endswith(".parquet"):
        frame = read_parquet_table(p, flat)
    else:
        raise FairpipeInputError(BAD_FORMAT.format(path=path))
    if frame.shape[0] == 0:
        raise FairpipeInputError(EMPTY.format(path=path))
    return frame


def load_desired_file(path: str) -> dict[str, float]:
    """Shares per group name from a JSON object; they must be non-negative and sum to 1."""
    bad = BAD_DESIRED.replace("{path}", str(path).replace("{", "{{").replace("}", "}}"))
    spec = read_json_object(path, bad.format(problem="the file does not exist"), bad)
    if not spec:
        raise FairpipeInputError(bad.format(problem="it is empty"))
    for name, share in spec.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise FairpipeInputError(
                BAD_DESIRED.format(path=path, problem=f"group {name!r} has {share!r}")
            )
        if not math.isfinite(share):  # JSON's NaN and Infinity, which Python reads
            raise FairpipeInputError(BAD_DESIRED.format(
                path=path, problem=f"group {name!r} has the share {share}, not a number >= 0"
            ))  # fmt: skip
        if share < 0:
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
class CandidateLists:
    """A checked candidates table: flat arrays in list order, and where each list starts."""

    frame: object  # the input table, rows in list order then input order
    list_ids: np.ndarray  # one per list, in order
    starts: np.ndarray  # (lists + 1,) row offsets of each list in ``frame``
    scores: np.ndarray  # float64 (rows,)
    codes: np.ndarray  # int64 (rows,) group codes
    names: list[str]
    p: np.ndarray  # (lists, groups)


def check_table_ahead(path: str, flat: dict[str, tuple[str, str]]) -> None:
    """What is checked of the table ``path`` before it is read, in one pass over its bytes at
    most: a Parquet file's footer (it is Parquet; the columns ``flat`` names hold one value per
    row: :func:`fairpipe.tables.check_flat_columns`), or a CSV's text (it is UTF-8, naming the
    line of the first byte that is not)."""
    p = Path(path)
    name = p.name.lower()
    if not p.is_file():
        return  # read_table names what is missing
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        with parquet_errors(p), open(p, "rb") as f:
            meta = pq.ParquetFile(f).metadata
        check_flat_columns(meta.schema.to_arrow_schema(), p.name, flat)
    elif name.endswith((".csv", ".csv.gz")):
        with csv_errors(p):  # (a .gz that is not one: not CSV)
            count_lines(p)


def candidate_columns(list_column: str, score_column: str, group_column: str) -> dict:
    """What the table's list, score and group columns hold in each row
    (:func:`fairpipe.tables.check_flat_columns`)."""
    return {list_column: ("the list column (--list-column)", "value"),
            score_column: ("the score column (--score-column)", "number"),
            group_column: ("the group column (--group-column)", "value")}  # fmt: skip


def _row_of(path: str, row: int) -> str:
    """The 0-based data row ``row`` of the table ``path`` as a message's subject: its line in a
    CSV ("Line 7 of c.csv"), its row counted from 1 in Parquet ("Row 6 of c.parquet")."""
    csv = str(path).lower().endswith((".csv", ".csv.gz"))
    at = text_row_name(path, row) if csv else row_name(row, Path(path).name)
    return at[:1].upper() + at[1:]


def read_candidates(path: str, desired: str = "population", list_column: str = "list",
                    score_column: str = "score", group_column: str = "group") -> CandidateLists:  # fmt: skip
    """Read and check the table against the desired distribution (a JSON file, or
    ``"population"``); nothing is written."""
    import pandas as pd

    shares = None if desired == "population" else load_desired_file(desired)
    frame = read_table(path, candidate_columns(list_column, score_column, group_column))
    columns = list(map(str, frame.columns))
    for col, option in ((list_column, "--list-column"), (score_column, "--score-column"),
                        (group_column, "--group-column")):  # fmt: skip
        if col not in frame.columns:
            raise FairpipeInputError(
                MISSING_COLUMN.format(col=col, option=option, path=path, columns=columns)
            )
    frame = frame.reset_index(drop=True)
    groups = frame[group_column]
    missing = groups.isna().to_numpy()
    if missing.any():
        raise FairpipeInputError(
            NAN_GROUP.format(At=_row_of(path, int(np.argmax(missing))), col=group_column)
        )
    groups = groups.astype(str)
    scores = pd.to_numeric(frame[score_column], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        r = int(bad[0])
        raise FairpipeInputError(
            NAN_SCORE.format(
                At=_row_of(path, r), col=score_column, list=plain(frame[list_column][r])
            )  # fmt: skip
        )
    present = sorted(groups.unique().tolist())
    if shares is None:
        names = present
    else:
        names = sorted(shares)
        unknown = ~groups.isin(names).to_numpy()
        if unknown.any():
            r = int(np.argmax(unknown))
            raise FairpipeInputError(
                GROUP_NOT_DESIRED.format(At=_row_of(path, r), list=plain(frame[list_column][r]),
                                         group=plain(groups[r]), desired=desired, known=names)
            )  # fmt: skip
        for name in names:
            if name not in present:
                raise FairpipeInputError(
                    DESIRED_NOT_IN_DATA.format(desired=desired, group=plain(name), path=path,
                                               known=present)
                )  # fmt: skip
    codes = groups.map({n: i for i, n in enumerate(names)}).to_numpy(dtype=np.int64)
    # Lists in order of first appearance; rows of a list keep their input order.
    list_codes, list_ids = pd.factorize(frame[list_column], sort=False)
    order = np.argsort(list_codes, kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    scores, codes, list_codes = scores[order], codes[order], list_codes[order]
    sizes = np.bincount(list_codes, minlength=len(list_ids))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if shares is None:
        counts = np.zeros((len(list_ids), len(names)))
        np.add.at(counts, (list_codes, codes), 1.0)
        p = counts / sizes[:, None]
    else:
        p = check_desired(np.array([shares[n] for n in names]), 1, len(names))
        p = np.broadcast_to(p[0], (len(list_ids), len(names)))
    return CandidateLists(frame, np.asarray(list_ids), starts, scores, codes, names, np.asarray(p))


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
    # No list of the batch fills positions past its longest list: ranking only up to there
    # gives the same rankings, with memory bounded by the batch whatever k is.
    after = rerank(S, G, p, max(min(k, width), 1), algorithm)
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


def metrics_table(lists: CandidateLists, parts: list[dict], list_column: str):
    """One row per list: Skew per group, MinSkew, MaxSkew, NDKL, InfeasibleIndex and NDCG,
    before and after, from the :func:`rerank_lists` results of consecutive batches."""
    import pandas as pd

    table: dict = {list_column: lists.list_ids}
    for when in ("before", "after"):
        merged = {
            key: np.concatenate([part[when][key] for part in parts]) for key in parts[0][when]
        }
        for j, name in enumerate(lists.names):
            table[f"skew_{name}_{when}"] = merged["skew"][:, j]
        for key in METRICS:
            table[f"{key}_{when}"] = merged[key]
    return pd.DataFrame(table)


def mean_over_lists(values) -> float | None:
    """Mean over lists; None where it is not a finite number (e.g. MinSkew -inf)."""
    v = float(np.mean(values)) if len(values) else float("nan")
    return v if math.isfinite(v) else None
