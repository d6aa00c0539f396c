"""The Prefect API a command uses, and the local Prefect servers fairpipe runs.

A command that runs a flow uses, in this order:

1. the user's server at ``PREFECT_API_URL`` (checked to answer before anything starts: one line,
   exit 2, if it does not: :func:`check_api`);
2. the server the user keeps running with ``fairpipe server start`` (:class:`KeptServer`: Prefect's
   own ``prefect server start``, found through its pid file under ``PREFECT_HOME``);
3. else a server of its own (:class:`LocalServer`), started before the command imports its flow
   (:func:`launch_early`) and stopped with it.

The command's own server is the one part of fairpipe that reaches into Prefect's internals: it
is the server Prefect starts itself when no API is configured (``SubprocessASGIServer`` in
``prefect.server.api.server``: uvicorn serving ``create_app`` as a factory, with the private
variables ``PREFECT__SERVER_EPHEMERAL`` and ``PREFECT__SERVER_FINAL``), launched from here
because

- importing that module costs 1.7 s on this machine, only to start a process that imports it
  again; launched without it, the server boots while the command imports its flow;
- ephemeral, it runs only the services a flow run needs (recording task runs, events and logs),
  not the scheduler, late-runs or clean-up services that ``prefect server start`` runs against
  the user's database on every command;
- it is tied to the command (Linux's PR_SET_PDEATHSIG): it dies with it, a SIGKILL included.

A command also delivers what Prefect still holds of its flow run (events and logs) before it
ends, through Prefect's workers' ``drain_all`` (:func:`deliver_records`): what Prefect's exit
hooks would do, which a command that ends with ``os._exit`` skips.

tests/flows/test_prefect_internals.py compares this launch with Prefect's own, and checks the
workers this module drains, and fails, naming what changed, when a Prefect upgrade moves them.
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
from dataclasses import dataclass
from pathlib import Path

from fairpipe.errors import FairpipeInputError

PORT_TAKEN = 3  # uvicorn's exit code when its port is in use
# Prefect's workers that hold a flow run's records until they send them: (module, class).
RECORD_WORKERS = (("prefect.events.worker", "EventsWorker"),
                  ("prefect.logging.handlers", "APILogWorker"))  # fmt: skip


def deliver_records(timeout: float = 5, logs_only: bool = False) -> None:
    """Send what Prefect still holds of this process's flow runs to its server: the events
    (from which the server records task runs) and the logs (``logs_only``: the logs alone).
    Nothing when Prefect is not loaded; a worker that fails to deliver is let be."""
    if "prefect" not in sys.modules:
        return
    for module, name in RECORD_WORKERS[1:] if logs_only else RECORD_WORKERS:
        with contextlib.suppress(Exception):
            getattr(importlib.import_module(module), name).drain_all(timeout=timeout)


# What Prefect's SubprocessASGIServer gives uvicorn and sets in its environment (see the module).
UVICORN_ARGS = ("--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                "--log-level", "error", "--lifespan", "on")  # fmt: skip
EPHEMERAL_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                 "PREFECT__SERVER_FINAL": "1"}  # fmt: skip
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
        self._first: int | None = None  # the lock of a new database's first server (its fd)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self, prefect_settings: bool = False) -> None:
        """Start the subprocess (not waiting for it). ``prefect_settings``: also pass it the
        settings this process set explicitly (Prefect is imported then), as Prefect does."""
        if self.process is None:
            check_prefect_home()
            self._first = _first_server_lock()
        env = {**os.environ, **EPHEMERAL_ENV}
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
            [sys.executable, "-c", TIED_TO_PARENT, "--app-dir", str(app_dir), *UVICORN_ARGS,
             "--port", str(self.port)],
            env=env, start_new_session=True,
        )  # fmt: skip

    def wait(self) -> None:
        """Wait until the launched server answers; if its port was taken meanwhile, launch it
        again on another."""
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 60))
        while not self._wait_healthy(timeout):
            self.port = free_port()
            self.launch(prefect_settings=True)
        if self._first is not None:  # its database is made: other servers may start on it
            (prefect_home() / DATABASE_READY).touch()
            self._release_first()

    def _release_first(self) -> None:
        if self._first is not None:
            os.close(self._first)  # releases the lock
            self._first = None

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
        self._release_first()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- PREFECT_HOME: usable, and its database made by one server at a time -------------------------
BAD_PREFECT_HOME = (
    "PREFECT_HOME is {path}, which {why}; Prefect keeps its database and settings there. Point "
    "PREFECT_HOME at a folder you may write, or unset it (default ~/.prefect)."
)
# Prefect's server makes its database (migrations) on its first start in a PREFECT_HOME; two
# servers doing so at once (two commands started together on a new PREFECT_HOME) fail with
# database errors. The first server's command holds FIRST_SERVER_LOCK until its server answers;
# DATABASE_READY then says the database is made.
FIRST_SERVER_LOCK = "fairpipe-database.lock"
DATABASE_READY = "fairpipe-database.ready"


def check_prefect_home() -> None:
    """A FairpipeInputError unless PREFECT_HOME is (or can be made) a folder this user may
    write: Prefect's server would otherwise retry its database for minutes, printing
    tracebacks."""
    home = prefect_home()
    at = home
    while not at.exists() and at.parent != at:  # the nearest existing folder it would be made in
        at = at.parent
    why = None
    if at.exists() and not at.is_dir():
        why = "is not a folder" if at == home else f"cannot be made: {at} is a file"
    elif not os.access(at, os.W_OK | os.X_OK):
        why = "this user may not write" if at == home else f"cannot be made in {at}"
    if why is not None:
        raise FairpipeInputError(BAD_PREFECT_HOME.format(path=home, why=why))


def _first_server_lock() -> int | None:
    """The lock a new database's first server holds until it answers (waiting for another
    command's first server to finish making it), or None where the database is made."""
    import fcntl

    home = prefect_home()
    if (home / DATABASE_READY).exists():
        return None
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / FIRST_SERVER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if (home / DATABASE_READY).exists():  # made by the server this command waited for
        os.close(fd)
        return None
    return fd


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_early: LocalServer | None = None
_api_set_here = False  # PREFECT_API_URL set by launch_early (a kept server's), for stop_early


def launch_early() -> None:
    """Find the Prefect API a command that runs a flow uses (see the module), before it imports
    its flow: check that ``PREFECT_API_URL`` answers; else point ``PREFECT_API_URL`` at the
    server of ``fairpipe server start``; else launch this command's own server now."""
    global _early, _api_set_here
    given = os.environ.get("PREFECT_API_URL")
    if given:
        check_api(given)
        return
    kept = kept_server()
    if kept is not None:
        check_api(kept.url, KEPT_SILENT.format(pid=kept.pid, url=kept.url, why="{why}"))
        os.environ["PREFECT_API_URL"] = kept.url
        _api_set_here = True
        return
    if _early is None:
        _early = LocalServer()
        _early.launch()


def adopt_early() -> LocalServer | None:
    """The server :func:`launch_early` launched, now the caller's to stop (None if none)."""
    global _early
    server, _early = _early, None
    return server


def stop_early() -> None:
    """Stop a server launched early that no flow adopted (the command failed before), and forget
    the kept server's address :func:`launch_early` set."""
    global _api_set_here
    if _api_set_here:
        os.environ.pop("PREFECT_API_URL", None)
        _api_set_here = False
    server = adopt_early()
    if server is not None:
        server.stop()


# -- the user's API --------------------------------------------------------------------------------
API_SILENT = (
    "PREFECT_API_URL is {url}, which does not answer ({why}). Start the Prefect server it names, "
    "or unset PREFECT_API_URL: fairpipe then uses the server of 'fairpipe server start', or "
    "runs one for the command."
)
KEPT_SILENT = (
    "The Prefect server of 'fairpipe server start' (pid {pid}) does not answer at {url} ({why}); "
    "run 'fairpipe server stop', then 'fairpipe server start' again."
)
API_TIMEOUT_SECONDS = 3.0


def check_api(url: str, message: str = API_SILENT, timeout: float = API_TIMEOUT_SECONDS) -> None:
    """Raise a FairpipeInputError (``message``) unless the Prefect API at ``url`` answers within
    ``timeout`` seconds. Any HTTP answer counts (an API that wants a key answers 401): only a
    server that cannot be reached, or an address that is not one, is refused."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout):
            return
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise FairpipeInputError(message.format(url=url, why=why)) from None


# -- the server the user keeps running: fairpipe server start | stop | status ---------------------
PID_FILE = "fairpipe-server.pid"
LOG_FILE = "fairpipe-server.log"
LOCK_FILE = "fairpipe-server.lock"
NOT_RUNNING = "No Prefect server of 'fairpipe server start' runs (no live pid file at {path})."
ALREADY_RUNNING = (
    "A Prefect server of 'fairpipe server start' already runs at {url} (pid {pid}); "
    "'fairpipe server stop' stops it."
)
PORT_IN_USE = (
    "The --port option of fairpipe server start must be a free port. Got {port}: it is in use."
)
DID_NOT_START = "The Prefect server exited with code {code} while starting; its log is {log}."
START_TIMEOUT = (
    "The Prefect server did not answer at {url} within {timeout:.0f} s; its log is {log}."
)


@dataclass(frozen=True)
class KeptServer:
    """A Prefect server started by ``fairpipe server start`` (Prefect's own ``prefect server
    start``, in its own session): its process, API address and log file."""

    pid: int
    url: str
    log: str

    @property
    def ui_url(self) -> str:
        return self.url.removesuffix("/api")


def prefect_home() -> Path:
    """Prefect's home folder, as Prefect resolves it (``PREFECT_HOME``, default ``~/.prefect``),
    without importing Prefect."""
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()


def pid_file() -> Path:
    return prefect_home() / PID_FILE


def kept_server() -> KeptServer | None:
    """The server of ``fairpipe server start`` if its pid file names a live Prefect server."""
    from fairpipe.jsontext import parse_json

    try:
        record = parse_json(pid_file().read_bytes(), max_bytes=64 * 1024)
        server = KeptServer(int(record["pid"]), str(record["url"]), str(record["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return server if _is_prefect_server(server.pid) else None


def _is_prefect_server(pid: int) -> bool:
    """Whether ``pid`` is a live ``prefect server start`` (not a process that reused the pid)."""
    import psutil

    try:
        command_line = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return False
    return "prefect" in command_line and "server" in command_line


def start_kept_server(port: int | None = None) -> KeptServer:
    """Start ``prefect server start`` in its own session on ``port`` (default: a free one) of
    127.0.0.1, record it in the pid file and wait until it answers. It outlives this process:
    :func:`stop_kept_server` stops it."""
    with _start_stop_lock():
        return _start_kept_server(port)


@contextlib.contextmanager
def _start_stop_lock():
    """One ``fairpipe server start`` or ``stop`` at a time per PREFECT_HOME: a second start at
    the same moment waits for the first, then finds its server running (the pid file is written
    only once the server answers)."""
    import fcntl

    check_prefect_home()
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _start_kept_server(port: int | None) -> KeptServer:
    import json

    running = kept_server()
    if running is not None:
        raise FairpipeInputError(ALREADY_RUNNING.format(url=running.url, pid=running.pid))
    if port is not None and not _port_free(port):
        raise FairpipeInputError(PORT_IN_USE.format(port=port))
    home = prefect_home()
    record = pid_file()
    record.unlink(missing_ok=True)  # a stale one: its server is gone
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = home / LOG_FILE
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    first = _first_server_lock()  # a new database: made by this server alone
    # Spawned, not a Popen: it outlives this process, which does not wait for it.
    pid = os.posix_spawn(
        sys.executable,
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
         str(port)],
        env,
        file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                      (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                       0o600),
                      (os.POSIX_SPAWN_DUP2, 1, 2)],
        setsid=True,  # its own session: a Ctrl-C at the terminal does not reach it
    )  # fmt: skip
    server = KeptServer(pid, url, str(log))
    try:
        _wait_started(server)
        if first is not None:  # its database is made: other servers may start on it
            (home / DATABASE_READY).touch()
    except BaseException:
        _end(pid)
        raise
    finally:
        if first is not None:
            os.close(first)  # releases the lock
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as fh:
        json.dump({"pid": server.pid, "url": server.url, "log": server.log}, fh)
    return server


def _wait_started(server: KeptServer) -> None:
    timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 90))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status = os.waitpid(server.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            raise RuntimeError(DID_NOT_START.format(code=code, log=server.log))
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        time.sleep(0.1)
    raise RuntimeError(START_TIMEOUT.format(url=server.url, timeout=timeout, log=server.log))


def stop_kept_server() -> KeptServer:
    """Stop the server of ``fairpipe server start`` and remove its pid file."""
    with _start_stop_lock():
        return _stop_kept_server()


def _stop_kept_server() -> KeptServer:
    server = kept_server()
    record = pid_file()
    if server is None:
        record.unlink(missing_ok=True)  # a stale one
        raise FairpipeInputError(NOT_RUNNING.format(path=record))
    _end(server.pid)
    record.unlink(missing_ok=True)
    return server


def _end(pid: int, grace: float = 10.0) -> None:
    """SIGTERM ``pid``, and SIGKILL it if it has not ended within ``grace`` seconds."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        process = psutil.Process(pid)
        process.terminate()
        try:
            process.wait(timeout=grace)
        except psutil.TimeoutExpired:
            process.kill()
            process.wait(timeout=grace)


def _port_free(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
