"""A second host for the cluster tests: two ``dask worker`` processes that share nothing with
the client but the network, as on a real cluster.

As root (CI runs as root), a Linux network namespace with its own address (a veth pair:
10.77.N.1 on this host's side, 10.77.N.2 on the workers'), a ``dask scheduler`` and moto's S3
server on this host's side address (both sides reach them), and two workers inside the namespace,
each in a private mount namespace with its own tmpfs over /tmp (so the client's temporary and
working folders, pytest's among them, are invisible to them), its own HOME and TMPDIR, the code on
PYTHONPATH, the S3 credentials in its environment, and no Prefect setting at all: the client's
Prefect API (127.0.0.1, in this host's namespace) is out of their reach.

Under CI=true a missing capability (root, ``ip``, ``unshare``, network namespaces) fails the
test that needs the second host; elsewhere it skips it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CODE = Path(__file__).resolve().parents[2]  # the code the workers import (PYTHONPATH)
BUCKET = "fairpipe-cluster"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_REGION": "us-east-1"}  # fmt: skip
N_WORKERS = 2
# The people store of the cluster tests: 3,000 gaussian points in two groups.
INGEST = ["ingest", "gaussian", "--gaussian-n", "3000", "--gaussian-d", "4", "--gaussian-clusters",
          "3", "--gaussian-groups", "2", "--n-hashes", "4", "--n-tables", "6", "--chunk-rows",
          "1000"]  # fmt: skip


@dataclass
class SecondHost:
    """The second host's addresses, its scheduler and the S3 server both sides reach."""

    scheduler: str  # tcp://10.77.N.1:port
    endpoint: str  # http://10.77.N.1:port (moto)
    host_ip: str
    worker_ip: str
    namespace: str
    s3: object  # a boto3 client of the S3 server
    workers: list[str] = field(default_factory=list)

    def client(self):
        from distributed import Client

        return Client(self.scheduler, timeout=10, set_as_default=False)

    def task_counts(self) -> dict[str, int]:
        """Tasks the scheduler has seen finish, by function name (its task prefixes)."""
        with self.client() as client:
            return client.run_on_scheduler(
                lambda dask_scheduler: {
                    name: int(prefix.state_counts.get("memory", 0))
                    for name, prefix in dask_scheduler.task_prefixes.items()
                }
            )

    def executed_per_worker(self) -> dict[str, int]:
        with self.client() as client:
            return client.run(lambda dask_worker: dask_worker.state.executed_count)


def lacking(why: str):
    """A missing capability: a failure under CI, a skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"the second host cannot be built: {why}", pytrace=False)
    pytest.skip(f"the second host cannot be built: {why}")


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        lacking(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[:3]} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def worker_environment(endpoint: str = "") -> dict[str, str]:
    """What a worker on another machine would have: the code, the S3 settings (``endpoint``:
    the S3 server as the workers reach it), Dask's and fairpipe's defaults; no Prefect setting
    and none of the client's other variables."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(CODE),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "DASK_DISTRIBUTED__WORKER__DAEMON": "false",
        "DASK_LOGGING__DISTRIBUTED": "error",
        **CREDENTIALS,
    }
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def kept_under_tmp() -> list[str]:
    """What a worker keeps of the client's /tmp: the code and the Python environment, when a
    checkout lives there (a newcomer may clone under /tmp); nothing else of it."""
    tmp = Path("/tmp").resolve()
    kept = {CODE, Path(sys.prefix).resolve()}
    return sorted(str(p.relative_to(tmp)) for p in kept if p.is_relative_to(tmp))


def worker_command(scheduler: str, namespace: str, worker_ip: str, name: str) -> list[str]:
    """A ``dask worker`` in the namespace, in a mount namespace of its own: a tmpfs over /tmp
    (the client's temporary and pytest's folders vanish; a checkout under /tmp is bound back,
    as the code would be installed on another machine), HOME and TMPDIR inside it."""
    keep = kept_under_tmp()
    rebind = "".join(
        f"mkdir -p '/tmp/{rel}'; mount --bind '/mnt/{rel}' '/tmp/{rel}'; " for rel in keep
    )
    hide = "mount --bind /tmp /mnt; " if keep else ""
    release = "umount -l /mnt; " if keep else ""
    script = (
        f"set -e; {hide}mount -t tmpfs tmpfs /tmp; {rebind}{release}mkdir -p /tmp/home /tmp/tmp; "
        "export HOME=/tmp/home TMPDIR=/tmp/tmp; "
        f"exec {sys.executable} -m distributed.cli.dask_worker {scheduler} --nworkers 1 "
        f"--nthreads 1 --no-dashboard --host {worker_ip} --local-directory /tmp/tmp "
        f"--name {name} --death-timeout 60"
    )
    return ["ip", "netns", "exec", namespace, "unshare", "--mount", "--propagation", "private",
            "sh", "-c", script]  # fmt: skip


@pytest.fixture(scope="session")
def second_host(tmp_path_factory):
    """The second host, built once per session (about 3 s) and torn down after."""
    if os.geteuid() != 0:
        lacking("not root")
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            lacking(f"no {tool!r} command")
    tag = os.getpid() % 100_000
    # One subnet per pytest process: two test workers (pytest -n 2) build a second host each.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % 2
    net = 20 + (os.getpid() % 100) * 2 + worker
    namespace, host_if, worker_if = f"fp{tag}", f"fph{tag}", f"fpw{tag}"
    host_ip, worker_ip = f"10.77.{net}.1", f"10.77.{net}.2"
    logs = tmp_path_factory.mktemp("second-host")
    procs: list[subprocess.Popen] = []
    _run("ip", "netns", "add", namespace)
    try:
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", worker_if)
        _run("ip", "link", "set", worker_if, "netns", namespace)
        _run("ip", "addr", "add", f"{host_ip}/24", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{worker_ip}/24", "dev",
             worker_if)  # fmt: skip
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", worker_if, "up")
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up")

        def start(command: list[str], name: str, env: dict | None = None) -> Path:
            log = logs / f"{name}.log"
            procs.append(
                subprocess.Popen(
                    command,
                    stdout=open(log, "w"),
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )  # fmt: skip
            )
            return log

        moto_port = _free_port("0.0.0.0")
        # On every address of this host: the client also reaches it at 127.0.0.1, which the
        # workers do not (a store endpoint only the client reaches).
        start([str(Path(sys.executable).parent / "moto_server"), "-H", "0.0.0.0", "-p",
               str(moto_port)], "moto")  # fmt: skip
        scheduler_file = logs / "scheduler.json"
        log = start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host_ip,
                     "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file)],
                    "scheduler", {**worker_environment(), "HOME": str(logs)})  # fmt: skip
        _wait_for(scheduler_file, procs[-1], log)
        scheduler = json.loads(scheduler_file.read_text())["address"]
        endpoint = f"http://{host_ip}:{moto_port}"
        names = [f"worker-{i}" for i in range(N_WORKERS)]
        for name in names:
            start(worker_command(scheduler, namespace, worker_ip, name), name,
                  worker_environment(endpoint))  # fmt: skip
        host = SecondHost(scheduler, endpoint, host_ip, worker_ip, namespace,
                          _s3_client(endpoint), names)  # fmt: skip
        with host.client() as client:
            client.wait_for_workers(N_WORKERS, timeout=120)
        yield host
    finally:
        for proc in reversed(procs):
            _stop(proc)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@pytest.fixture
def s3_env(second_host, monkeypatch):
    """The client's S3 settings: the second host's S3 server, its credentials."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", second_host.endpoint)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return second_host


def people_parquet(folder: Path) -> Path:
    """3,000 points of 4 features in two groups (``people.parquet``, with ids and groups), in
    ``folder``: on the client only, when the folder is pytest's."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(35)
    centres = rng.normal(scale=4.0, size=(3, 4))
    X = centres[rng.integers(0, 3, 3000)] + rng.normal(size=(3000, 4))
    frame = pd.DataFrame(X.astype(np.float32), columns=[f"x{j}" for j in range(4)])
    frame["group"] = rng.choice(["f", "m"], 3000)
    frame.insert(0, "id", np.arange(3000))
    path = folder / "people.parquet"
    frame.to_parquet(path, index=False)
    return path


# How the people store is ingested (its source's path aside).
PEOPLE = ["--id-column", "id", "--group-column", "group", "--n-hashes", "4", "--n-tables", "6",
          "--chunk-rows", "1000"]  # fmt: skip


@pytest.fixture(scope="session")
def people_source(tmp_path_factory) -> Path:
    return people_parquet(tmp_path_factory.mktemp("client-only"))


@pytest.fixture(scope="session")
def s3_store(second_host, prefect_server, people_source):
    """The people store in the second host's bucket, ingested on its workers from a Parquet file
    only the client has (it reads the file and sends its blocks to the workers)."""
    from typer.testing import CliRunner

    from fairpipe.flows.cli import app

    url = f"s3://{BUCKET}/people"
    before = second_host.task_counts()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", second_host.endpoint)
        for name, value in CREDENTIALS.items():
            mp.setenv(name, value)
        made = CliRunner().invoke(app, ["ingest", str(people_source), "--store", url, *PEOPLE,
                                        "--dask-address", second_host.scheduler])  # fmt: skip
    assert made.exit_code == 0, made.output
    after = second_host.task_counts()
    assert after.get("ingest_chunk", 0) > before.get("ingest_chunk", 0), after
    return url


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _s3_client(endpoint: str):
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    for _ in range(200):
        try:
            client.create_bucket(Bucket=BUCKET)
            return client
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"moto's S3 server at {endpoint} does not answer")
