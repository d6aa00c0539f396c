"""``fairpipe rerank``: every list of candidates re-ranked toward a desired group distribution."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import RUNS_FLOWS, Shared, command
from fairpipe.flows.options import RerankOptions
from fairpipe.settings import RERANK, RERANKED

METRICS = ("min_skew", "max_skew", "ndkl", "infeasible_index", "ndcg")


def _render(r: dict) -> None:
    out = result_console()
    out.print(
        f"re-ranked {r['lists']} lists ({r['rows_in']} candidates) with {r['algorithm']}, "
        f"top {r['k']}: {r['rows_out']} rows -> {r['out']}; metrics per list -> {r['metrics']}",
    )
    table = Table("mean over lists", "before (top-k by score)", "after")
    for key in METRICS:
        b, a = r["mean"]["before"][key], r["mean"]["after"][key]
        table.add_row(key, "-inf" if b is None else f"{b:.4f}", "-inf" if a is None else f"{a:.4f}")
    table.add_row(
        "lists infeasible",
        str(r["mean"]["before"]["infeasible_lists"]),
        str(r["mean"]["after"]["infeasible_lists"]),
    )
    out.print(table)
    out.print(f"{r['timings']['total']:.2f} s")


def _check(**o) -> None:
    from fairpipe.flows.outputs import TABLE_KINDS, check_output_file
    from fairpipe.ranking import (
        candidate_columns,
        check_table_ahead,
        load_desired_file,
    )

    check_output_file(o["out"], "--out", TABLE_KINDS)  # (the flow checks it again)
    if o["desired"] != "population":  # a small JSON file: read before anything starts
        load_desired_file(o["desired"])
    columns = candidate_columns(o["list_column"], o["score_column"], o["group_column"])
    check_table_ahead(o["candidates"], columns)


@command(shared=RUNS_FLOWS, render=_render, check=_check, settings=(RERANKED, *RERANK))
def rerank(
    candidates: Annotated[
        str,
        typer.Argument(
            metavar="CANDIDATES",
            help="CSV or Parquet: one row per (list, candidate).",
            show_default=False,
        ),
    ],
    *,
    shared: Shared,
    out: str,
    **settings: Any,
) -> dict:
    """Re-rank every list toward a desired group distribution; metrics before and after.

    \b
    Example:
      printf 'list,score,group\\n1,0.9,a\\n1,0.8,a\\n1,0.7,b\\n1,0.6,b\\n' > lists.csv
      fairpipe rerank lists.csv --out reranked.csv --k 2
    """
    from fairpipe.flows.rerank import run_rerank

    return run_rerank(candidates, out, RerankOptions(**settings), **shared.cluster)
