"""``fairpipe audit``: a classifier searched for discriminatory inputs (ADF, against AEQUITAS and
random search), its discrimination measured, optionally retrained with some of the inputs found."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cli._options import Seed, check_options, choice
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import RUNS_FLOWS, Shared, command
from fairpipe.flows.options import BASELINES, TRAINABLE, AuditOptions

# The search functions' parameters that their error messages name, and their flags.
FLAGS = {"baselines": "--baseline", "n_seeds": "--n-seeds", "n_local": "--n-local"}
# The old flags, hidden aliases for one release.
OBJECTIVES = ("loss", "probability")  # fairpipe.audit's OBJECTIVES
METHODS = (("adf", "ADF"), ("aequitas", "AEQUITAS"), ("random", "random"))
BASELINES_AND_NONE = "Give --baseline or --no-baselines, not both."
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
        "fairpipe audit", n_seeds=("positive", o["n_seeds"]), n_local=("positive", o["n_local"]),
        max_iter=("positive", o["max_iter"]), repeats=("positive", o["repeats"]),
        train_iter=("positive", o["train_iter"]), seed=("seed", o["seed"]),
    )  # fmt: skip
    if o["no_baselines"] and list(o["baseline"]) != list(BASELINES):
        raise FairpipeInputError(BASELINES_AND_NONE)
    if o["model"] is not None and o["train"] is not None:
        from fairpipe.flows.audit import MODEL_AND_TRAIN

        raise FairpipeInputError(MODEL_AND_TRAIN)


@command(FLAGS, shared=RUNS_FLOWS, render=_render, check=_check)
def audit(
    protected: Annotated[
        list[str],
        typer.Option(
            "--protected",
            help="A protected attribute (repeat the option for several).",
            show_default=False,
        ),
    ],
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset",
            help="adult, german or bank (read from --data-dir), adult:PATH, german:PATH, "
            "bank:PATH, or an integer CSV with a 'label' column.",
        ),
    ] = AuditOptions.dataset,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A pickled classifier with predict_proba (or a torch.save module); not with "
            "--train.",
            show_default="train one (--train mlp)",
        ),
    ] = None,
    train: Annotated[
        str | None,
        typer.Option(
            "--train",
            help="Train the model to test: mlp, the paper's 64-32-16-8-4 network; not with "
            "--model.",
            show_default="mlp without --model",
            **choice(*TRAINABLE),
        ),
    ] = None,
    n_seeds: Annotated[
        int, typer.Option("--n-seeds", help="Global seeds (clustered from the data).")
    ] = AuditOptions.n_seeds,
    n_local: Annotated[
        int, typer.Option("--n-local", help="Local steps per discriminatory input.")
    ] = AuditOptions.n_local,
    max_iter: Annotated[
        int, typer.Option("--max-iter", help="Global iterations per seed.")
    ] = AuditOptions.max_iter,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="What the search climbs: loss (ADF's: toward the decision boundary) or "
            "probability.",
            **choice(*OBJECTIVES),
        ),
    ] = AuditOptions.objective,
    baseline: Annotated[
        list[str],
        typer.Option(
            "--baseline",
            help="A search to compare ADF with (repeat the option for several); not with "
            "--no-baselines.",
            **choice(*BASELINES),
        ),
    ] = ["aequitas", "random"],  # noqa: B006  (typer hands the command a new list)
    no_baselines: Annotated[
        bool, typer.Option("--no-baselines", help="Run ADF alone.", show_default="off")
    ] = False,
    retrain: Annotated[
        bool,
        typer.Option("--retrain", help="Retrain with 5% of the inputs found.", show_default="off"),
    ] = AuditOptions.retrain,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Retraining repeats (averaged).")
    ] = AuditOptions.repeats,
    train_iter: Annotated[
        int, typer.Option("--train-iter", help="Training epochs of the MLP.")
    ] = AuditOptions.train_iter,
    out: Annotated[
        str | None,
        typer.Option(
            "--out", help="Folder for samples, model, metrics, plot.", show_default="none"
        ),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir",
            help="Folder of the named data sets.",
            show_default="the shared data folder beside the repository",
        ),
    ] = None,
    seed: Seed = AuditOptions.seed,
    *,
    shared: Shared,
) -> dict:
    """Search a classifier for discriminatory inputs (ADF, against AEQUITAS and random search) and
    measure its discrimination; optionally retrain with some of the inputs found.

    \b
    Examples (the adult data set in --data-dir):
      fairpipe audit --protected sex --n-seeds 50 --n-local 50 --no-baselines
      fairpipe audit --protected sex --protected race --retrain --out audit-out
    """
    from fairpipe.flows.audit import run_audit

    options = AuditOptions(
        dataset=dataset, protected=list(protected), model=model, train=train, n_seeds=n_seeds,
        n_local=n_local, max_iter=max_iter, objective=objective,
        baselines=() if no_baselines else tuple(baseline), retrain=retrain, repeats=repeats,
        train_iter=train_iter, seed=seed, data_dir=data_dir,
        progress=not shared.as_json,  # a progress bar on stderr
    )  # fmt: skip
    result = run_audit(options, out, **shared.cluster)
    return result
