"""``fairpipe backfill``: a large backlog of ids to forget, filed as parts and drained, resumably."""

from __future__ import annotations

from typing import Annotated

import typer

from fairpipe.errors import check_int_range
from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import BackfillOptions


def _render(r: dict) -> None:
    out = result_console()
    out.print(
        f"backfill {r['backlog']}: {r['ids_given']} ids given ({r['duplicates']} duplicates "
        f"removed); {r['forgotten']} forgotten, {r['unknown']} unknown, "
        f"{r['already_deleted']} already forgotten",
        markup=False,
    )
    rate = f", {r['ids_per_second']:.0f} ids/s" if r["ids_per_second"] else ""
    out.print(
        f"{r['parts']} parts ({r['parts_applied_before']} applied by an earlier run), "
        f"{len(r['batches'])} batches, last commit {r['commit']}, "
        f"{r['timings']['total']:.1f} s{rate}",
        markup=False,
    )
    if "erasure" in r:
        e = r["erasure"]
        out.print(f"erased from history: {e['receipts_erased']} requests, "
                  f"{e['chunks_deleted']} chunks deleted", markup=False)  # fmt: skip


def _check(**o) -> None:
    from fairpipe.storage.queue import MAX_REQUEST_IDS  # what one request (a part) may hold

    check_int_range(o["batch_size"], "--batch-size", "fairpipe backfill", 1, MAX_REQUEST_IDS)
    from fairpipe.datasets import read_ids
    from fairpipe.flows.checks import existing_store

    # Bad input before anything starts (the flow checks again: deployments call it directly).
    existing_store(o["store"])
    read_ids(path=o["ids_file"])


@command({"batch_size": "--batch-size"}, shared=WRITES_STORES, render=_render, check=_check)
def backfill(
    store: Store,
    ids_file: Annotated[
        str,
        typer.Option(
            "--ids-file",
            help="The backlog: .npy, .parquet, .csv (column 'id' or the first), or text with "
            "one id per line.",
            show_default=False,
        ),
    ],
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Ids per batch (one request and one commit).")
    ] = BackfillOptions.batch_size,
    reason: Annotated[
        str, typer.Option("--reason", help="Kept in every receipt.")
    ] = BackfillOptions.reason,
    *,
    shared: Shared,
) -> dict:
    """Forget a large backlog of ids in batches; rerun with the same file to resume.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      seq 100 199 > backlog.txt
      fairpipe backfill --store digits.store --ids-file backlog.txt --batch-size 50
    """
    from fairpipe.flows.backfill import run_backfill

    options = BackfillOptions(batch_size=batch_size, reason=reason,
                              lock_timeout=shared.lock_timeout,
                              progress=not shared.as_json)  # fmt: skip
    return run_backfill(store, ids_file, options, **shared.cluster)
