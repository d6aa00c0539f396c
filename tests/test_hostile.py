"""Hostile conditions, end to end through the ``fairpipe`` program (each command a process of its
own, as users run it): concurrent creators of one store, producers and appends during a drain,
and signals (SIGKILL to the process group, SIGTERM, Ctrl-C's SIGINT to the group) at random
moments of an ingest and of a drain; after each, a rerun ends in the state of a run that was
never interrupted, and nothing of the command is left running.

The malformed queue objects, corrupt chunks, bad input and identifiers outside the store have
tests of their own beside the code they exercise (tests/storage/test_queue.py,
tests/storage/test_integrity.py, tests/cli/, tests/storage/test_store_files.py);
benchmarks/bench_hostile.py runs many more random faults than fit in a test run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairpipe.flows.fit import run_fit
from fairpipe.flows.options import FitOptions, SummarizeOptions
from fairpipe.flows.summarize import run_summarize
from fairpipe.storage.erasure import files_holding, row_needles
from fairpipe.storage.queue import file_request, pending
from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.store import FairpipeStore
from tests.flows.test_deploy import stored_objects

BIN = Path(sys.executable).parent
N, D = 3000, 8
INGEST = ["--id-column", "id", "--group-column", "group", "--n-tables", "10",
          "--chunk-rows", "512", "--seed", "4", "--workers", "1"]  # fmt: skip
DRAIN = ["--max-batch", "3", "--workers", "1"]
rng = np.random.default_rng(33)  # the moments of the signals: the same in every run


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def env(prefect_server, work) -> dict:
    """The commands' environment: the session's Prefect server, a cache folder of their own."""
    return {**os.environ, "PREFECT_API_URL": prefect_server, "XDG_CACHE_HOME": str(work / "cache")}


@pytest.fixture(scope="module")
def source(work) -> Path:
    g = np.random.default_rng(0)
    frame = pd.DataFrame(
        g.normal(size=(N, D)).astype(np.float32), columns=[f"x{i}" for i in range(D)]
    )
    frame.insert(0, "id", g.permutation(10 * N)[:N] + 100_000)
    frame["group"] = g.choice(["a", "b", "c"], size=N)
    frame.to_csv(work / "people.csv", index=False)
    return work / "people.csv"


def start(*args, env: dict) -> subprocess.Popen:
    """A ``fairpipe`` command in a process group of its own (its cluster's workers with it)."""
    return subprocess.Popen([str(BIN / "fairpipe"), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def run(*args, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "fairpipe"), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def interrupt(proc: subprocess.Popen, sig: signal.Signals, after: float) -> int:
    """Send ``sig`` after ``after`` seconds, as it arrives in the field: SIGKILL and SIGINT (a
    Ctrl-C) to the whole process group, SIGTERM to the command. Returns its exit code; checks
    that nothing of the group is left running."""
    try:
        proc.wait(timeout=after)
        return proc.returncode  # it ended first
    except subprocess.TimeoutExpired:
        pass
    if sig == signal.SIGTERM:
        proc.send_signal(sig)
    else:
        os.killpg(proc.pid, sig)
    proc.communicate(timeout=120)
    deadline = time.monotonic() + 15
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(proc.pid), f"processes of the command were left after {sig.name}"
    return proc.returncode


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def receipts(store) -> list[tuple]:
    got = read_receipts(FairpipeStore.open(str(store)).readonly_session())
    return sorted((r["request"], r["n_ids"], tuple(r["not_found"]), r["commit"] is not None,
                   r["erased_at"] is not None) for r in got)  # fmt: skip


# -- concurrency -----------------------------------------------------------------------------------
def test_concurrent_ingests_into_one_new_folder_make_one_complete_store(env, source, work):
    store = work / "raced" / "store"
    procs = [start("ingest", source, "--store", store, *INGEST, env=env) for _ in range(3)]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    # One makes the store; the others find it busy (exit 3), or, if they reach it only after its
    # commit, append nothing: their ids are there (exit 2).
    assert sorted(code for code, _, _ in outs)[0] == 0 and [c for c, _, _ in outs].count(0) == 1
    for code, out, err in outs:
        if code == 0:
            continue
        assert out == "" and len(err.splitlines()) == 1, outs
        busy = code == 3 and err.startswith(f"error: Store {store}")
        assert busy or (code == 2 and "is already in the store" in err), outs
    st = FairpipeStore.open(str(store))
    assert st.attrs()["n"] == N and int(st.read("alive").sum()) == N


@pytest.fixture(scope="module")
def reference_ingest(env, source, work) -> tuple[Path, float]:
    store = work / "ingested"
    t0 = time.monotonic()
    out = run("ingest", source, "--store", store, *INGEST, env=env)
    assert out.returncode == 0, out.stderr
    return store, time.monotonic() - t0


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_an_ingest_interrupted_then_rerun_equals_one_never_interrupted(
    env, source, work, reference_ingest, sig
):
    reference, seconds = reference_ingest
    store = work / f"ingest-{sig.name}" / "store"
    code = interrupt(start("ingest", source, "--store", store, *INGEST, env=env), sig,
                     after=float(rng.uniform(0.3, seconds)))  # fmt: skip
    # 130: interrupted and cleaned up; -9, or -2/-15 when the signal came before the command
    # could handle it (while Python starts).
    assert code in (0, 130, -signal.SIGKILL, -signal.SIGINT, -signal.SIGTERM), code
    if code == 130:  # an interrupted creation removes the store it was making
        assert not store.exists() or (store / "refs" / "branch.main").exists(), [
            str(p.relative_to(store)) for p in store.rglob("*")
        ]
    rerun = run("ingest", source, "--store", store, *INGEST, env=env)
    # Done before the signal: the rerun is an append of ids the store holds, refused.
    assert rerun.returncode == 0 or "already in the store" in rerun.stderr, rerun.stderr
    assert stored_objects(store) == stored_objects(reference)
    assert os.listdir(store.parent) == ["store"]  # nothing beside it (an ingest's staging)
    assert not [p for p in os.listdir(store) if p.startswith(".fairpipe-staging")]


@pytest.fixture(scope="module")
def queued(prefect_server, source, work) -> tuple[Path, list[bytes]]:
    """A fitted and summarized store with 12 deletion requests of 3 ids (some unknown) filed."""
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import IngestOptions

    base = work / "queued"
    threads = dict(n_workers=1, processes=False)
    run_ingest(str(source), str(base), IngestOptions(id_column="id", group_column="group",
                                                     n_tables=10, chunk_rows=512, seed=4),
               **threads)  # fmt: skip
    run_fit(str(base), FitOptions(n_clusters=6, height=2), **threads)
    run_summarize(
        str(base), SummarizeOptions(k=8, lower=0.1, upper=0.6, fanout=16, height=2), **threads
    )
    ids = FairpipeStore.open(str(base)).read("ids")
    gone = np.random.default_rng(1).choice(ids, size=36, replace=False)
    for j in range(12):
        part = gone[3 * j : 3 * j + 3]
        file_request(str(base), np.r_[part, [7 + j]] if j % 4 == 0 else part, f"request {j}")
    needles = row_needles(str(base), np.flatnonzero(np.isin(ids, gone))[:12])
    return base, needles


@pytest.fixture(scope="module")
def reference_drain(env, queued, work) -> tuple[Path, float]:
    base, _ = queued
    store = work / "drained"
    shutil.copytree(base, store)
    t0 = time.monotonic()
    out = run("forget", "--store", store, *DRAIN, env=env)
    assert out.returncode == 0, out.stderr
    return store, time.monotonic() - t0


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_a_drain_interrupted_then_rerun_equals_one_never_interrupted(
    env, queued, work, reference_drain, sig
):
    base, needles = queued
    reference, seconds = reference_drain
    store = work / f"drain-{sig.name}"
    shutil.copytree(base, store)
    code = interrupt(start("forget", "--store", store, *DRAIN, env=env), sig,
                     after=float(rng.uniform(0.3, seconds)))  # fmt: skip
    assert code in (0, 130, -signal.SIGKILL, -signal.SIGINT, -signal.SIGTERM), code
    rerun = run("forget", "--store", store, *DRAIN, env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert receipts(store) == receipts(reference) and len(receipts(store)) == 12
    assert pending(str(store)) == []
    assert stored_objects(store) == stored_objects(reference)
    assert files_holding(store, needles) == []


def test_producers_and_an_append_during_a_drain_lose_nothing(env, queued, source, work):
    """Requests filed while a drain runs are applied by it or the next, each once; an append
    waiting for the drain's lock (--lock-timeout) lands after it; the artifacts stay current."""
    base, _ = queued
    store = work / "busy"
    shutil.copytree(base, store)
    extra = work / "extra.csv"
    frame = pd.read_csv(source).head(200)
    frame["id"] += 10_000_000
    frame.to_csv(extra, index=False)
    drain = start("forget", "--store", store, *DRAIN, "--lock-timeout", "240", env=env)
    filed: list[str] = []

    def produce(k: int) -> None:
        for j in range(3):
            filed.append(file_request(str(store), np.array([50_000 + 10 * k + j])).request_id)
            time.sleep(0.05)

    producers = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in producers:
        t.start()
    append = start("ingest", extra, "--store", store, "--id-column", "id", "--group-column",
                   "group", "--workers", "1", "--lock-timeout", "240", env=env)  # fmt: skip
    for t in producers:
        t.join()
    assert drain.wait(timeout=300) == 0, drain.communicate()
    assert append.wait(timeout=300) == 0, append.communicate()
    final = run("forget", "--store", store, *DRAIN, env=env)
    assert final.returncode == 0, final.stderr
    got = [r[0] for r in receipts(store)]
    assert len(got) == len(set(got)) == 12 + len(filed) and set(filed) <= set(got)
    assert pending(str(store)) == []
    s = json.loads(run("status", "--store", store, "--json", env=env).stdout)
    assert s["n"] == N + 200 and all(a["current"] for a in s["artifacts"].values()), s
