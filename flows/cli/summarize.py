"""``fairpipe summarize``: a fair summary of at most k points, per-group bounds (one commit)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from fairpipe.errors import check_int_range
from fairpipe.flows.cli._options import Seed, Store, check_options, choice
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import SummarizeOptions
from fairpipe.tree import check_tree

# The old flags, hidden aliases for one release.
UTILITIES = ("exemplar", "facility")  # fairpipe.summary.UTILITIES
RULES = ("swap", "ck")  # fairpipe.summary.RULES
# FairSummary's parameters that its error messages name, and their flags.
FLAGS = {"k": "--k", "fanout": "--fanout", "height": "--height", "eval_size": "--eval-size"}


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
    check_options(
        "fairpipe summarize", k=("positive", o["k"]), eval_size=("positive", o["eval_size"]),
        fanout=("fanout", o["fanout"]), height=("count", o["height"]),
        seed=("seed", o["seed"]), lower=("fraction", o["lower"]), upper=("fraction", o["upper"]),
    )  # fmt: skip
    check_tree(o["fanout"], o["height"], "fairpipe summarize")
    check_int_range(o["eval_size"], "--eval-size", "fairpipe summarize", 1, 1 << 16)
    from fairpipe.flows.checks import check_summarize

    check_summarize(
        o["store"], o["k"], o["lower"], o["upper"], o["bounds"], utility=o["utility"],
        fanout=o["fanout"], height=o["height"], eval_size=o["eval_size"],
        rule=o["rule"], seed=o["seed"],
    )  # fmt: skip


@command(FLAGS, shared=WRITES_STORES, render=_render, check=_check)
def summarize(
    store: Store,
    k: Annotated[
        int, typer.Option("--k", help="Summary size: at most k elements.")
    ] = SummarizeOptions.k,
    lower: Annotated[
        float | None,
        typer.Option(
            "--lower",
            help="Lower bound of every group, as a fraction of k (floor(lower * k)); not with "
            "--bounds.",
            show_default="0",
        ),
    ] = None,
    upper: Annotated[
        float | None,
        typer.Option(
            "--upper",
            help="Upper bound of every group, as a fraction of k (ceil(upper * k)); not with "
            "--bounds.",
            show_default="1",
        ),
    ] = None,
    bounds: Annotated[
        str | None,
        typer.Option(
            "--bounds",
            help='A JSON file {"group": [lower, upper], ...} of bounds in elements; not with '
            "--lower or --upper (one of them is needed).",
            show_default="none",
        ),
    ] = None,
    utility: Annotated[
        str,
        typer.Option(
            "--utility",
            help="What the summary serves: exemplar, the evaluation points' squared distance "
            "to their nearest element, lowered; facility, their similarity exp(-gamma d^2) to "
            "it, raised.",
            **choice(*UTILITIES),
        ),
    ] = SummarizeOptions.utility,
    rule: Annotated[
        str,
        typer.Option(
            "--rule",
            help="swap: exchange an element for a larger gain; ck: Chakrabarti-Kale's rule (a "
            "1/4 bound).",
            **choice(*RULES),
        ),
    ] = SummarizeOptions.rule,
    eval_size: Annotated[
        int, typer.Option("--eval-size", help="Evaluation points per node.")
    ] = SummarizeOptions.eval_size,
    fanout: Annotated[
        int, typer.Option("--fanout", help="Children per node of the tree (fanout^height leaves).")
    ] = SummarizeOptions.fanout,
    height: Annotated[
        int, typer.Option("--height", help="Levels below the root (0: one node streams all).")
    ] = SummarizeOptions.height,
    seed: Seed = SummarizeOptions.seed,
    *,
    shared: Shared,
) -> dict:
    """Select a fair summary of k points (per-group lower and upper bounds): one commit.

    \b
    Examples (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe summarize --store digits.store --k 20 --lower 0.05 --upper 0.2
      fairpipe summarize --store digits.store --k 20 --upper 0.15 --utility facility
    """
    from fairpipe.flows.summarize import run_summarize

    options = SummarizeOptions(
        k=k, lower=lower, upper=upper, bounds_file=bounds, utility=utility, rule=rule,
        eval_size=eval_size, fanout=fanout, height=height, seed=seed,
        lock_timeout=shared.lock_timeout,
    )  # fmt: skip
    from fairpipe.flows.checks import small_store

    result = run_summarize(store, options, **shared.cluster, processes=not small_store(store))
    return result
