"""``fairpipe backfill``: a large backlog of ids to forget, filed as parts and drained, resumably."""

from __future__ import annotations

from typing import Any

from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import BackfillOptions
from fairpipe.settings import BACKFILL, BACKLOG


def _render(r: dict) -> None:
    out = result_console()
    out.print(
        f"backfill {r['backlog']}: {r['ids_given']} ids given ({r['duplicates']} duplicates "
        f"removed); {r['forgotten']} forgotten, {r['unknown']} unknown, "
        f"{r['already_deleted']} already forgotten",
    )
    rate = f", {r['ids_per_second']:.0f} ids/s" if r["ids_per_second"] else ""
    out.print(
        f"{r['parts']} parts ({r['parts_applied_before']} applied by an earlier run), "
        f"{len(r['batches'])} batches, last commit {r['commit']}, "
        f"{r['timings']['total']:.1f} s{rate}",
    )
    if "erasure" in r:
        e = r["erasure"]
        out.print(f"erased from history: {e['receipts_erased']} requests, "
                  f"{e['chunks_deleted']} chunks deleted")  # fmt: skip


def _check(**o) -> None:
    from fairpipe.datasets import read_ids
    from fairpipe.flows.checks import existing_store

    # Bad input before anything starts (the flow checks again: deployments call it directly).
    existing_store(o["store"])
    read_ids(path=o["ids_file"])


@command(shared=WRITES_STORES, render=_render, check=_check, settings=(BACKLOG, *BACKFILL))
def backfill(store: Store, *, shared: Shared, ids_file: str, **settings: Any) -> dict:
    """Forget a large backlog of ids in batches; rerun with the same file to resume.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      seq 100 199 > backlog.txt
      fairpipe backfill --store digits.store --ids-file backlog.txt --batch-size 50
    """
    from fairpipe.flows.backfill import run_backfill

    options = BackfillOptions(**settings, lock_timeout=shared.lock_timeout,
                              progress=not shared.as_json)  # fmt: skip
    return run_backfill(store, ids_file, options, **shared.cluster)
