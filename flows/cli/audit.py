"""``fairpipe audit``: a classifier searched for discriminatory inputs (ADF, against AEQUITAS and
random search), its discrimination measured, optionally retrained with some of the inputs found."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from flows.cli._options import Seed, check_options
from flows.cli._runner import RUNS_FLOWS, Shared, command, result_console

# The search functions' parameters, as their error messages name them.
PARAMETER_FLAGS = {"baselines": "--baseline", "n_seeds": "--seeds", "n_local": "--local"}
METHODS = (("adf", "ADF"), ("aequitas", "AEQUITAS"), ("random", "random"))
COLUMNS = ("method", "#ID", "#GDiff", "success", "global", "seconds", "IDs/s", "1k IDs")


def _render(r: dict) -> None:
    out = result_console()
    out.print(
        f"{r['dataset']} ({r['rows']:,} rows), {r['model']}, protected "
        f"{', '.join(r['protected'])}: discrimination rate {r['discrimination_rate']:.2%} of "
        "random inputs",
        markup=False,
    )
    table = Table(box=box.SIMPLE_HEAD)
    for header in COLUMNS:
        table.add_column(header, no_wrap=True)
    for key, name in METHODS:
        if key not in r:
            continue
        m = r[key]
        to_1000 = m["seconds_to_1000_ids"]
        table.add_row(
            name, f"{m['ids']:,}", f"{m['generated']:,}", f"{m['success_rate']:.1%}",
            "-" if m["global_ids"] is None else f"{m['global_ids']:,}", f"{m['seconds']:.2f}",
            f"{m['ids_per_second'] or 0:,.0f}", "never" if to_1000 is None else f"{to_1000:.2f} s",
        )  # fmt: skip
    out.print(table)
    if "retrain" in r:
        t = r["retrain"]
        out.print(
            f"retrained {t['repeats']}x with {t['samples']:,} of them: discrimination rate "
            f"{t['rate_before']:.2%} -> {t['rate_after']:.2%}"
            + (f" ({t['improvement']:.0%} better)" if t["improvement"] is not None else "")
        )
    if "out" in r:
        out.print(f"samples, model, metrics and plot in {r['out']}", markup=False)


def _check(**o) -> None:
    check_options(
        "fairpipe audit", seeds=("positive", o["seeds"]), local=("positive", o["local"]),
        max_iter=("positive", o["max_iter"]), repeats=("positive", o["repeats"]),
        train_iter=("positive", o["train_iter"]), seed=("seed", o["seed"]),
    )  # fmt: skip


@command(PARAMETER_FLAGS, shared=RUNS_FLOWS, render=_render, check=_check)
def audit(
    protected: Annotated[
        list[str],
        typer.Option("--protected", help="Protected attribute (repeat).", show_default=False),
    ],
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset",
            help="adult | german | bank (from --data-dir, default the shared data folder beside the "
            "repository), adult:PATH / "
            "german:PATH / bank:PATH, or an integer CSV with a 'label' column.",
        ),
    ] = "adult",
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A pickled classifier with predict_proba (or a torch.save module).",
        ),
    ] = None,
    train: Annotated[
        str | None,
        typer.Option(
            "--train",
            help="Train the model to test: 'mlp', the paper's 64-32-16-8-4 network (the default "
            "without --model).",
        ),
    ] = None,
    seeds: Annotated[
        int, typer.Option("--seeds", help="Global seeds (clustered from the data).")
    ] = 1000,
    local: Annotated[
        int, typer.Option("--local", help="Local steps per discriminatory input.")
    ] = 1000,
    max_iter: Annotated[int, typer.Option("--max-iter", help="Global iterations per seed.")] = 10,
    objective: Annotated[
        str,
        typer.Option(
            "--objective", help="loss (ADF's: toward the decision boundary) | probability."
        ),
    ] = "loss",
    baseline: Annotated[
        list[str],
        typer.Option("--baseline", help="aequitas | random (repeat); --no-baselines for none."),
    ] = ["aequitas", "random"],  # noqa: B006  (typer hands the command a new list)
    no_baselines: Annotated[bool, typer.Option("--no-baselines", help="Run ADF alone.")] = False,
    retrain: Annotated[
        bool, typer.Option("--retrain", help="Retrain with 5% of the inputs found.")
    ] = False,
    repeats: Annotated[int, typer.Option("--repeats", help="Retraining repeats (averaged).")] = 5,
    train_iter: Annotated[
        int, typer.Option("--train-iter", help="Training epochs of the MLP.")
    ] = 50,
    out: Annotated[
        str | None,
        typer.Option("--out", help="Folder for samples, model, metrics, plot."),
    ] = None,
    data_dir: Annotated[
        str | None, typer.Option("--data-dir", help="Folder of the named data sets.")
    ] = None,
    seed: Seed = 0,
    *,
    shared: Shared,
) -> dict:
    """Search a classifier for discriminatory inputs (ADF, against AEQUITAS and random search) and
    measure its discrimination; optionally retrain with some of the inputs found."""
    from flows.audit import AuditOptions, run_audit

    options = AuditOptions(
        dataset=dataset, protected=list(protected), model=model, train=train, seeds=seeds,
        local=local, max_iter=max_iter, objective=objective,
        baselines=() if no_baselines else tuple(baseline), retrain=retrain, repeats=repeats,
        train_iter=train_iter, seed=seed, data_dir=data_dir,
        progress=not shared.as_json,  # a progress bar on stderr
    )  # fmt: skip
    result = run_audit(options, out, **shared.cluster)
    return result
