"""deploy/prefect.yaml on a real Prefect server, a real ``dask scheduler`` and two ``dask worker``
processes: every deployment names a real flow with valid parameters; ``prefect deploy --all``
then ``prefect worker start --run-once`` runs the forget-drain on the external scheduler; and
the command line on that cluster writes the same store, array by array, as the embedded one."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from prefect.utilities.importtools import import_object

from fairpipe.storage.store import FairpipeStore

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "prefect.yaml"
BIN = Path(sys.executable).parent


def test_every_deployment_points_at_a_flow_with_valid_parameters():
    spec = yaml.safe_load(DEPLOY.read_text())
    names = {}
    for d in spec["deployments"]:
        # A module path: a file path would make the Dask workers unpickle tasks of a top-level
        # module named after the file, which they cannot import.
        assert ".py" not in d["entrypoint"] and ":" not in d["entrypoint"], d["entrypoint"]
        flow = import_object(d["entrypoint"])
        # Raises on a missing, mistyped or unknown parameter (options fields included).
        flow.validate_parameters(d.get("parameters", {}))
        names[d["name"]] = flow.name
        assert d["work_pool"]["name"] == "fairpipe"
    assert names == {
        "nightly-ingest": "fairpipe-ingest", "forget-drain": "fairpipe-forget",
        "backfill": "fairpipe-backfill", "nightly-refit": "fairpipe-fit",
        "nightly-summarize": "fairpipe-summarize",
        "weekly-credit-model-audit": "fairpipe-audit",
    }  # fmt: skip
    drain = next(d for d in spec["deployments"] if d["name"] == "forget-drain")
    assert drain["schedules"] == [{"interval": 900}]
    assert drain["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def external_dask(prefect_server, tmp_path_factory):
    """``dask scheduler`` and two ``dask worker`` processes on localhost (what a user starts)."""
    from distributed import Client

    logs = tmp_path_factory.mktemp("dask-logs")
    address = f"tcp://127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port",
                               address.rsplit(":", 1)[1], "--no-dashboard"],
                              stdout=open(logs / "scheduler.log", "w"),
                              stderr=subprocess.STDOUT)]  # fmt: skip
    time.sleep(1.0)
    for j in range(2):
        procs.append(subprocess.Popen([BIN / "dask", "worker", address, "--nworkers", "1",
                                       "--nthreads", "1", "--no-dashboard"],
                                      stdout=open(logs / f"worker{j}.log", "w"),
                                      stderr=subprocess.STDOUT))  # fmt: skip
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def task_prefixes(address: str) -> set[str]:
    from distributed import Client

    with Client(address, timeout=30) as client:
        return set(
            client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes))
        )


def prefect(*args, env, cwd=ROOT, timeout=300, with_stderr=False):
    out = subprocess.run([BIN / "prefect", *map(str, args)], env=env, cwd=cwd, timeout=timeout,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr if with_stderr else out.stdout


def fairpipe(*args, env):
    out = subprocess.run([BIN / "fairpipe", *map(str, args)], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout) if "--json" in args else out.stdout


def test_the_drain_deployment_runs_on_an_external_scheduler(external_dask, prefect_server,
                                                           tmp_path):  # fmt: skip
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "FAIRPIPE_HOME": str(ROOT)}
    env.pop("FAIRPIPE_DASK_ADDRESS", None)
    store = tmp_path / "people"
    X = np.random.default_rng(4).normal(size=(900, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    on_cluster = ("--dask-address", external_dask)
    fairpipe("ingest", tmp_path / "x.npy", "--store", store, "--n-hashes", 3, "--n-tables", 4,
             *on_cluster, "--json", env=env)  # fmt: skip
    # A Q-k-means model: the drain updates it in a Dask task (the tasks the workers must import).
    fairpipe(
        "fit", "--store", store, "--model", "q", "--n-clusters", 3, *on_cluster, "--json", env=env
    )
    filed = [fairpipe("request-deletion", "--store", store, "--ids", ids, "--json",
                      env=env)["request"] for ids in ("1,2,3", "40,41", "7777")]  # fmt: skip

    prefect("work-pool", "create", "fairpipe", "--type", "process", "--overwrite", env=env)
    prefect("deploy", "--prefect-file", DEPLOY, "--all", env=env)

    def run(deployment: str, parameters: dict) -> None:
        run_once(deployment, parameters, external_dask, env)

    run("fairpipe-forget/forget-drain", {"store_url": str(store)})
    assert "forget_q" in task_prefixes(external_dask)  # the drain's Q update ran on the cluster
    st = FairpipeStore.open(str(store))
    found = fairpipe("receipts", "--store", store, "--json", env=env)["receipts"]
    receipts = {r["request"]: r for r in found}
    assert sorted(receipts) == sorted(filed)
    assert receipts[filed[2]]["not_found"] == [7777]
    assert all(r["erased_at"] for r in receipts.values())  # default retention: erased at once
    alive = st.read("ids")[st.read("alive")]
    assert not np.isin([1, 2, 3, 40, 41], alive).any() and alive.size == 895
    status = fairpipe("status", "--store", store, "--json", env=env)
    assert status["pending_requests"]["count"] == 0
    assert status["artifacts"]["model (q)"]["current"]

    # A backfill on the same scheduler. (The nightly-ingest deployment runs on the second host:
    # tests/second_host/test_deployments.py.)
    (tmp_path / "backlog.csv").write_text("id\n" + "\n".join(map(str, range(100, 160))) + "\n")
    run("fairpipe-backfill/backfill", {"store_url": str(store),
                                       "ids_file": str(tmp_path / "backlog.csv"),
                                       "options": {"batch_size": 25}})  # fmt: skip
    st = FairpipeStore.open(str(store))
    alive = st.read("ids")[st.read("alive")]
    assert alive.size == 895 - 60 and not np.isin(np.arange(100, 160), alive).any()
    assert len(fairpipe("receipts", "--store", store, "--json", env=env)["receipts"]) == 3 + 3


def run_once(deployment: str, parameters: dict, scheduler: str, env: dict) -> str:
    """One run of ``deployment`` through a process worker (``prefect worker start --run-once``),
    its jobs on ``scheduler``; it must complete. The worker's output (the flow run's own
    included)."""
    import asyncio

    from prefect.client.orchestration import get_client

    job_env = json.dumps({"FAIRPIPE_DASK_ADDRESS": scheduler})
    started = prefect("deployment", "run", deployment, "--params", json.dumps(parameters),
                      "--job-variable", f"env={job_env}", env=env)  # fmt: skip
    run_id = started.split("UUID:")[1].split()[0]
    output = prefect("worker", "start", "--pool", "fairpipe", "--run-once", env=env,
                     with_stderr=True)  # fmt: skip

    async def state():
        async with get_client() as client:
            return (await client.read_flow_run(run_id)).state

    final = asyncio.run(state())
    assert final.is_completed(), (deployment, final, output)
    return output


def stored_objects(url) -> dict[str, bytes]:
    """Every object of the store's ``main`` (metadata and every stored chunk of every array;
    receipts and the lineage log aside: they hold times), by key."""
    from zarr.buffer import default_buffer_prototype

    from fairpipe.storage.chunks import on_zarr_loop

    store = FairpipeStore.open(str(url)).readonly_session().store

    async def read() -> dict[str, bytes]:
        keys = [k async for k in store.list() if not k.startswith(("receipts/json/", "lineage/"))]
        out = {}
        for k in sorted(keys):
            buf = await store.get(k, prototype=default_buffer_prototype())
            out[k] = buf.to_bytes()
        return out

    return on_zarr_loop(read())


def test_the_command_line_on_an_external_cluster_writes_the_embedded_clusters_store(
    external_dask, prefect_server, tmp_path
):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    env.pop("FAIRPIPE_DASK_ADDRESS", None)
    X = np.random.default_rng(5).normal(size=(1200, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    stores = {}
    for name, cluster in (("external", ("--dask-address", external_dask)),
                          ("embedded", ("--workers", 2))):  # fmt: skip
        s = tmp_path / name
        fairpipe("ingest", tmp_path / "x.npy", "--store", s, "--n-hashes", 4, "--n-tables", 6,
                 "--chunk-rows", 256, *cluster, "--json", env=env)  # fmt: skip
        fairpipe("fit", "--store", s, "--n-clusters", 4, "--fanout", 4, "--height", 1, *cluster,
                 "--json", env=env)  # fmt: skip
        fairpipe("summarize", "--store", s, "--k", 6, "--lower", 0.1, "--upper", 0.9,
                 "--fanout", 2, "--height", 1, *cluster, "--json", env=env)  # fmt: skip
        fairpipe("forget", "--store", s, "--ids", "3,5,700,1199", *cluster, "--json", env=env)
        stores[name] = stored_objects(s)
    external, embedded = stores["external"], stores["embedded"]
    assert (
        external.keys() == embedded.keys() and sum(k.endswith("zarr.json") for k in external) > 10
    )
    for key, value in embedded.items():
        assert external[key] == value, key
    shutil.rmtree(tmp_path / "external")
