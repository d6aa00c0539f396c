"""``fairpipe demo``: the digits ingested, sampled fairly, clustered, summarized and forgotten."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from fairpipe.flows.cli._output import diagnostics_console, escape_controls, result_console
from fairpipe.flows.cli._runner import Shared, command
from fairpipe.settings import DEMO_COMMAND


def _render(r: dict) -> None:
    ev = r["evaluation"]
    sizes, balls = ev["neighbourhood_sizes"], ev["ball_sizes"]
    print(
        f"M(q), the points the index finds (|M(q)| {min(sizes)}-{max(sizes)}), holds "
        f"{ev['mean_coverage']:.1%} of the true ball B(q, r) (|B(q, r)| {min(balls)}-{max(balls)}) "
        f"on average; the worst query {ev['min_coverage']:.1%}"
    )
    table = Table(
        title=f"TV to uniform: {ev['queries']} queries, noise floor {ev['noise_floor']:.4f}"
    )
    columns = ("method", "TV on M(q)", "x floor", "TV on B(q,r)", "x floor", "samples/s")
    for column in columns:
        table.add_column(column, justify="right")
    for m, v in ev["methods"].items():
        table.add_row(
            m, f"{v['tv']:.4f}", f"{v['ratio_to_floor']:.2f}", f"{v['tv_ball']:.4f}",
            f"{v['ball_ratio_to_floor']:.2f}", f"{v['samples_per_s']:,.0f}",
        )  # fmt: skip
    result_console().print(table)
    print(f"plot: {r['plot']}\nstore: {r['store']}\ntotal {r['seconds']:.1f} s")


@command(render=_render, settings=DEMO_COMMAND)
def demo(*, shared: Shared, store: str | None, plot: str | None, **settings: Any) -> dict:
    """Ingest the built-in digits, sample fair neighbours, print a TV report and write a plot;
    then fit, summarize, forget and check the store (the whole tour, about a minute).

    \b
    Example:
      fairpipe demo --store demo.store --plot tv.png
    """
    from fairpipe.flows.demo import run_demo

    progress = diagnostics_console()

    def log(message: str) -> None:
        if not shared.as_json:
            progress.print(escape_controls(message))

    return run_demo(store=store, plot=plot, log=log, **settings)
