"""Every command on a cluster whose workers share nothing with the client but the network
(tests/second_host/conftest.py): no Prefect API, no /tmp, no working folder of the client's; the
store in a bucket of an S3 server both sides reach."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from tests.second_host.conftest import PEOPLE

runner = CliRunner()


def invoke(*args: object):
    from fairpipe.flows.cli import app

    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def ok(out) -> dict:
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def store_commands(store: str, cluster: list) -> None:
    """fit DC, summarize, a drain of 300 ids, fit Q, a drain of 3 ids on the store."""
    fit = ok(invoke("fit", "--store", store, "--n-clusters", 3, "--fanout", 2, "--height", 2,
                    *cluster, "--json"))  # fmt: skip
    assert fit["model"] == "dc" and fit["n_alive"] == 3000
    summary = ok(invoke("summarize", "--store", store, "--k", 4, "--lower", 0.25, "--upper",
                        0.75, "--fanout", 2, "--height", 1, *cluster, "--json"))  # fmt: skip
    assert len(summary["ids"]) == 4

    ids = ",".join(str(i) for i in range(0, 900, 3))  # 300 ids: the index is updated on Dask
    ok(invoke("request-deletion", "--store", store, "--ids", ids, "--json"))
    drained = ok(invoke("forget", "--store", store, *cluster, "--json"))
    assert len(drained["deleted"]) == 300

    q = ok(invoke("fit", "--store", store, "--n-clusters", 3, "--model", "q", *cluster, "--json"))
    assert q["model"] == "q" and q["n_alive"] == 2700
    ok(invoke("request-deletion", "--store", store, "--ids", "1,2,4", "--json"))
    again = ok(invoke("forget", "--store", store, *cluster, "--json"))
    assert sorted(again["deleted"]) == [1, 2, 4] and again["model"] == "q"


def store_arrays(url: str) -> dict:
    """Every array of the store's tip but its receipts and its lineage log (their times differ,
    and the log names each run's source) and the index's sparse tables (compared as their
    (key, id) entries), by path."""
    import zarr

    from fairpipe.storage.index import index_entries
    from fairpipe.storage.store import FairpipeStore

    session = FairpipeStore.open(url).readonly_session()
    root = zarr.open_group(session.store, mode="r")
    out = {
        path: np.asarray(member[...])
        for path, member in root.members(max_depth=None)
        if isinstance(member, zarr.Array) and not path.startswith(("receipts", "lineage"))
        and member.size < 1 << 26
    }  # fmt: skip
    for t, (keys, ids) in enumerate(index_entries(session)):
        out[f"index/{t}/keys"], out[f"index/{t}/ids"] = keys, ids
    return out


def test_every_command_runs_its_heavy_work_on_workers_that_cannot_reach_prefect(
    s3_store, s3_env, people_source, tmp_path, monkeypatch
):
    host, store = s3_env, s3_store
    cluster = ["--dask-address", host.scheduler]
    before = host.task_counts()
    store_commands(store, cluster)

    # Re-ranking and the audit read their inputs on the client; their batches go to Dask.
    monkeypatch.setattr("fairpipe.flows.rerank.LOCAL_LISTS", 0)
    rng = np.random.default_rng(0)
    pd.DataFrame({"list": np.repeat(["a", "b", "c"], 8), "score": rng.random(24),
                  "group": rng.choice(["f", "m"], 24)}).to_csv(tmp_path / "c.csv", index=False)  # fmt: skip
    ranked = ok(invoke("rerank", tmp_path / "c.csv", "--k", 4, "--out", tmp_path / "top.csv",
                       *cluster, "--json"))  # fmt: skip
    assert ranked["rows_out"] == 12
    audited = ok(invoke("audit", *audit_inputs(tmp_path), "--n-seeds", 10, "--n-local", 10,
                        "--no-baselines", *cluster, "--json"))  # fmt: skip
    assert audited["adf"]["ids"] >= 0

    counts = host.task_counts()
    ran = {name: counts.get(name, 0) - before.get(name, 0) for name in counts}
    for job in ("split_by_leaf_group", "solve_leaf_group", "grow_tree",
                "summarize_leaf_group", "remove_job", "fit_q", "forget_q", "rerank_lists",
                "adf_batch", "warm_up"):  # fmt: skip
        assert ran.get(job, 0) > 0, (job, ran)
    assert all(n > 0 for n in host.executed_per_worker().values())

    # The store built locally from the same file by the same commands (the ingest on the
    # embedded default cluster, the others on a cluster of threads in this process: the results
    # do not depend on the workers) is the same, array by array.
    remote = store_arrays(store)
    local = str(tmp_path / "local")
    ok(invoke("ingest", people_source, "--store", local, *PEOPLE, "--json"))
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as here:  # fmt: skip
        store_commands(local, ["--dask-address", here.scheduler_address])
    here = store_arrays(local)
    assert sorted(remote) == sorted(here)
    for path, array in here.items():
        assert np.array_equal(remote[path], array), path


def audit_inputs(folder) -> list:
    """A small audit data set and a fitted model, on the client only."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.integers(0, 5, size=(200, 3)), columns=["a", "b", "c"])
    frame.insert(0, "sex", rng.integers(0, 2, size=200))
    frame["label"] = (frame["a"] + 3 * frame["sex"] > 4).astype(int)
    frame.to_csv(folder / "d.csv", index=False)
    X, y = frame.drop(columns="label").to_numpy(), frame["label"].to_numpy()
    (folder / "m.pkl").write_bytes(pickle.dumps(LogisticRegression().fit(X, y)))
    return ["--dataset", folder / "d.csv", "--protected", "sex", "--model", folder / "m.pkl"]
