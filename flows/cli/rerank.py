"""``fairpipe rerank``: every list of candidates re-ranked toward a desired group distribution."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from fairpipe.flows.cli._options import check_options, choice
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import RUNS_FLOWS, Shared, command
from fairpipe.flows.options import RerankOptions

ALGORITHMS = ("detgreedy", "detcons", "detrelaxed", "detconstsort")  # fairpipe.ranking's
METRICS = ("min_skew", "max_skew", "ndkl", "infeasible_index", "ndcg")


def _render(r: dict) -> None:
    out = result_console()
    out.print(
        f"re-ranked {r['lists']} lists ({r['rows_in']} candidates) with {r['algorithm']}, "
        f"top {r['k']}: {r['rows_out']} rows -> {r['out']}; metrics per list -> {r['metrics']}",
        markup=False,
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
    check_options("fairpipe rerank", k=("positive", o["k"]),
                  smoothing=("non_negative_float", o["smoothing"]))  # fmt: skip
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


@command(shared=RUNS_FLOWS, render=_render, check=_check)
def rerank(
    candidates: Annotated[
        str,
        typer.Argument(
            metavar="CANDIDATES",
            help="CSV or Parquet: one row per (list, candidate).",
            show_default=False,
        ),
    ],
    out: Annotated[
        str,
        typer.Option(
            "--out", help="Output .csv or .parquet (metrics beside it).", show_default=False
        ),
    ],
    algorithm: Annotated[
        str,
        typer.Option(
            "--algorithm",
            help="The re-ranker (Geyik et al. 2019): detgreedy, detcons, detrelaxed or "
            "detconstsort.",
            **choice(*ALGORITHMS),
        ),
    ] = RerankOptions.algorithm,
    k: Annotated[
        int, typer.Option("--k", help="Top-k of each list (a shorter list keeps all).")
    ] = RerankOptions.k,
    desired: Annotated[
        str,
        typer.Option(
            "--desired",
            help='A JSON file {"group": share, ...} summing to 1, or "population": each '
            "list's own group distribution.",
        ),
    ] = RerankOptions.desired,
    list_column: Annotated[
        str, typer.Option("--list-column", help="The column naming each row's list.")
    ] = RerankOptions.list_column,
    score_column: Annotated[
        str, typer.Option("--score-column", help="The column of scores (higher first).")
    ] = RerankOptions.score_column,
    group_column: Annotated[
        str, typer.Option("--group-column", help="The column of group labels.")
    ] = RerankOptions.group_column,
    smoothing: Annotated[
        float,
        typer.Option(
            "--smoothing", help="Skew of a group absent from the top k: -inf at 0 (the paper)."
        ),
    ] = RerankOptions.smoothing,
    *,
    shared: Shared,
) -> dict:
    """Re-rank every list toward a desired group distribution; metrics before and after.

    \b
    Example:
      printf 'list,score,group\\n1,0.9,a\\n1,0.8,a\\n1,0.7,b\\n1,0.6,b\\n' > lists.csv
      fairpipe rerank lists.csv --out reranked.csv --k 2
    """
    from fairpipe.flows.rerank import run_rerank

    options = RerankOptions(
        algorithm=algorithm, k=k, desired=desired, list_column=list_column,
        score_column=score_column, group_column=group_column, smoothing=smoothing,
    )  # fmt: skip
    result = run_rerank(candidates, out, options, **shared.cluster)
    return result
