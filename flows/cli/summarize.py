"""``fairpipe summarize``: a fair summary of at most k points, per-group bounds (one commit)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from fairpipe.errors import check_int_range
from fairpipe.tree import check_tree
from flows.cli._options import Seed, Store, check_options
from flows.cli._runner import WRITES_STORES, Shared, command, result_console

# FairSummary's parameters, as its error messages name them.
PARAMETER_FLAGS = {"fanout": "--tree-width", "height": "--tree-height"}


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
        tree_width=("fanout", o["tree_width"]), tree_height=("count", o["tree_height"]),
        seed=("seed", o["seed"]), lower=("fraction", o["lower"]), upper=("fraction", o["upper"]),
    )  # fmt: skip
    check_tree(o["tree_width"], o["tree_height"], "fairpipe summarize")
    check_int_range(o["eval_size"], "--eval-size", "fairpipe summarize", 1, 1 << 16)
    from flows.checks import check_summarize

    check_summarize(
        o["store"], o["k"], o["lower"], o["upper"], o["bounds"], utility=o["utility"],
        fanout=o["tree_width"], height=o["tree_height"], eval_size=o["eval_size"],
        rule=o["rule"], seed=o["seed"],
    )  # fmt: skip


@command(PARAMETER_FLAGS, shared=WRITES_STORES, render=_render, check=_check)
def summarize(
    store: Store,
    k: Annotated[
        int, typer.Option("--k", help="Summary size (at most k elements).", show_default=False)
    ],
    lower: Annotated[
        float | None,
        typer.Option(
            "--lower", help="Lower bound of every group, as a fraction of k (floor(lower * k))."
        ),
    ] = None,
    upper: Annotated[
        float | None,
        typer.Option(
            "--upper", help="Upper bound of every group, as a fraction of k (ceil(upper * k))."
        ),
    ] = None,
    bounds: Annotated[
        str | None,
        typer.Option("--bounds", help='JSON file: {"group": [lower, upper], ...} in elements.'),
    ] = None,
    utility: Annotated[str, typer.Option("--utility", help="exemplar | facility.")] = "exemplar",
    rule: Annotated[
        str,
        typer.Option(
            "--rule", help="swap (exchange gain, default) | ck (Chakrabarti-Kale, 1/4 bound)."
        ),
    ] = "swap",
    eval_size: Annotated[
        int, typer.Option("--eval-size", help="Evaluation points per node.")
    ] = 2048,
    tree_width: Annotated[int, typer.Option("--tree-width", help="Children per node.")] = 16,
    tree_height: Annotated[int, typer.Option("--tree-height", help="Levels below the root.")] = 2,
    seed: Seed = 0,
    *,
    shared: Shared,
) -> dict:
    """Select a fair summary of k points (per-group lower and upper bounds): one commit."""
    from flows.summarize import SummarizeOptions, run_summarize

    options = SummarizeOptions(
        k=k, lower=lower, upper=upper, bounds_file=bounds, utility=utility, rule=rule,
        eval_size=eval_size, width=tree_width, height=tree_height, seed=seed,
        lock_timeout=shared.lock_timeout,
    )  # fmt: skip
    from flows.checks import small_store

    result = run_summarize(store, options, **shared.cluster, processes=not small_store(store))
    return result
