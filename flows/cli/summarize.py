"""``fairpipe summarize``: a fair summary of at most k points, per-group bounds (one commit)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import SummarizeOptions
from fairpipe.settings import SUMMARIZE
from fairpipe.tree import check_tree


def _render(r: dict) -> None:
    out = result_console()
    out.print(
        f"summary of {len(r['ids'])} of {r['n_alive']} points ({r['utility']}, rule {r['rule']}): "
        f"utility {r['value']:.4g} on {r['eval_points']} evaluation points, "
        f"error(S) = {r['error']}, {r['oracle_calls']} gain evaluations; commit {r['commit']} "
        f"in {r['timings']['total']:.1f} s ({r['elements_per_second']:.0f} elements/s)"
    )
    ref, value = r["reference"], r["value"]
    rand = ref["random"]["value"]
    line = (
        f"references from the same evaluation points: {rand:.4g} for a random selection of "
        f"{len(r['ids'])} "
        f"within the same bounds (mean of {ref['random']['draws']})"
    )
    if rand > 0:
        line += f", {value / rand:.2f}x"
    if "unconstrained" in ref:
        free = ref["unconstrained"]["value"]
        line += f"; {free:.4g} for the greedy over the same candidates without the bounds"
        if free > 0:
            line += f" (the bounds cost {max(free - value, 0.0) / free:.1%})"
    out.print(line)
    table = Table("group", "lower", "upper", "in summary")
    for name, count in r["counts"].items():
        lo, up = r["bounds"][name]
        table.add_row(name, str(lo), str(up), str(count))
    out.print(table)
    out.print("ids: " + " ".join(map(str, r["ids"])))


def _check(**o) -> None:
    check_tree(o["fanout"], o["height"], "fairpipe summarize")
    from fairpipe.flows.checks import check_summarize

    check_summarize(
        o["store"], o["k"], o["lower"], o["upper"], o["bounds"], utility=o["utility"],
        fanout=o["fanout"], height=o["height"], eval_size=o["eval_size"],
        rule=o["rule"], seed=o["seed"],
    )  # fmt: skip


@command(shared=WRITES_STORES, render=_render, check=_check, settings=SUMMARIZE)
def summarize(store: Store, *, shared: Shared, **settings: Any) -> dict:
    """Select a fair summary of k points (per-group lower and upper bounds): one commit.

    \b
    Examples (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe summarize --store digits.store --k 20 --lower 0.05 --upper 0.2
      fairpipe summarize --store digits.store --k 20 --upper 0.15 --utility facility
    """
    from fairpipe.flows.checks import small_store
    from fairpipe.flows.summarize import run_summarize

    options = SummarizeOptions(**settings, lock_timeout=shared.lock_timeout)
    return run_summarize(store, options, **shared.cluster, processes=not small_store(store))
