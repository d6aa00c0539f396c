"""A deployment's flow run on the second host's workers (tests/second_host/conftest.py): the
forget-drain through ``prefect worker start --run-once``, FAIRPIPE_DASK_ADDRESS naming the
second host's scheduler and the store in its bucket. The flow run's process talks to Prefect;
the workers, which cannot reach it, run the drain's jobs."""

from __future__ import annotations

import os

import numpy as np
from typer.testing import CliRunner

from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.store import FairpipeStore
from tests.flows.test_deploy import DEPLOY, ROOT, prefect, run_once
from tests.second_host.conftest import BUCKET, INGEST, PEOPLE


def test_the_forget_drain_deployment_runs_on_the_second_host(s3_env, prefect_server, tmp_path):
    from fairpipe.flows.cli import app

    host = s3_env
    store = f"s3://{BUCKET}/deployed"
    cli = CliRunner()
    for args in (
        [*INGEST, "--store", store],
        ["fit", "--store", store, "--n-clusters", 3, "--model", "q"],  # its deletions run as a job
        ["request-deletion", "--store", store, "--ids", ",".join(map(str, range(0, 600, 2)))],
    ):
        out = cli.invoke(app, [str(a) for a in args])
        assert out.exit_code == 0, out.output
    before = host.task_counts()

    run_deployment("fairpipe-forget/forget-drain", {"store_url": store}, host.scheduler,
                   prefect_server)  # fmt: skip
    counts = host.task_counts()
    for job in ("remove_job", "forget_q"):
        assert counts.get(job, 0) > before.get(job, 0), (job, counts)
    st = FairpipeStore.open(store)  # (the client's S3 settings: s3_env)
    alive = st.read("ids")[st.read("alive")]
    receipts = read_receipts(st.readonly_session())
    assert alive.size == 2700 and not np.isin(np.arange(0, 600, 2), alive).any()
    assert len(receipts) == 1


def run_deployment(name: str, parameters: dict, scheduler: str, prefect_server: str) -> None:
    """Deploy ``name`` and run it once through a process worker, its jobs on ``scheduler``."""
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "FAIRPIPE_HOME": str(ROOT)}
    env.pop("FAIRPIPE_DASK_ADDRESS", None)
    prefect("work-pool", "create", "fairpipe", "--type", "process", "--overwrite", env=env)
    prefect("deploy", "--prefect-file", DEPLOY, "--name", name.split("/")[1], env=env)
    run_once(name, parameters, scheduler, env)


def test_the_nightly_ingest_deployment_reads_an_object_store_source_on_the_second_host(
    s3_env, prefect_server, people_source
):
    """The day's export at an s3:// URL: the flow run's process plans it, the second host's
    workers read its rows; the store in the bucket holds them."""
    host = s3_env
    host.s3.upload_file(str(people_source), BUCKET, "exports/day.parquet")
    store = f"s3://{BUCKET}/nightly"
    flags = dict(zip(PEOPLE[::2], PEOPLE[1::2]))
    options = {"seed": 0, "id_column": flags["--id-column"], "group_column": flags["--group-column"],
               "n_hashes": int(flags["--n-hashes"]), "n_tables": int(flags["--n-tables"]),
               "chunk_rows": int(flags["--chunk-rows"])}  # fmt: skip
    before = host.task_counts()
    run_deployment("fairpipe-ingest/nightly-ingest",
                   {"source": f"s3://{BUCKET}/exports/day.parquet", "store_url": store,
                    "options": options}, host.scheduler, prefect_server)  # fmt: skip
    assert host.task_counts().get("ingest_chunk", 0) > before.get("ingest_chunk", 0)
    import pandas as pd

    st = FairpipeStore.open(store)
    expected = pd.read_parquet(people_source)["id"].to_numpy()
    assert np.array_equal(np.sort(st.read("ids")), np.sort(expected))
