"""The Prefect API a command uses: the user's (PREFECT_API_URL, which must answer), the server of
``fairpipe server start`` (found through its pid file under PREFECT_HOME), or its own."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from typer.testing import CliRunner

from fairpipe.flows import prefect_server as _server
from fairpipe.flows.cli import app

runner = CliRunner()
FAIRPIPE = sys.executable.replace("python", "fairpipe")


def test_a_prefect_api_url_that_does_not_answer_is_one_line_and_exit_2(
    digits_store, monkeypatch, tmp_path
):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    started = time.perf_counter()
    out = runner.invoke(app, ["forget", "--store", str(digits_store[0]), "--ids", "1"])
    assert out.exit_code == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(
        "error: PREFECT_API_URL is http://127.0.0.1:9/api, which does not answer"
    )
    assert time.perf_counter() - started < _server.API_TIMEOUT_SECONDS + 2
    with pytest.raises(_server.FairpipeInputError, match="PREFECT_API_URL is notaurl"):
        _server.check_api("notaurl")


def test_an_answering_api_is_used_as_it_is(prefect_server, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    _server.launch_early()
    try:
        assert _server._early is None and os.environ["PREFECT_API_URL"] == prefect_server
    finally:
        _server.stop_early()
    assert os.environ["PREFECT_API_URL"] == prefect_server  # the user's, left as it was


def last_flow_run(api: str) -> tuple[dict, list[dict]]:
    """The latest flow run the Prefect server at ``api`` holds, and its task runs."""

    def post(path: str, body: dict):
        request = urllib.request.Request(f"{api}/{path}", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    (run,) = post("flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 1})
    return run, post("task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}})


def fairpipe(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([FAIRPIPE, *args], env=env, capture_output=True, text=True, timeout=180)


def servers_of(home: str) -> list[psutil.Process]:
    """The ``prefect server start`` processes whose PREFECT_HOME is ``home``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if {"prefect", "server", "start"} <= set(process.info["cmdline"] or ()) and (
                process.environ().get("PREFECT_HOME") == home
            ):
                found.append(process)
    return found


def test_server_start_status_stop_and_commands_use_it(
    prefect_server, digits_store, monkeypatch, tmp_path
):
    """``fairpipe server start`` keeps Prefect's own server running (in PREFECT_HOME: the
    session's, whose database is made); a command finds it through the pid file and records its
    flow run there (named after it and the store, with its task runs: delivered before the
    program's quick exit); ``stop`` ends it, and a second ``stop`` is one line, exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_UI_ENABLED"] = "0"
    # Two starts at the same moment: one server, the other start says it runs.
    starts = [subprocess.Popen([FAIRPIPE, "server", "start", "--json"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
              for _ in range(2)]  # fmt: skip
    outs = sorted((p.wait(timeout=120), *p.communicate()) for p in starts)
    assert [code for code, _, _ in outs] == [0, 2], outs
    kept = json.loads(outs[0][1])
    try:
        assert "already runs at " + kept["url"] in outs[1][2]
        assert [p.pid for p in servers_of(env["PREFECT_HOME"])] == [kept["pid"]]
        status = json.loads(fairpipe("server", "status", "--json", env=env).stdout)
        assert status["running"] and status["url"] == kept["url"]
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
        _server.launch_early()  # what a command does before importing its flow
        try:
            assert _server._early is None  # no server of its own
            assert os.environ["PREFECT_API_URL"] == kept["url"]
        finally:
            _server.stop_early()
        assert "PREFECT_API_URL" not in os.environ
        store = tmp_path / "people"
        shutil.copytree(digits_store[0], store)
        fitted = fairpipe("fit", "--store", str(store), "--n-clusters", "3", env=env)
        assert fitted.returncode == 0, fitted.stderr
        deadline = time.monotonic() + 20  # the server records task runs from their events
        while not (found := last_flow_run(kept["url"]))[1] and time.monotonic() < deadline:
            time.sleep(0.2)
        run, tasks = found
        assert (run["name"], run["state_type"]) == ("fit people", "COMPLETED")
        assert tasks and {t["state_type"] for t in tasks} == {"COMPLETED"}
    finally:
        stopped = fairpipe("server", "stop", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert not psutil.pid_exists(kept["pid"]) or psutil.Process(kept["pid"]).status() == "zombie"
    assert not _server.pid_file().exists()
    out = fairpipe("server", "stop", env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: No Prefect server of 'fairpipe server start' runs")
    assert len(out.stderr.splitlines()) == 1
