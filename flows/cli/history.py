"""``fairpipe history``: every operation on a store (when, parameters, row counts, commit), from
the lineage log it keeps through erasure (:mod:`fairpipe.storage.lineage`)."""

from __future__ import annotations

from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import Shared, command


def _values(values: dict) -> str:
    return ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in values.items())  # fmt: skip


def _render(r: dict) -> None:
    out = result_console()
    for op in r["operations"]:
        when = op["time"][:19].replace("T", " ")
        out.print(f"{when}  {op['operation']}  commit {op['commit'] or '(unknown)'}")
        if not op["logged"]:
            out.print(f"    message: {op['message']}")
        for title in ("parameters", "rows", "results"):
            values = op["figures" if title == "results" else title]
            if values:
                out.print(f"    {title}: {_values(values)}")
    if not r["complete"]:
        n = sum(not op["logged"] for op in r["operations"])
        out.print(
            f"(the store's lineage log does not cover its whole life: {n} earlier operations are "
            "shown from the commits still in its history, by their messages only; operations "
            "whose commits erasure expired before the log began are not shown)"
        )


@command(render=_render, read_only=True)
def history(store: Store, *, shared: Shared) -> dict:
    """Every operation on a store: when, parameters, row counts, results, commit.

    Ingest, append, fit, summarize, drain, backfill, erase-history, configure: the list is kept
    in the store, survives erasure from history and holds no id and no row.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe history --store digits.store
    """
    from fairpipe.storage.lineage import operations
    from fairpipe.storage.store import FairpipeStore

    st = FairpipeStore.open(store)
    st.require_data()
    return {"store": store, **operations(st)}
