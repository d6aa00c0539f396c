"""``fairpipe info``: a store's size, groups, LSH parameters, clustering model, fair summary and
commit history."""

from __future__ import annotations

from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._runner import Shared, command


def _params(values: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in values.items())


def _render(r: dict) -> None:
    from fairpipe.flows.parameters import recall_line

    print(
        f"{r['store']}: {r['n']} points ({r['n_alive']} alive) x {r['d']} dims, "
        f"groups {r['group_names']}"
    )
    print(f"LSH {r['lsh']}; suggested radius {r['suggested_radius']:.4g}")
    promise = recall_line(r["lsh"], r["suggested_radius"])
    if promise:
        print(f"LSH parameters {promise}")
    if "clustering" in r:
        m = r["clustering"]
        line = f"model: {m['model']} ({_params(m['parameters'])})"
        fitted = m.get("fitted")
        if fitted:
            line += (
                f"; fitted {fitted['time']} on {fitted['n_alive']} points, k-means cost "
                f"{fitted['inertia']:.6g} ({fitted['mean_squared_distance']:.4g} per point)"
            )
        print(line)
    if "summary" in r:
        s = r["summary"]
        print(
            f"fair summary: {len(s['ids'])} of k={s['k']} ({s['utility']}), error(S) = "
            f"{s['error']}, per group {s['counts']}"
        )
        print(f"summary parameters: {_params(s['parameters'])}")
    shown = [h for h in r["history"] if not h["internal"]]
    for h in shown:
        print(f"{h['id']}  {h['time']}  {h['message']}")
    hidden = len(r["history"]) - len(shown)
    if hidden:
        print(f"({hidden} internal checkpoints of these commits not shown; --json lists them)")
    print(f"(every operation, kept through erasure: fairpipe history --store {r['store']})")


# The summary's attributes that are its parameters (the rest are its figures).
SUMMARY_PARAMETERS = ("k", "lower", "upper", "utility", "gamma", "eval_size", "rule", "factor",
                      "seed", "fanout", "height")  # fmt: skip


@command(render=_render, read_only=True)
def info(store: Store, *, shared: Shared) -> dict:
    """Show a store's size, groups, LSH parameters, model, summary and commit history.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe info --store digits.store
    """
    from fairpipe.storage.lineage import read_lineage
    from fairpipe.storage.models import model_params
    from fairpipe.storage.store import FairpipeStore
    from fairpipe.storage.summary import has_summary, read_summary_ids, summary_attrs

    st = FairpipeStore.open(store)
    attrs = st.require_data()
    result = {"store": store, **attrs, "history": st.history()}
    session = st.readonly_session()
    lineage = read_lineage(session)
    if attrs.get("model") in ("dc", "q"):
        kind = attrs["model"]
        result["clustering"] = {"model": kind, "parameters": model_params(session, kind)}
        fits = [e for e in lineage if e["operation"] == "fit"]
        if fits:  # the objective when it was fitted (a forget since updates the model)
            last = fits[-1]
            result["clustering"]["fitted"] = {"time": last["time"], **last["rows"],
                                              **last["figures"]}  # fmt: skip
    if has_summary(session):
        s = summary_attrs(session)
        result["summary"] = {
            **s, "ids": read_summary_ids(session).tolist(),
            "parameters": {name: s[name] for name in SUMMARY_PARAMETERS if name in s},
        }  # fmt: skip
    return result
