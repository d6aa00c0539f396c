"""Nothing identifying a person outside the store, where erasure cannot reach it, and nothing a
producer wrote acting on the terminal.

Commands run against a Prefect server of their own (its own PREFECT_HOME) and their own cache
folder: ids are forgotten with a reason, commands fail on purpose with errors that name ids
(a clashing id, unknown ids, a bug carrying an id, in a flow and in a task), then every file under
PREFECT_HOME (the database's bytes and its text) and the cache folder is searched for the ids
and the reason. The same search follows a drain through the forget-drain deployment (``prefect
deploy``, ``prefect worker start --run-once``), its worker's output searched too.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fairpipe.flows.forget
import fairpipe.flows.ingest
from fairpipe.flows.cli import app

runner = CliRunner()

# Distinctive ids, so that finding one anywhere means it leaked (Prefect's own tables hold
# example numbers such as 123456789).
BASE = 918_273_000
CLASHING = BASE + 645  # a row of the store, ingested again
FORGOTTEN = (BASE + 7, BASE + 11)
UNKNOWN = 564_738_291  # never in the store
IN_A_BUG = 736_251_849  # carried by an internal error's message
DRAINED = (BASE + 51, BASE + 53)  # forgotten through the forget-drain deployment
REASON = "Erasure asked by Zorblax Quuxington"
NASTY_REASON = "first line\nsecond\x1b[2J line [bold]marked[/bold] \u202eevil"
SECRETS = [str(i) for i in (CLASHING, *FORGOTTEN, *DRAINED, UNKNOWN, IN_A_BUG)]
SECRETS += [REASON, "Zorblax"]


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def own_prefect(prefect_server, tmp_path_factory):
    """A Prefect server with its own PREFECT_HOME (its database a copy of the session's, so it
    starts without migrations), and a cache folder of its own, used by this module's commands."""
    import prefect.settings
    from prefect.events.worker import EventsWorker

    from fairpipe.flows.prefect_server import LocalServer, deliver_records

    home = tmp_path_factory.mktemp("own-prefect-home")
    cache = tmp_path_factory.mktemp("own-cache")
    session_db = Path(prefect.settings.PREFECT_HOME.value()) / "prefect.db"
    if session_db.exists():
        with sqlite3.connect(session_db) as src, sqlite3.connect(home / "prefect.db") as dst:
            src.backup(dst)
    assert not found_in(home, SECRETS), "the copied database must not hold the ids already"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_HOME", str(home))
        mp.delenv("PREFECT_API_URL", raising=False)
        server = LocalServer()
        server.launch()
        server.wait()
        mp.setenv("PREFECT_API_URL", server.api_url)
        mp.setenv("XDG_CACHE_HOME", str(cache))
        mp.delenv("FAIRPIPE_DEBUG", raising=False)
        updates = {
            prefect.settings.PREFECT_API_URL: server.api_url,
            prefect.settings.PREFECT_HOME: home,
            prefect.settings.PREFECT_LOCAL_STORAGE_PATH: home / "storage",
        }
        try:
            with prefect.settings.temporary_settings(updates=updates):
                yield home, cache
                deliver_records(logs_only=True)
                EventsWorker.drain_all(timeout=5)
        finally:
            server.stop()


@pytest.fixture(scope="module")
def store(own_prefect, dask_address, tmp_path_factory):
    """A store of 200 rows with the distinctive ids, ingested by the command line."""
    folder = tmp_path_factory.mktemp("privacy")
    rng = np.random.default_rng(0)
    ids = BASE + np.arange(200) * 2 + 1
    ids[0] = CLASHING  # the first id of the file: the one a second ingest names
    lines = ["id,group,a,b,c"] + [
        f"{i},g{i % 2},{x[0]},{x[1]},{x[2]}" for i, x in zip(ids, rng.normal(size=(200, 3)))
    ]
    (folder / "people.csv").write_text("\n".join(lines) + "\n")
    path = folder / "store"
    out = invoke("ingest", folder / "people.csv", "--store", path, "--id-column", "id",
                 "--group-column", "group", "--n-hashes", 4, "--n-tables", 4, "--dask-address",
                 dask_address)  # fmt: skip
    assert out.exit_code == 0, out.output
    return folder, path


def test_no_id_or_reason_reaches_prefect_or_a_bug_report(own_prefect, store, dask_address,
                                                         monkeypatch):  # fmt: skip
    home, cache = own_prefect
    folder, path = store
    cluster = ["--dask-address", dask_address]
    # Bad input naming an id: the user sees the id, in one line.
    clash = invoke("ingest", folder / "people.csv", "--store", path, "--id-column", "id",
                   "--group-column", "group", *cluster)  # fmt: skip
    assert clash.exit_code == 2 and f"Id {CLASHING} of people.csv" in clash.stderr
    unknown = invoke("forget", "--store", path, "--ids", UNKNOWN, *cluster)
    assert unknown.exit_code == 2 and str(UNKNOWN) in unknown.stderr
    # Ids forgotten, with a reason (kept in the receipt, in the store).
    ids = ",".join(map(str, FORGOTTEN))
    done = invoke("forget", "--store", path, "--ids", ids, "--reason", REASON, *cluster)
    assert done.exit_code == 0, done.output
    receipts = invoke("receipts", "--store", path, "--json")
    assert json.loads(receipts.stdout)["receipts"][-1]["reason"] == REASON

    # A bug carrying an id, in the flow: one line naming it, and a report that does not.
    def erase_due(*args, **kwargs):
        raise KeyError(IN_A_BUG)

    monkeypatch.setattr(fairpipe.flows.forget, "erase_due", erase_due)
    argv = ["fairpipe", "forget", "--store", str(path), f"--ids={UNKNOWN},{CLASHING}",
            "--reason", REASON]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    bug = invoke(*argv[1:], *cluster)
    assert bug.exit_code == 1
    summary, where = bug.stderr.splitlines()
    assert summary == f"fairpipe forget failed with an internal error: KeyError: {IN_A_BUG}"
    report = Path(where.removeprefix("the traceback is in ")).read_text()
    assert "command line: fairpipe forget --store" in report and "--ids=REDACTED" in report
    assert "--reason REDACTED" in report and "'reason': 'REDACTED'" in report
    assert "in erase_due" in report and report.rstrip().endswith("KeyError: <n>")

    # And in a task (the ingest's planning of its source).
    def plan_source(*args, **kwargs):
        raise ValueError(f"row of id {IN_A_BUG} is odd")

    monkeypatch.setattr(fairpipe.flows.ingest, "plan_source", plan_source)
    in_task = invoke("ingest", folder / "people.csv", "--store", path.parent / "another", "--id-column",
                     "id", "--group-column", "group", *cluster)  # fmt: skip
    assert in_task.exit_code == 1 and f"of id {IN_A_BUG} is odd" in in_task.stderr, in_task.stderr

    assert list(cache.rglob("*.txt")), "the bugs were reported in files"
    for report in cache.rglob("*.txt"):
        assert report.stat().st_mode & 0o777 == 0o600
    assert (cache / "fairpipe" / "errors").stat().st_mode & 0o777 == 0o700
    # The search finds what is there: the store's own path, a flow parameter Prefect keeps.
    assert found_in(home, [path.name])
    leaks = found_in(home, SECRETS) + found_in(cache, SECRETS)
    assert not leaks, leaks


def test_no_id_or_reason_reaches_prefect_through_the_drain_deployment(own_prefect, store,
                                                                      dask_address):  # fmt: skip
    import os

    from tests.flows.test_deploy import DEPLOY, ROOT, prefect, run_once

    home, cache = own_prefect
    _, path = store
    ids = ",".join(map(str, DRAINED))
    filed = invoke("request-deletion", "--store", path, "--ids", ids, "--reason", REASON)
    assert filed.exit_code == 0, filed.output
    env = {**os.environ, "FAIRPIPE_HOME": str(ROOT)}  # PREFECT_API_URL and _HOME: own_prefect's
    env.pop("FAIRPIPE_DASK_ADDRESS", None)
    prefect("work-pool", "create", "fairpipe", "--type", "process", "--overwrite", env=env)
    prefect("deploy", "--prefect-file", DEPLOY, "--name", "forget-drain", env=env)
    output = run_once("fairpipe-forget/forget-drain", {"store_url": str(path)}, dask_address, env)
    status = json.loads(invoke("status", "--store", path, "--json").stdout)
    assert status["pending_requests"]["count"] == 0  # the drain ran
    receipt = json.loads(invoke("receipts", "--store", path, "--json").stdout)["receipts"][-1]
    assert receipt["reason"] == REASON and receipt["n_ids"] == len(DRAINED), receipt
    assert receipt["not_found"] == [] and receipt["applied_at"], receipt
    assert "ProcessWorker" in output, output  # the worker's output, searched below
    leaks = found_in(home, SECRETS) + found_in(cache, SECRETS)
    leaks += [secret for secret in SECRETS if secret in output]
    assert not leaks, leaks


def test_a_producers_text_is_escaped_in_output(own_prefect, store, dask_address):
    _, path = store
    out = invoke("request-deletion", "--store", path, "--ids", BASE + 21, "--reason", NASTY_REASON)
    assert out.exit_code == 0, out.output
    assert invoke("forget", "--store", path, "--dask-address", dask_address).exit_code == 0
    text = invoke("receipts", "--store", path).stdout
    line = next(line for line in text.splitlines() if "reason: first" in line)
    assert line.endswith(
        "reason: first line\\nsecond\\x1b[2J line [bold]marked[/bold] \\u202eevil"
    )  # one line, the escape character shown, the markup as written, the override visible
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f\u2028\u2029\u202a-\u202e\u2066-\u2069]", text)
    as_json = invoke("receipts", "--store", path, "--json").stdout
    assert as_json.isascii() and "\\u001b[2J" in as_json and "\\u202e" in as_json
    assert json.loads(as_json)["receipts"][-1]["reason"] == NASTY_REASON


def found_in(folder: Path, needles: list[str]) -> list[str]:
    """Where any of ``needles`` occurs under ``folder``: in a file's bytes, in base64 data in it
    (Prefect's result files), or in a SQLite database's text (its tables, write-ahead log
    included)."""
    hits = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        blobs = [file.read_bytes()]
        blobs += [_b64(m) for m in re.findall(rb"[A-Za-z0-9+/=\n]{40,}", blobs[0])]
        if file.suffix == ".db":
            blobs.append(_database_text(file))
        for needle in needles:
            if any(needle.encode() in blob for blob in blobs):
                hits.append(f"{needle} in {file}")
    return hits


def _b64(data: bytes) -> bytes:
    try:
        return base64.b64decode(data.replace(b"\n", b""), validate=False)
    except (binascii.Error, ValueError):
        return b""


def _database_text(path: Path) -> bytes:
    text = []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in db.execute(f'SELECT * FROM "{table}"'):
                text.append(repr(row))
    return "\n".join(text).encode()


def test_the_search_finds_a_planted_id(tmp_path):
    """The search is not blind: an id in a database row, in base64, and in plain text is found."""
    with sqlite3.connect(tmp_path / "x.db") as db:
        db.execute("CREATE TABLE t (v TEXT)")
        db.execute("INSERT INTO t VALUES (?)", (json.dumps({"m": f"Id {UNKNOWN} of a.csv"}),))
    (tmp_path / "r").write_bytes(base64.b64encode(f"pickled {IN_A_BUG} here".encode() * 3))
    (tmp_path / "plain.txt").write_text(f"reason: {REASON}")
    hits = found_in(tmp_path, SECRETS)
    assert any(str(UNKNOWN) in h for h in hits) and any(str(IN_A_BUG) in h for h in hits)
    assert any(REASON in h for h in hits)
