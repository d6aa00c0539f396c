"""Prefect's local API server, as a subprocess launched without importing Prefect.

The command Prefect's ``SubprocessASGIServer`` runs (uvicorn serving
``prefect.server.api.server:create_app``), launched from here: importing that module costs 1.7 s
on this machine, only to start a process that imports it again; and a command line can launch
the server before it imports its flow (:func:`launch_early`), so that both take their 2 s or so
at the same time. :func:`flows.runtime.prefect_api` launches (or adopts), waits for and stops it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PORT_TAKEN = 3  # uvicorn's exit code when its port is in use
PARENT_VARIABLE = "FAIRPIPE_SERVER_PARENT"
# uvicorn's main, in a process that ends with the process that launched it, however that one
# ends (a SIGKILL included): on Linux the kernel sends it SIGTERM when its parent dies
# (PR_SET_PDEATHSIG); a parent already gone before that was set is seen by its pid.
TIED_TO_PARENT = """
import os, signal, sys
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if str(os.getppid()) != os.environ.get("FAIRPIPE_SERVER_PARENT"):
    sys.exit(0)
import runpy
sys.argv[0] = "uvicorn"
runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
"""


class LocalServer:
    """Prefect's API server in a subprocess on a free local port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self, prefect_settings: bool = False) -> None:
        """Start the subprocess (not waiting for it). ``prefect_settings``: also pass it the
        settings this process set explicitly (Prefect is imported then), as Prefect does."""
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1"}  # fmt: skip
        if prefect_settings:
            from prefect.settings import get_current_settings

            env.update(get_current_settings().to_environment_variables(exclude_unset=True))
        env.pop("PREFECT_API_URL", None)
        spec = importlib.util.find_spec("prefect")
        assert spec is not None and spec.submodule_search_locations
        app_dir = Path(list(spec.submodule_search_locations)[0]).parent
        env[PARENT_VARIABLE] = str(os.getpid())
        # Its own session: a Ctrl-C at the terminal reaches the command, which stops the server
        # once its flow has unwound (the flow still needs it to record the interruption).
        self.process = subprocess.Popen(
            [sys.executable, "-c", TIED_TO_PARENT, "--app-dir", str(app_dir), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
             str(self.port), "--log-level", "error", "--lifespan", "on"],
            env=env, start_new_session=True,
        )  # fmt: skip

    def wait(self) -> None:
        """Wait until the launched server answers; if its port was taken meanwhile, launch it
        again on another."""
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 60))
        while not self._wait_healthy(timeout):
            self.port = free_port()
            self.launch(prefect_settings=True)

    def _wait_healthy(self, timeout: float) -> bool:
        """True once the server answers; False if it exited because its port was taken."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code == PORT_TAKEN:
                return False
            if code is not None:
                raise RuntimeError(f"The local Prefect server exited with code {code}.")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return True
            time.sleep(0.05)
        raise RuntimeError(
            f"Timed out after {timeout:.0f} s waiting for the local Prefect server at "
            f"{self.api_url} (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS sets the limit)."
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_early: LocalServer | None = None


def launch_early() -> None:
    """Launch the local server now if this process will need one (no ``PREFECT_API_URL``):
    a command line calls this before importing its flow."""
    global _early
    if _early is None and not os.environ.get("PREFECT_API_URL"):
        _early = LocalServer()
        _early.launch()


def adopt_early() -> LocalServer | None:
    """The server :func:`launch_early` launched, now the caller's to stop (None if none)."""
    global _early
    server, _early = _early, None
    return server


def stop_early() -> None:
    """Stop a server launched early that no flow adopted (the command failed before)."""
    server = adopt_early()
    if server is not None:
        server.stop()
