from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fairpipe.flows  # noqa: F401  (environment defaults for Prefect and Dask)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# The scenario tier: whole programs as users run them (deployments, the second host, signals,
# hostile campaigns, the documents' examples, an audit end to end, a store's life of appends,
# forgets and fits against fresh builds); `make test` runs it after the
# fast tier (units and the commands), each on two test processes. `pytest -m "not scenario"` runs
# the fast tier alone.
SCENARIOS = (
    "tests/second_host/",
    "tests/flows/test_deploy.py",
    "tests/test_hostile.py",
    "tests/test_hostile_cases.py",
    "tests/test_docs_examples.py",
    "tests/cli/test_interrupts.py",
    "tests/cli/test_privacy.py",
    "tests/cli/test_server.py",
    "tests/cli/test_early_server.py",
    "tests/flows/test_drains.py::test_sigkilled_drains",
    "tests/flows/test_audit_flow.py",
    "tests/flows/test_lifecycle.py",
    "tests/test_packaging.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.nodeid.startswith(SCENARIOS):
            item.add_marker(pytest.mark.scenario)


@pytest.fixture(autouse=True)
def _prefect_console_on_an_open_stream():
    """Prefect's console handler keeps the sys.stderr of its first import: under pytest, a
    capture stream that a test's capture fixture may close. Rebound to the current one, so that a
    later command's flow does not print "--- Logging error ---" into the stderr its test checks
    (a command in a process of its own never meets this)."""
    import logging
    import sys

    if "prefect" in sys.modules:
        for handler in logging.getLogger().handlers:
            if type(handler).__name__ == "PrefectConsoleHandler" and handler.stream.closed:
                handler.stream = sys.stderr  # (setStream would flush the closed one)
                handler.console.file = sys.stderr
    yield


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One Prefect API server for the whole session, shared by the Dask worker processes."""
    import os

    os.environ.setdefault("PREFECT_HOME", str(tmp_path_factory.mktemp("prefect-home")))
    from fairpipe.flows.prefect_api import prefect_api

    with prefect_api() as url:
        yield url


@pytest.fixture(scope="session")
def digits_store(prefect_server, tmp_path_factory):
    """The digits ingested once (2 worker processes), shared by read-only tests."""
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import IngestOptions

    path = tmp_path_factory.mktemp("stores") / "digits"
    result = run_ingest("digits", str(path), IngestOptions(seed=3, n_hashes=8, n_tables=20))
    return path, result


def shared_data(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"{path} is missing: the tests read the real data sets from ../shared/data")
    return path


def skewed_points(seed: int = 0) -> np.ndarray:
    """A dense clump and a sparse halo: LSH buckets of very different sizes around the origin."""
    rng = np.random.default_rng(seed)
    dense = rng.normal(scale=0.15, size=(300, 6))
    sparse = rng.normal(scale=1.0, size=(150, 6))
    return np.vstack([dense, sparse]).astype(np.float32)


# -- an S3-compatible server (moto's, as its own process), for the stores in a bucket -------------
BUCKET = "fairpipe-test"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """``moto_server`` on a free port, with a bucket; AWS_* variables point at it."""
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "server.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-p", str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}  # fmt: skip
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    for _ in range(100):
        try:
            client.create_bucket(Bucket=BUCKET)
            break
        except Exception:
            time.sleep(0.1)
    try:
        yield client
    finally:
        mp.undo()
        proc.terminate()
        proc.wait(timeout=30)


def bucket_objects(client, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
    return out


def holding(objects: dict[str, bytes], needles: list[bytes]) -> list[str]:
    from fairpipe.storage.erasure import holds

    return [key for key, raw in objects.items() if holds(raw, needles)]
