"""``fairpipe info``: a store's size, groups, LSH parameters, fair summary and commit history."""

from __future__ import annotations

from flows.cli._options import Store
from flows.cli._runner import Shared, command


def _render(r: dict) -> None:
    from flows.parameters import recall_line

    print(
        f"{r['store']}: {r['n']} points ({r['n_alive']} alive) x {r['d']} dims, "
        f"groups {r['group_names']}"
    )
    print(f"LSH {r['lsh']}; suggested radius {r['suggested_radius']:.4g}")
    promise = recall_line(r["lsh"], r["suggested_radius"])
    if promise:
        print(f"LSH parameters {promise}")
    if "summary" in r:
        s = r["summary"]
        print(
            f"fair summary: {len(s['ids'])} of k={s['k']} ({s['utility']}), error(S) = "
            f"{s['error']}, per group {s['counts']}"
        )
    shown = [h for h in r["history"] if not h["internal"]]
    for h in shown:
        print(f"{h['id']}  {h['time']}  {h['message']}")
    hidden = len(r["history"]) - len(shown)
    if hidden:
        print(f"({hidden} internal checkpoints of these commits not shown; --json lists them)")


@command(render=_render, read_only=True)
def info(store: Store, *, shared: Shared) -> dict:
    """Show a store's size, groups, LSH parameters and commit history.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe info --store digits.store
    """
    from storage.store import FairpipeStore
    from storage.summary import has_summary, read_summary_ids, summary_attrs

    st = FairpipeStore.open(store)
    attrs = st.require_data()
    result = {"store": store, **attrs, "history": st.history()}
    session = st.readonly_session()
    if has_summary(session):
        result["summary"] = {**summary_attrs(session), "ids": read_summary_ids(session).tolist()}
    return result
