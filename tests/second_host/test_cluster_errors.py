"""A cluster the command cannot use is one line and exit 2, before any work: a malformed or
unreachable scheduler address, workers running another fairpipe version, workers that cannot
reach the store's endpoint (tests/second_host/conftest.py builds the second host)."""

from __future__ import annotations

import time

import pandas as pd
import pytest
from typer.testing import CliRunner

import fairpipe.flows.cluster as cluster
import fairpipe.flows.task_runner as task_runner
from fairpipe.errors import FairpipeInputError

runner = CliRunner()


def invoke(*args: object):
    from fairpipe.flows.cli import app

    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def one_line_error(out, code: int = 2) -> str:
    assert out.exit_code == code, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


@pytest.fixture
def candidates(tmp_path):
    pd.DataFrame({"list": ["a"] * 4, "score": [4, 3, 2, 1], "group": ["f", "m"] * 2}).to_csv(
        tmp_path / "c.csv", index=False
    )
    return ["rerank", tmp_path / "c.csv", "--out", tmp_path / "top.csv"]


@pytest.mark.parametrize(
    "address", ["notanaddress", "http://10.0.0.5:8786", "tcp://host", "tcp://:8786", "tcp://a b:1"]
)
def test_a_malformed_scheduler_address_is_refused_at_once(address):
    with pytest.raises(FairpipeInputError, match="must be a Dask scheduler address such as"):
        cluster.check_dask_address(address)


def test_a_malformed_scheduler_address_is_one_line_before_anything_starts(candidates, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("started for a malformed address")

    monkeypatch.setattr(cluster, "probe_scheduler", never)
    monkeypatch.setattr(task_runner, "prefect_api", never)
    line = one_line_error(invoke(*candidates, "--dask-address", "notanaddress"))
    assert "Got 'notanaddress' instead." in line


def test_an_unreachable_scheduler_is_one_line_within_its_time_out(candidates):
    line = one_line_error(invoke(*candidates, "--dask-address", "tcp://127.0.0.1:9"))
    assert "No Dask scheduler answers at tcp://127.0.0.1:9 within 5 s (Connection refused)" in line
    # A refused connection is reported at once (a Dask client retries it until its time-out);
    # one that hangs, after CONNECT_SECONDS: the command's start and this stay within 10 s.
    t0 = time.perf_counter()
    with pytest.raises(FairpipeInputError, match="Connection refused"):
        cluster.connect("tcp://127.0.0.1:9")
    assert time.perf_counter() - t0 < 2 and cluster.CONNECT_SECONDS <= 5


def test_workers_of_another_fairpipe_version_are_refused_before_any_work(
    second_host, candidates, monkeypatch
):
    import fairpipe

    theirs = fairpipe.__version__  # the workers import the same code
    monkeypatch.setattr(fairpipe, "__version__", "0.0.0+other")
    before = second_host.task_counts()
    line = one_line_error(invoke(*candidates, "--dask-address", second_host.scheduler))
    assert f"The Dask workers run fairpipe {theirs}, this command fairpipe 0.0.0+other: " in line
    assert f"worker tcp://{second_host.worker_ip}:" in line
    assert second_host.task_counts() == before  # nothing submitted


def test_workers_that_cannot_reach_the_stores_endpoint_are_named(s3_store, s3_env, monkeypatch):
    """The client reaches the S3 server at 127.0.0.1; the workers, on the second host, do not."""
    local = s3_env.endpoint.replace(s3_env.host_ip, "127.0.0.1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", local)
    before = s3_env.task_counts()
    line = one_line_error(invoke("fit", "--store", s3_store, "--n-clusters", 2,
                                 "--dask-address", s3_env.scheduler))  # fmt: skip
    assert f"The Dask worker tcp://{s3_env.worker_ip}:" in line
    assert f"cannot reach the store's endpoint {local} (" in line
    assert s3_env.task_counts() == before


def test_workers_that_cannot_see_a_stores_folder_are_named(second_host, digits_store):
    """A store on the client's disk (pytest's folder: under the workers' own /tmp, it is not
    there for them)."""
    path, _ = digits_store
    before = second_host.task_counts()
    line = one_line_error(invoke("fit", "--store", path, "--n-clusters", 2,
                                 "--dask-address", second_host.scheduler))  # fmt: skip
    assert f"The Dask worker tcp://{second_host.worker_ip}:" in line
    assert f"cannot see the store's folder {path}, which is on this machine's disk." in line
    assert second_host.task_counts() == before


def test_a_server_that_is_not_a_scheduler_is_one_line(candidates, second_host):
    """A worker's address, and a web server's (it answers what it reads with an HTTP error)."""
    import socketserver
    import threading

    class Answer(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    with second_host.client() as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
    line = one_line_error(invoke(*candidates, "--dask-address", worker))
    assert f"The server at {worker} is a Dask Worker, not a scheduler." in line

    web = socketserver.TCPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        address = f"tcp://127.0.0.1:{web.server_address[1]}"
        line = one_line_error(invoke(*candidates, "--dask-address", address))
    finally:
        web.shutdown()
        web.server_close()
    assert f"The server at {address} does not answer as a Dask scheduler." in line
