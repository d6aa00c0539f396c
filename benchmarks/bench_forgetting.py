"""Forgetting in production at scale: a drain of 1,000 ids and a backfill of n/10 ids, against one
fresh build of every artifact, measured in the same run.

A store of the built-in ``gaussian`` data (n rows x d dims, 4 groups) is built: ingest (LSH index,
L tables), a DC-k-means fit and a fair summary; that build's time is the baseline. Then:

- a drain of one deletion request of 1,000 random ids (``fairpipe forget`` without ids: the
  request is filed first, as a producer would), erasure from history included;
- a backfill of n/10 random ids from a text file, in batches of ``--batch`` ids (each a commit),
  erasure from history included: its ids/s, the time of each batch, and the peak RSS of the
  flow's process and of each Dask worker.

Targets: backfill <= 1.5x the build; drain of 1,000 ids <= 1/20 of the build.
All runs share one LocalCluster with 2 worker processes and one Prefect server.

Run: .venv/bin/python benchmarks/bench_forgetting.py [--n 1000000] [--d 32] [--batch 50000]
(about 15 minutes at the defaults; --quick: n = 100,000).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "out"

import fairpipe.flows  # noqa: E402,F401  (environment defaults)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--tables", type=int, default=100)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.n = 100_000
    from distributed import Client, LocalCluster

    from fairpipe.flows.backfill import run_backfill
    from fairpipe.flows.cluster import local_cluster_kwargs
    from fairpipe.flows.fit import run_fit
    from fairpipe.flows.forget import run_forget
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import BackfillOptions, FitOptions, IngestOptions, SummarizeOptions
    from fairpipe.flows.prefect_api import prefect_api
    from fairpipe.flows.summarize import run_summarize
    from fairpipe.storage.queue import file_request
    from fairpipe.storage.store import FairpipeStore

    tmp = Path(tempfile.mkdtemp(prefix="bench-forgetting-"))
    store = str(tmp / "store")
    rng = np.random.default_rng(0)
    rows: list[tuple[str, float, str]] = []
    with prefect_api(), LocalCluster(**local_cluster_kwargs()) as cluster:
        at = cluster.scheduler_address
        gaussian = {"n": a.n, "d": a.d, "clusters": 8, "groups": 4, "seed": 1}
        t0 = time.perf_counter()
        run_ingest("gaussian", store, IngestOptions(seed=1, n_tables=a.tables, gaussian=gaussian),
                   dask_address=at)  # fmt: skip
        t_ingest = time.perf_counter() - t0
        run_fit(store, FitOptions(n_clusters=8, fanout=8, height=2, seed=1), dask_address=at)
        t_fit = time.perf_counter() - t0 - t_ingest
        run_summarize(store, SummarizeOptions(k=20, lower=0.15, upper=0.35, fanout=16, height=2, seed=1),
                      dask_address=at)  # fmt: skip
        build = time.perf_counter() - t0
        rows.append(("fresh build (ingest + fit + summarize)", build,
                     f"ingest {t_ingest:.1f} s, fit {t_fit:.1f} s, "
                     f"summarize {build - t_ingest - t_fit:.1f} s"))  # fmt: skip

        ids = FairpipeStore.open(store).read("ids")
        chosen = rng.choice(ids, size=1000 + a.n // 10, replace=False)
        file_request(store, chosen[:1000], "bench: one request")
        t0 = time.perf_counter()
        drained = run_forget(store, None, dask_address=at)
        t_drain = time.perf_counter() - t0
        parts = ", ".join(f"{k} {v:.2f}" for k, v in drained["timings"].items())
        rows.append(("drain of 1 request, 1,000 ids", t_drain,
                     f"{1000 / t_drain:,.0f} ids/s; in the flow (s): {parts}"))  # fmt: skip

        np.savetxt(tmp / "backlog.txt", chosen[1000:], fmt="%d")
        t0 = time.perf_counter()
        bf = run_backfill(store, str(tmp / "backlog.txt"), BackfillOptions(batch_size=a.batch),
                          dask_address=at)  # fmt: skip
        t_backfill = time.perf_counter() - t0
        per_batch = [b["seconds"] for b in bf["batches"]]
        rows.append((f"backfill of {a.n // 10:,} ids ({len(per_batch)} batches)", t_backfill,
                     f"{bf['forgotten'] / t_backfill:,.0f} ids/s; batch median "
                     f"{np.median(per_batch):.1f} s, max {max(per_batch):.1f} s; erasure "
                     f"{bf['timings'].get('erasure', 0):.1f} s"))  # fmt: skip
        with Client(at) as client:
            workers_mb = client.run(
                lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            )
    print(f"\nforgetting at n = {a.n:,} x {a.d} dims, L = {a.tables} (2 worker processes)")
    print(f"{'operation':44s} {'seconds':>9s} {'vs build':>9s}  note")
    for name, sec, note in rows:
        print(f"{name:44s} {sec:9.2f} {sec / build:9.3f}  {note}")
    print(f"targets: backfill <= 1.5 x build: {t_backfill / build:.2f} "
          f"({'met' if t_backfill <= 1.5 * build else 'NOT met'}); drain of 1,000 <= 1/20: "
          f"{t_drain / build:.3f} ({'met' if t_drain <= build / 20 else 'NOT met'})")  # fmt: skip
    print(
        f"peak RSS: flow process {peak_rss_mb():,.0f} MB; workers "
        + ", ".join(f"{v:,.0f} MB" for v in workers_mb.values())
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "forgetting.json").write_text(json.dumps(
        {"n": a.n, "d": a.d, "rows": rows, "build": build, "drain": t_drain,
         "backfill": t_backfill, "batch_seconds": per_batch, "peak_rss_mb": peak_rss_mb(),
         "workers_peak_rss_mb": list(workers_mb.values())}, indent=1))  # fmt: skip
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
