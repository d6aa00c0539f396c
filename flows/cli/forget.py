"""``fairpipe forget``: ids (filed as a deletion request), then every pending request, erased from
the rows, the index and the models: one commit per batch."""

from __future__ import annotations

from typing import Any

from fairpipe.flows.cli._options import Store, check_ids_given
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import ForgetOptions
from fairpipe.settings import FORGET, GIVEN_IDS

ONE_SOURCE = "Give at most one of --ids or --ids-file (neither: drain the pending requests)."


def _render(r: dict) -> None:
    out = result_console()
    aside = r.get("set_aside", [])
    if aside:
        out.print(f"{len(aside)} queue objects set aside as not deletion requests, never applied "
                  f"(see 'fairpipe status --store {r['store']}')")  # fmt: skip
    if not r["batches"]:
        out.print("no pending deletion requests")
        return
    out.print(
        f"forgot {len(r['deleted'])} ids ({len(r['unknown'])} unknown, "
        f"{len(r['already_deleted'])} already forgotten); commit {r['commit']} "
        f"in {r['timings']['total']:.1f} s ({len(r['requests'])} requests, "
        f"{len(r['batches'])} batches)"
    )
    if r.get("model") == "dc" and r["deleted"]:
        out.print(
            f"tree: {r['leaves_recomputed']} leaves and {r['nodes_recomputed']} nodes recomputed"
        )
    elif r.get("model") == "q" and r["deleted"]:
        out.print(f"q-k-means: {r['certified']} deletions certified, retrained: {r['retrained']}")
    if "summary_nodes_recomputed" in r:
        out.print(
            f"summary: {r['summary_nodes_recomputed']} nodes recomputed, "
            f"error(S) = {r['summary_error']}"
        )
    if r["unknown"]:
        out.print(f"unknown ids: {r['unknown'][:10]}")
    if "erasure" in r:
        e = r["erasure"]
        out.print(
            f"erased from history: {e['receipts_erased']} requests; {e['snapshots_before']} -> "
            f"{e['snapshots_after']} snapshots, {e['chunks_deleted']} chunks "
            f"({e['bytes_deleted'] / 1e6:.1f} MB) deleted"
        )


def _check(**o) -> None:
    from fairpipe.flows.checks import check_forget

    # The request's size, the store, and the ids against it (a list of people to forget is
    # small: read twice).
    ids = check_ids_given(o["ids"], o["ids_file"], ONE_SOURCE, required=False)
    if ids is not None:
        from fairpipe.storage.queue import check_request_size

        check_request_size(len(ids), o["reason"])
    check_forget(o["store"], ids)


@command(shared=WRITES_STORES, render=_render, check=_check, settings=(*GIVEN_IDS, *FORGET))
def forget(
    store: Store, *, shared: Shared, ids: str | None, ids_file: str | None, **settings: Any
) -> dict:
    """Forget ids (a new deletion request), then drain every pending request in batches: erase
    the rows, drop them from the index, update the model and the summary.

    Give --ids or --ids-file (not both), or neither to drain the pending requests.

    \b
    Examples (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe forget --store digits.store --ids 3,5
      fairpipe forget --store digits.store
    """
    from fairpipe.datasets import read_ids
    from fairpipe.flows.checks import small_forget
    from fairpipe.flows.forget import run_forget

    wanted = None if ids is None and ids_file is None else read_ids(text=ids, path=ids_file)
    options = ForgetOptions(**settings, lock_timeout=shared.lock_timeout)
    processes = not small_forget(store, wanted)
    return run_forget(store, wanted, options, **shared.cluster, processes=processes)
