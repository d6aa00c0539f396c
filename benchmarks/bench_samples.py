"""Benchmarks of a store's query path: many samples of one query, a long-lived reader without
``preload()``, ``preload()``'s time and memory, and a cold ``fairpipe sample``:

    .venv/bin/python benchmarks/bench_samples.py [--store PATH | --n 200000] [--queries 20]

1. many samples (hot: ``open_reader(url).preload(r)``, the tables of the scale of the store's
   suggested radius r, in this process): 100,000 samples of one
   stored row at a time, exact sampler, exact mode, the store's suggested radius: median
   samples/s over the queries (target >= 10M/s at 1M rows), against drawing them by rejection
   from the flattened buckets (``path="flat"``) and against ``rng.choice`` on M(q) known in
   advance;
2. a long-lived reader without ``preload()`` (``open_reader(url)``, in this process): after its
   first query, the median and 90th percentile time of one query (10 samples) on rows it has
   not seen (its caches filling as it goes), and on rows it has (target <= 10 ms);
3. ``preload(r)`` in a fresh process: seconds, and its peak RSS above the process's before it,
   against the bytes of the arrays it loads (points, ids, alive, the index: target <= 1.5x)
   and against those it holds afterwards (also the row-bucket matrix it builds);
4. a cold one-query ``fairpipe sample --n-samples 10`` (a fresh process each): median wall
   seconds of five rows against ``fairpipe --help``.

Without ``--store`` it ingests ``--n`` Gaussian points (d = 128, 16 clusters, every other
option at its default) into a temporary store first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairpipe.storage.reader import open_reader  # noqa: E402

EXE = str(Path(sys.executable).with_name("fairpipe"))


def report(what: str, figure: str, baseline: str = "", ratio: str = "") -> None:
    print(f"  {what:<60} {figure:>14} {baseline:>14} {ratio:>8}", flush=True)


def query_rows(n: int, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(n, size=count, replace=False)


# -- 1. many samples, hot ---------------------------------------------------------------------------
def bench_many_samples(store: str, count: int, per_query: int = 100_000) -> None:
    reader = open_reader(store)
    reader.preload(reader.suggested_radius)
    rows = query_rows(reader.n, count + 10, seed=5)
    for r in rows[count:]:  # first calls: numpy's lazy imports, the generator's state
        reader.sample(query_rows=[int(r)], n_samples=per_query, seed=1)
    rates, flat_rates, choice_rates, hood, enumerated = [], [], [], [], 0
    rng = np.random.default_rng(0)
    for r in rows[:count]:
        t0 = time.perf_counter()
        res = reader.sample(query_rows=[int(r)], n_samples=per_query, seed=1)
        dt = time.perf_counter() - t0
        rates.append(int(res.counts[0]) / dt)
        enumerated += bool(res.stats[0].extra.get("enumerated"))
        t0 = time.perf_counter()
        res = reader.sample(query_rows=[int(r)], n_samples=per_query, seed=1, path="flat")
        flat_rates.append(int(res.counts[0]) / (time.perf_counter() - t0))
        M = reader.preload(reader.suggested_radius).neighbourhood(
            query_rows=[int(r)], radius=reader.suggested_radius
        )[0]
        hood.append(M.size)
        if M.size:  # (a row alone within r: nothing to choose from)
            t0 = time.perf_counter()
            rng.choice(M, size=per_query)
            choice_rates.append(per_query / (time.perf_counter() - t0))
    med = float(np.median(rates))
    print(f"\n[1] {per_query:,} samples of one query, hot (n={reader.n:,}; {count} stored rows, "
          f"|M(q)| {min(hood):,}-{max(hood):,}, median {int(np.median(hood)):,}; "
          f"{enumerated} of {count} enumerated)")  # fmt: skip
    report("median samples/s (target 10M/s at 1M) vs rejection (flat)", f"{med:,.0f}",
           f"{np.median(flat_rates):,.0f}", f"{med / np.median(flat_rates):.1f}x")  # fmt: skip
    report("  vs rng.choice on M(q) known in advance", f"{med:,.0f}",
           f"{np.median(choice_rates):,.0f}", f"{med / np.median(choice_rates):.2f}x")  # fmt: skip
    report("  slowest query samples/s", f"{min(rates):,.0f}")


# -- 2. a long-lived reader without preload ---------------------------------------------------------
def bench_warm_reader(store: str, n_samples: int = 10) -> None:
    reader = open_reader(store)
    rows = query_rows(reader.n, 221, seed=3)

    def timed(rs) -> np.ndarray:
        out = []
        for r in rs:
            t0 = time.perf_counter()
            reader.sample(query_rows=[int(r)], n_samples=n_samples, seed=0)
            out.append(time.perf_counter() - t0)
        return np.array(out) * 1e3

    first = timed(rows[:1])[0]
    print(f"\n[2] a long-lived reader without preload() (n={reader.n:,}, {n_samples} samples a "
          f"query; its first query {first:.0f} ms)")  # fmt: skip
    for label, rs in (("new rows 1-20", rows[1:21]), ("the same 20 again", rows[1:21]),
                      ("new rows 21-120", rows[21:121]), ("new rows 121-220", rows[121:221])):  # fmt: skip
        ms = timed(rs)
        report(f"{label}: median ms (p90)", f"{np.median(ms):.1f}",
               f"{np.percentile(ms, 90):.1f}", "10 target")  # fmt: skip
    cached = sum(seg.nbytes for seg in reader._segments.values())
    rows_cached = sum(c.nbytes for c in getattr(reader, "_rows", {}).values() if c is not None)
    report("cached after 221 queries: segments MB, rows MB", f"{cached / 2**20:,.0f}",
           f"{rows_cached / 2**20:,.0f}")  # fmt: skip


# -- 3. preload ---------------------------------------------------------------------------------------
PRELOAD = """
import json, sys, time
import numpy as np
from fairpipe.storage.reader import open_reader
# VmHWM, not getrusage's ru_maxrss: a child started by vfork (subprocess) inherits its parent's
# peak there across exec.
def rss(field="VmRSS"):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
reader = open_reader(sys.argv[1])
reader.lsh
before = rss()
t0 = time.perf_counter()
nn = reader.preload(reader.suggested_radius)  # the tables of r's scale: what queries at r read
seconds = time.perf_counter() - t0
peak = rss("VmHWM")
index = nn.index_
loaded = sum(a.nbytes for a in (nn.points_, nn.ids_, nn.alive_, index.members,
                                 index.bucket_keys, index.starts))
held = loaded + nn.point_buckets_.nbytes
print(json.dumps({"seconds": seconds, "before": before, "peak": peak, "after": rss(),
                  "loaded": loaded, "held": held}))
"""


def bench_preload(store: str) -> None:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", PRELOAD, store], capture_output=True,
                             text=True, check=True, env=env)  # fmt: skip
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    grew = max(r["peak"] for r in runs) - best["before"]
    print(f"\n[3] preload() in a fresh process (best of {len(runs)} for time, worst for memory)")
    report("seconds", f"{best['seconds']:.2f}")
    report("peak RSS growth MB vs the arrays it loads MB", f"{grew / 2**20:,.0f}",
           f"{best['loaded'] / 2**20:,.0f}", f"{grew / best['loaded']:.2f}x")  # fmt: skip
    report("  vs what it holds (with the row-bucket matrix) MB", f"{grew / 2**20:,.0f}",
           f"{best['held'] / 2**20:,.0f}", f"{grew / best['held']:.2f}x")  # fmt: skip


# -- 4. cold sample ------------------------------------------------------------------------------------
def wall(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, capture_output=True, check=True)
    return time.perf_counter() - t0


def bench_cold(store: str, n: int, runs: int = 5) -> None:
    rows = query_rows(n, runs, seed=7)
    helps, walls = [], []
    for r in rows:
        helps.append(wall([EXE, "--help"]))
        walls.append(wall([EXE, "sample", "--store", store, "--query-row", str(int(r)),
                           "--n-samples", "10", "--json"]))  # fmt: skip
    w, h = float(np.median(walls)), float(np.median(helps))
    print(f"\n[4] a cold one-query fairpipe sample (n={n:,}, {runs} rows)")
    report("median wall s (baseline: fairpipe --help)", f"{w:.2f}", f"{h:.2f}", f"{w / h:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", default=None, help="an existing store (default: ingest --n rows)")
    ap.add_argument("--n", type=int, default=200_000, help="rows to ingest without --store")
    ap.add_argument("--queries", type=int, default=20, help="queries of section 1")
    ap.add_argument("--only", default="1234", help="sections to run, e.g. 23")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store
        if store is None:
            store = f"{tmp}/store"
            env = dict(os.environ, PREFECT_HOME=f"{tmp}/prefect")
            subprocess.run([EXE, "ingest", "gaussian", "--gaussian-n", str(args.n),
                            "--gaussian-d", "128", "--gaussian-clusters", "16", "--store", store,
                            "--json"], capture_output=True, check=True, env=env)  # fmt: skip
        n = open_reader(store).n
        print(f"{'':2}{'what':<60} {'figure':>14} {'baseline':>14} {'ratio':>8}")
        if "1" in args.only:
            bench_many_samples(store, args.queries)
        if "2" in args.only:
            bench_warm_reader(store)
        if "3" in args.only:
            bench_preload(store)
        if "4" in args.only:
            bench_cold(store, n)


if __name__ == "__main__":
    main()
