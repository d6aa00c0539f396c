"""The local Prefect server a command line launches before importing its flow."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request

import pytest

from fairpipe.flows import prefect_server as _server
from fairpipe.flows.prefect_api import prefect_api


def healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        return response.status == 200


@pytest.fixture
def no_api(monkeypatch):
    """A process with no Prefect API configured (as a user's shell)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    yield
    _server.stop_early()


def test_the_early_server_is_the_one_the_flow_uses_and_it_stops(no_api):
    _server.launch_early()
    early = _server._early
    assert early is not None and early.process is not None
    with prefect_api() as url:
        assert url == early.api_url and healthy(url)
        assert _server._early is None  # adopted: prefect_api stops it
    assert early.process.poll() is not None


def test_an_early_server_no_flow_adopted_is_stopped(no_api):
    _server.launch_early()
    early = _server._early
    assert early is not None and early.process is not None
    _server.stop_early()
    assert early.process.poll() is not None and _server._early is None


def test_a_command_with_bad_input_leaves_no_server_behind(tmp_path):
    """Through the installed command, without PREFECT_API_URL: it launches its server early,
    fails on bad input (exit 2), and no server process it started is left running."""
    import os
    import time

    import psutil

    started = time.time()
    home = str(tmp_path / "prefect-home")  # tells this command's server from any other's
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": home}
    exe = sys.executable.replace("python", "fairpipe")
    out = subprocess.run([exe, "ingest", str(tmp_path / "missing.csv"), "--store",
                          str(tmp_path / "store")], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stderr
    time.sleep(0.5)
    servers = [p for p in psutil.process_iter(["cmdline", "create_time"])
               if p.info["create_time"] and p.info["create_time"] >= started - 1
               and "prefect.server.api.server:create_app" in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    left = []
    for p in servers:
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or another user's
            if p.environ().get("PREFECT_HOME") == home:
                left.append(p.info["cmdline"])
    assert left == []
