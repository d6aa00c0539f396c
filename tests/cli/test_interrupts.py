"""A SIGTERM (a scheduler stopping the job, ``kill``) or a Ctrl-C (SIGINT to the terminal's
process group) of a command that runs a flow stops everything the command started: its own
Prefect server (in a session of its own, which a Ctrl-C does not reach) and its cluster's
processes. Each kind of command, through the ``fairpipe`` program, without PREFECT_API_URL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

FAIRPIPE = str(Path(sys.executable).parent / "fairpipe")
SERVER = "prefect.server.api.server:create_app"


def descendants(pid: int) -> dict[int, str]:
    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in found:
        try:
            out[p.pid] = " ".join(p.cmdline())
        except psutil.Error:
            continue
    return out


def server_answers(command_line: str) -> bool:
    """Whether ``command_line`` is a Prefect server's that answers on its ``--port``."""
    import urllib.request

    if SERVER not in command_line:
        return False
    port = command_line.split("--port", 1)[1].split()[0]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1):
            return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def stores(digits_store, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("interrupted")
    for name in ("fit", "summarize", "forget", "backfill"):
        shutil.copytree(digits_store[0], folder / name)
    (folder / "backlog.txt").write_text("\n".join(map(str, range(200, 290))) + "\n")
    return folder


# (the command line, the signal and to whom: the command, or its process group as a Ctrl-C;
# the seconds after its server answers when it is interrupted, unless its cluster is up before)
CASES = {
    "ingest": (["ingest", "digits", "--store", "{folder}/new"], signal.SIGINT, 2.0),
    "fit": (["fit", "--store", "{folder}/fit", "--n-clusters", "5", "--n-init", "50", "--max-iter",
             "100"], signal.SIGTERM, 0.3),
    "summarize": (["summarize", "--store", "{folder}/summarize", "--k", "40", "--lower", "0",
                   "--height", "3"], signal.SIGTERM, 0.3),
    "forget": (["forget", "--store", "{folder}/forget", "--ids", ",".join(map(str, range(90))),
                "--max-batch", "3"], signal.SIGTERM, 0.3),  # 30 batches, a commit each
    "backfill": (["backfill", "--store", "{folder}/backfill", "--ids-file",
                  "{folder}/backlog.txt", "--batch-size", "3"], signal.SIGINT, 0.3),
}  # fmt: skip


@pytest.mark.parametrize("kind", CASES)
def test_an_interrupted_command_leaves_nothing_it_started_running(kind, stores, tmp_path):
    line, sig, delay = CASES[kind]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    args = [a.format(folder=stores) for a in line] + ["--workers", "1"]
    proc = subprocess.Popen([FAIRPIPE, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    started: dict[int, str] = {}
    answered = None
    deadline = time.monotonic() + 120
    # Mid-run: its cluster's worker is up, or its flow has run ``delay`` s since its server
    # answered.
    while proc.poll() is None and time.monotonic() < deadline:
        started.update(descendants(proc.pid))
        if answered is None and any(map(server_answers, started.values())):
            answered = time.monotonic()
        workers = [c for c in started.values() if "multiprocessing" in c or "distributed" in c]
        if workers or (answered is not None and time.monotonic() - answered > delay):
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"{kind} ended before it was interrupted: {proc.stderr.read()}"
    assert any(SERVER in c for c in started.values()), started
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # a Ctrl-C: the terminal's process group
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().endswith(f"fairpipe {kind}: interrupted"), err
    # Prefect's, Dask's and Python's own noise stays out of the command's stderr (--verbose)
    noise = ("Traceback", "EventsWorker", "WARNING", "Warning", "prefect", "distributed")
    assert not [line for line in err.splitlines() if any(n in line for n in noise)], err
    deadline = time.monotonic() + 15
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {p: c for p, c in started.items() if alive(p)}
    assert left == {}, f"fairpipe {kind} left running after {sig.name}: {left}"
    # The store is whole at a commit: every chunk checks, no writer's lock or staging left.
    store = Path(args[args.index("--store") + 1])
    if store.exists():
        from typer.testing import CliRunner

        from fairpipe.flows.cli import app

        verified = CliRunner().invoke(app, ["verify", "--store", str(store)])
        assert verified.exit_code == 0, verified.output
        from fairpipe.storage.staging import stale_staging

        assert stale_staging(store) == []


def test_an_interrupt_swallowed_in_a_c_callback_is_raised_in_the_main_thread_later(
    monkeypatch, capsys
):
    """An interrupt that a C callback (numba's compiler, a finalizer) cannot raise reaches the
    unraisable hook: raised again in the main thread at its next step, never inside the hook
    (whose exception Python would only print, as 'Exception ignored in sys.unraisablehook')."""
    from fairpipe.flows import cli
    from fairpipe.flows.cli._runner import PROGRAM

    class InterruptedFinalizer:
        def __del__(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(sys, "unraisablehook", cli._unraisable)
    previous = signal.signal(signal.SIGINT, cli._interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            finalized = InterruptedFinalizer()
            del finalized  # its KeyboardInterrupt cannot propagate from __del__
            for _ in range(500):
                time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)
        PROGRAM.interrupted = False
    assert "Exception ignored" not in capsys.readouterr().err
