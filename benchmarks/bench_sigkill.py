"""Reliability of the drain: SIGKILL its whole process group at random moments, rerun, and check
that every request was applied exactly once and the store equals an uninterrupted run's.

A store of the built-in ``gaussian`` data is ingested, fitted (DC-k-means) and summarized; a
queue of ``--requests`` deletion requests (some ids unknown) is filed beside it. Two copies are
drained with ``fairpipe forget --max-batch B``: the reference without interruption; the other
started in a new process group and killed (SIGKILL to the group: the command, its Dask workers
and its Prefect server) after a random delay, ``--kills`` times, then run to the end. Checked:
each request has exactly one receipt with the same counts; nothing is left pending; every
object of ``main`` (metadata and chunks of every array, receipts aside: they hold times) is
byte-identical to the reference's; and no file of the store holds an erased row's bytes.

Run: .venv/bin/python benchmarks/bench_sigkill.py [--kills 50] [--n 20000] [--requests 300]
(about 10 minutes at the defaults: 100 batches of one request). Prints a table, and one JSON line (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent


def fairpipe(*args, env, check=True) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN / "fairpipe"), *map(str, args)], env=env, capture_output=True,
                         text=True)  # fmt: skip
    if check and out.returncode != 0:
        raise SystemExit(f"fairpipe {args[0]} failed ({out.returncode}): {out.stderr}")
    return out


def drain_argv(store: Path, batch: int) -> list[str]:
    return [str(BIN / "fairpipe"), "forget", "--store", str(store), "--max-batch", str(batch),
            "--workers", "1", "--json"]  # fmt: skip


def build_base(base: Path, n: int, env: dict) -> None:
    """Ingest, fit and summarize in this process (threads: quicker than three commands)."""
    os.environ["PREFECT_HOME"] = env["PREFECT_HOME"]
    from fairpipe.flows.fit import run_fit
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import FitOptions, IngestOptions, SummarizeOptions
    from fairpipe.flows.prefect_api import prefect_api
    from fairpipe.flows.summarize import run_summarize

    threads = dict(n_workers=1, processes=False)
    with prefect_api():
        run_ingest("gaussian", str(base), IngestOptions(gaussian={"n": n, "d": 8}, n_tables=10,
                                                        chunk_rows=2048), **threads)  # fmt: skip
        run_fit(str(base), FitOptions(k=8), **threads)
        run_summarize(str(base), SummarizeOptions(k=10, lower=0.1, upper=0.6), **threads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--batch", type=int, default=3, help="ids per batch (--max-batch)")
    ap.add_argument("--max-delay", type=float, default=12.0, help="seconds before a kill, at most")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    a = ap.parse_args()

    from fairpipe.storage.erasure import files_holding, row_needles
    from fairpipe.storage.queue import file_request, pending
    from fairpipe.storage.receipts import read_receipts
    from fairpipe.storage.store import FairpipeStore
    from tests.flows.test_deploy import stored_objects

    rng = np.random.default_rng(a.seed)
    work = Path(tempfile.mkdtemp(prefix="fairpipe-sigkill-"))
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home")}
    env.pop("PREFECT_API_URL", None)  # each command runs its own server, killed with it
    base = work / "base"
    t0 = time.perf_counter()
    build_base(base, a.n, env)
    ids = FairpipeStore.open(str(base)).read("ids")
    gone = rng.choice(ids, size=a.requests * 3, replace=False)
    for j in range(a.requests):
        part = (
            np.r_[gone[3 * j : 3 * j + 3], [10**9 + j]] if j % 5 == 0 else gone[3 * j : 3 * j + 3]
        )
        file_request(str(base), part, f"request {j}")
    erased_rows = np.flatnonzero(np.isin(ids, gone))
    needles = row_needles(str(base), erased_rows[:50])  # their points and sketch rows
    setup = time.perf_counter() - t0
    ref, crashed = work / "reference", work / "crashed"
    shutil.copytree(base, ref)
    shutil.copytree(base, crashed)

    t0 = time.perf_counter()
    fairpipe(*drain_argv(ref, a.batch)[1:], env=env)
    t_ref = time.perf_counter() - t0

    kills, progressed, finished_early = 0, 0, 0
    t0 = time.perf_counter()
    while kills < a.kills:
        before = len(pending(str(crashed)))
        proc = subprocess.Popen(drain_argv(crashed, a.batch), env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            proc.wait(timeout=float(rng.uniform(0.2, a.max_delay)))
            finished_early += 1  # it ended before the kill: nothing left to interrupt
            if before == 0:
                break
            continue
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            progressed += len(pending(str(crashed))) < before
        print(f"kill {kills}/{a.kills}: {len(pending(str(crashed)))} requests pending",
              file=sys.stderr)  # fmt: skip
    fairpipe(*drain_argv(crashed, a.batch)[1:], env=env)
    t_kill = time.perf_counter() - t0

    def receipts(store: Path) -> list[tuple]:
        got = read_receipts(FairpipeStore.open(str(store)).readonly_session())
        return sorted((r["request"], r["n_ids"], tuple(r["not_found"]), r["commit"] is not None,
                       r["erased_at"] is not None) for r in got)  # fmt: skip

    r_ref, r_crash = receipts(ref), receipts(crashed)
    once = len({r[0] for r in r_crash}) == len(r_crash) == a.requests
    a_ref, a_crash = stored_objects(ref), stored_objects(crashed)
    differing = sorted(k for k in a_ref.keys() | a_crash.keys() if a_ref.get(k) != a_crash.get(k))
    leaks = files_holding(crashed, needles)
    result = {
        "n": a.n, "requests": a.requests, "batch": a.batch, "kills": kills,
        "kills_after_progress": progressed, "runs_that_finished_first": finished_early,
        "each_request_once": once, "receipts_equal": r_ref == r_crash,
        "pending_left": len(pending(str(crashed))), "objects_compared": len(a_ref),
        "objects_differing": differing[:10], "erased_bytes_found": leaks[:10],
        "seconds": {"setup": setup, "reference_drain": t_ref, "killed_drains": t_kill},
    }  # fmt: skip
    ok = once and r_ref == r_crash and not differing and not leaks and result["pending_left"] == 0
    result["ok"] = ok
    rows = [
        ("kills (SIGKILL to the process group)", kills),
        ("  of which after a batch committed", progressed),
        ("runs that finished before their kill", finished_early),
        ("each request applied exactly once", once),
        ("receipts equal the reference's", r_ref == r_crash),
        ("objects of main compared / differing", f"{len(a_ref)} / {len(differing)}"),
        ("files holding an erased row's bytes", len(leaks)),
        ("reference drain (s)", f"{t_ref:.1f}"),
        ("killed drains, all (s)", f"{t_kill:.1f}"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if a.json:
        print(json.dumps(result))
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
