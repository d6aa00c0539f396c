"""How fast the commands answer, as a user runs them: whole ``fairpipe`` processes, wall time,
each figure next to ``fairpipe --help`` measured in the same run (the floor of any command:
Python, typer and fairpipe's command line).

A store of the built-in ``gaussian`` data (``--n`` rows x ``--d`` dims, ingested once) takes the
one-id forgets, the deletion queue's commands and a bad input; a store of ``--fit-n`` rows takes
``fit`` and ``summarize``, whose figure is their wall time beyond the time their flow reports for
its own work (``timings.total``). Two settings:

- **kept server**: ``fairpipe server start`` (a Prefect server the commands find and use);
- **no server**: every command starts its own; with ``--baseline REV`` (a git revision of this
  repository, e.g. the commit before a change) each command is also run with that revision's
  code (``git archive``, imported through PYTHONPATH), alternating, on the same stores.

Targets (on the 2-core development machine, at 1M x 128): with a kept server, a one-id forget
at most 2.0 s, fit and summarize at most 1.5 s beyond their flow, status, receipts and
request-deletion at most 1.0 s, a bad input at most 1.5 s; with no server, no command slower than
the baseline. Every store lives in a temporary folder, with a PREFECT_HOME of its own.

Run: .venv/bin/python benchmarks/bench_latency.py [--n 1000000] [--d 128] [--fit-n 100000]
[--runs 3] [--baseline REV] (at 1M, the ingest takes a few minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAIRPIPE = str(Path(sys.executable).parent / "fairpipe")
TARGETS = {"forget one id": 2.0, "fit": 1.5, "summarize": 1.5, "status": 1.0, "receipts": 1.0,
           "request-deletion": 1.0, "bad input (unknown id)": 1.5}  # fmt: skip


class Runner:
    """Runs ``fairpipe`` commands with one checkout's code, in one PREFECT_HOME."""

    def __init__(self, code: Path, home: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        self.env.update(PYTHONPATH=str(code), PREFECT_HOME=str(home))

    def run(self, *args: str, ok: tuple[int, ...] = (0,)) -> tuple[float, dict | None]:
        """(wall seconds, the --json result if any)."""
        t0 = time.perf_counter()
        out = subprocess.run([FAIRPIPE, *args], env=self.env, capture_output=True, text=True,
                             timeout=3600)  # fmt: skip
        wall = time.perf_counter() - t0
        if out.returncode not in ok:
            raise SystemExit(f"fairpipe {' '.join(args)} exited {out.returncode}: {out.stderr}")
        try:
            return wall, json.loads(out.stdout)
        except ValueError:
            return wall, None


def commands(big: str, small: str, ids: Iterator[int]) -> dict:
    """Each measured command: a function of the run's number giving its arguments, whether its
    flow's own time is taken off (fit, summarize; None: a step not measured), its exit codes."""
    return {
        "fairpipe --help": (lambda r: ["--help"], False, (0,)),
        "forget one id": (lambda r: ["forget", "--store", big, "--ids", str(next(ids)), "--json"],
                          False, (0,)),
        "fit": (lambda r: ["fit", "--store", small, "--n-clusters", "8", "--height", "2",
                           "--seed", str(r), "--json"], True, (0,)),
        "summarize": (lambda r: ["summarize", "--store", small, "--k", "20", "--lower", "0",
                                 "--fanout", "16", "--height", "2", "--seed", str(r), "--json"],
                      True, (0,)),
        "status": (lambda r: ["status", "--store", big, "--json"], False, (0,)),
        "receipts": (lambda r: ["receipts", "--store", big, "--json"], False, (0,)),
        "request-deletion": (lambda r: ["request-deletion", "--store", big, "--ids",
                                        str(next(ids)), "--json"], False, (0,)),
        # (unmeasured: the request just filed drained, so that the next forget finds none)
        "drain": (lambda r: ["forget", "--store", big], None, (0,)),
        "bad input (unknown id)": (lambda r: ["forget", "--store", big, "--ids",
                                              str(10**15 + r)], False, (2,)),
    }  # fmt: skip


def measure(runners: dict[str, Runner], table: dict, runs: int) -> dict:
    """{label: {command: [seconds beyond the flow, ...]}}: every command, ``runs`` times, each
    runner in turn (so that a change of load hits them alike)."""
    got: dict[str, dict[str, list[float]]] = {
        label: {c: [] for c, (_, off_flow, _) in table.items() if off_flow is not None}
        for label in runners
    }
    for r in range(runs):
        for command, (args, off_flow, ok) in table.items():
            for label, runner in runners.items():
                wall, result = runner.run(*args(r), ok=ok)
                if off_flow is None:
                    continue
                flow = result["timings"]["total"] if off_flow and result else 0.0
                got[label][command].append(wall - flow)
                print(f"  [{label}] {command}: {wall:.2f} s"
                      + (f" ({wall - flow:.2f} s beyond its flow)" if off_flow else ""),
                      file=sys.stderr, flush=True)  # fmt: skip
    return got


def report(title: str, got: dict[str, dict[str, list[float]]], targets: bool) -> None:
    print(f"\n{title}")
    labels = list(got)
    print(f"{'command':26}" + "".join(f"{label:>22}" for label in labels)
          + (f"{'target':>10}" if targets else ""))  # fmt: skip
    for command in next(iter(got.values())):
        row = "".join(f"{statistics.median(got[label][command]):22.2f}" for label in labels)
        target = TARGETS.get(command)
        print(f"{command:26}{row}" + (f"{target:10.1f}" if targets and target else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--fit-n", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", help="a git revision to compare with, with no server")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        work = Path(tmp)
        this = Runner(ROOT, work / "prefect-home")
        big, small = str(work / "big"), str(work / "small")
        this.run("server", "start")
        try:
            for store, n in ((big, a.n), (small, a.fit_n)):
                t0 = time.perf_counter()
                this.run("ingest", "gaussian", "--gaussian-n", str(n), "--gaussian-d", str(a.d),
                         "--store", store)  # fmt: skip
                print(f"ingested {n:,} x {a.d} in {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr)  # fmt: skip
            this.run(
                "fit", "--store", small, "--n-clusters", "8", "--height", "2"
            )  # the models the forgets update
            this.run(
                "summarize",
                "--store",
                small,
                "--k",
                "20",
                "--lower",
                "0",
                "--fanout",
                "16",
                "--height",
                "2",
            )
            ids = iter(range(1, a.n, 7))
            kept = measure({"kept server": this}, commands(big, small, ids), a.runs)
        finally:
            this.run("server", "stop")
        runners = {"no server": this}
        if a.baseline is not None:
            code = work / "baseline"
            code.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", a.baseline],
                                     capture_output=True, check=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
            runners[f"{a.baseline}, no server"] = Runner(code, work / "prefect-home")
        alone = measure(runners, commands(big, small, ids), a.runs)
    print(f"\nmedian seconds of {a.runs} runs; big store {a.n:,} x {a.d}, fit and summarize "
          f"on {a.fit_n:,} x {a.d} (their seconds beyond their flow's own time)")  # fmt: skip
    report("with a kept server (fairpipe server start)", kept, targets=True)
    report("with no server (each command starts its own)", alone, targets=False)


if __name__ == "__main__":
    main()
