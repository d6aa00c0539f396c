"""``fairpipe audit``: a classifier searched for discriminatory inputs (ADF, against AEQUITAS and
random search), its discrimination measured, optionally retrained with some of the inputs found."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import RUNS_FLOWS, Shared, command
from fairpipe.flows.options import AuditOptions
from fairpipe.settings import AUDIT_COMMAND, BASELINES

METHODS = (("adf", "ADF"), ("aequitas", "AEQUITAS"), ("random", "random"))
BASELINES_AND_NONE = "Give --baseline or --no-baselines, not both."
COLUMNS = ("method", "#ID", "#GDiff", "success", "global", "seconds", "IDs/s", "1k IDs")


def _render(r: dict) -> None:
    out = result_console()
    out.print(
        f"{r['dataset']} ({r['rows']:,} rows), {r['model']}, protected "
        f"{', '.join(r['protected'])}: discrimination rate {r['discrimination_rate']:.2%} of "
        "random inputs",
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
        out.print(f"samples, model, metrics and plot in {r['out']}")


def _check(**o) -> None:
    if o["no_baselines"] and list(o["baseline"]) != list(BASELINES):
        raise FairpipeInputError(BASELINES_AND_NONE)
    if o["model"] is not None and o["train"] is not None:
        from fairpipe.flows.audit import MODEL_AND_TRAIN

        raise FairpipeInputError(MODEL_AND_TRAIN)


@command({"baselines": "--baseline"}, shared=RUNS_FLOWS, render=_render, check=_check,
         settings=AUDIT_COMMAND)  # fmt: skip
def audit(*, shared: Shared, protected: list[str], baseline: list[str], no_baselines: bool,
          out: str | None, data_dir: str | None, **settings: Any) -> dict:  # fmt: skip
    """Search a classifier for discriminatory inputs (ADF, against AEQUITAS and random search) and
    measure its discrimination; optionally retrain with some of the inputs found.

    \b
    Examples (the adult data set in --data-dir):
      fairpipe audit --protected sex --n-seeds 50 --n-local 50 --no-baselines
      fairpipe audit --protected sex --protected race --retrain --out audit-out
    """
    from fairpipe.flows.audit import run_audit

    options = AuditOptions(
        **settings, protected=list(protected), baselines=() if no_baselines else tuple(baseline),
        data_dir=data_dir, progress=not shared.as_json,  # a progress bar on stderr
    )  # fmt: skip
    return run_audit(options, out, **shared.cluster)
