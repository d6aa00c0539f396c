"""What a flow run costs beyond its work: one-id forgets, with and without Prefect's flow-run
heartbeats, measured in the same run.

Prefect 3.8 sends a flow run's heartbeats from a thread that sleeps in 1-second steps, and the
end of the run joins that thread: the run waits up to a second after its work. fairpipe's
commands run their flow without heartbeats (``fairpipe.flows.prefect_api.no_exit_heartbeat_wait``) unless
``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` is set; setting it gives the baseline (Prefect's default).

A store of the built-in ``gaussian`` data (n rows x d dims) is ingested, then one-id forgets
alternate between the two settings (``--runs`` each), in one process holding one Prefect server
(as a long-lived Python user, or a worker, runs flows): each call's wall time against the time
the flow reports for its own work.

Run: .venv/bin/python benchmarks/bench_flow_overhead.py [--n 100000] [--d 32] [--runs 6]
(about a minute at the defaults).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fairpipe.flows  # noqa: E402,F401  (environment defaults)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--runs", type=int, default=6)
    a = ap.parse_args()
    from fairpipe.flows.forget import run_forget
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import IngestOptions
    from fairpipe.flows.prefect_api import HEARTBEAT_VARIABLES, prefect_api

    HEARTBEAT = HEARTBEAT_VARIABLES[0]

    os.environ.pop(HEARTBEAT, None)
    settings = {"heartbeats (Prefect's default)": "180", "no heartbeats (fairpipe)": None}
    got: dict[str, list[tuple[float, float]]] = {label: [] for label in settings}
    with tempfile.TemporaryDirectory() as tmp, prefect_api():
        store = str(Path(tmp) / "store")
        run_ingest("gaussian", store, IngestOptions(gaussian={"n": a.n, "d": a.d, "seed": 1}))
        run_forget(store, [0])  # the first flow run in a process pays its imports
        for r in range(a.runs):
            for i, (label, value) in enumerate(settings.items()):
                if value is None:
                    os.environ.pop(HEARTBEAT, None)
                else:
                    os.environ[HEARTBEAT] = value
                t0 = time.perf_counter()
                res = run_forget(store, [1 + 2 * r + i])
                got[label].append((time.perf_counter() - t0, res["timings"]["total"]))
                print(f"  {label}: {got[label][-1][0]:.3f} s", flush=True)
        os.environ.pop(HEARTBEAT, None)
    print(f"\none-id forget, n={a.n:,} x {a.d}, median of {a.runs} runs each")
    print(f"{'setting':34} {'call s':>8} {'in-flow s':>10} {'beyond the work s':>18}")
    medians = {}
    for label, runs in got.items():
        wall = statistics.median(w for w, _ in runs)
        work = statistics.median(f for _, f in runs)
        medians[label] = wall
        print(f"{label:34} {wall:8.3f} {work:10.3f} {wall - work:18.3f}")
    base, now = medians.values()
    print(f"ratio (fairpipe / baseline): {now / base:.2f}x")


if __name__ == "__main__":
    main()
