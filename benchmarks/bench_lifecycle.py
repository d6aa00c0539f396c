"""Living data: append 1 % and 10 %, then forget 1 % in batches, against a fresh build of every
artifact.

A store of the built-in ``gaussian`` data (n rows x d dims, 4 groups) is ingested, fitted (DC-k-means)
and summarized. Then an append of n/100 rows (its index part against the build's), an append of n/10 rows (the model and summary take them in: only their
leaves and ancestors), then n/100 ids forgotten in batches of ``--batch`` ids. Finally a fresh
store is built from the live rows (ingest + fit + summarize) and every artifact is compared with
the updated store's, exactly (tree, summary, LSH index as (key, id) pairs). All runs share one
LocalCluster with 2 worker processes and one Prefect server.

Also: one-id forgets at n and at n/10 (the cost must not follow n), and the index bytes on disk.

Run: .venv/bin/python benchmarks/bench_lifecycle.py [--n 1000000] [--d 32] [--batch 1000]
(about 10 minutes at the defaults; --quick: n = 100,000).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "out"

import fairpipe.flows  # noqa: E402,F401  (environment defaults)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--tables", type=int, default=100)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.n = 100_000
    from distributed import LocalCluster

    from fairpipe.flows.cluster import local_cluster_kwargs
    from fairpipe.flows.fit import run_fit
    from fairpipe.flows.forget import run_forget
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import FitOptions, IngestOptions, SummarizeOptions
    from fairpipe.flows.prefect_api import prefect_api
    from fairpipe.flows.summarize import run_summarize
    from fairpipe.storage.arrays import read_array
    from fairpipe.storage.index import index_entries
    from fairpipe.storage.models import read_model
    from fairpipe.storage.store import FairpipeStore

    tmp = Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    fit = FitOptions(n_clusters=8, fanout=8, height=2, max_iter=10, seed=1)
    summ = SummarizeOptions(k=20, lower=0.15, upper=0.35, fanout=16, height=2, seed=1)
    rows: list[tuple[str, float, str]] = []

    def gaussian(n, seed):
        return {"n": n, "d": a.d, "clusters": 8, "groups": 4, "seed": seed}

    def artifacts(path):
        s = FairpipeStore.open(str(path)).readonly_session()
        out = {f"tree/{k}": v for k, v in read_model(s, "dc").to_arrays(data=False).items()}
        out["summary/ids"] = read_array(s, "summary/ids")
        for level in range(3):
            for name in ("candidates", "evaluation", "value"):
                out[f"summary/{level}/{name}"] = read_array(s, f"summary/level_{level}/{name}")
        for t, (k, i) in enumerate(index_entries(s)):
            out[f"index/{t}"] = np.stack([k.view(np.int64), i])
        return out

    with prefect_api(), LocalCluster(**local_cluster_kwargs()) as cluster:
        at = cluster.scheduler_address
        store = tmp / "store"
        opts = IngestOptions(seed=1, n_tables=a.tables, gaussian=gaussian(a.n, 1))
        t0 = time.perf_counter()
        built = run_ingest("gaussian", str(store), opts, dask_address=at)
        t_ingest = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_fit(str(store), fit, dask_address=at)
        t_fit = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_summarize(str(store), summ, dask_address=at)
        t_summ = time.perf_counter() - t0
        base_build = t_ingest + t_fit + t_summ
        rows += [("ingest n", t_ingest, ""), ("fit", t_fit, ""), ("summarize", t_summ, "")]

        t0 = time.perf_counter()
        app = run_ingest("gaussian", str(store), IngestOptions(gaussian=gaussian(a.n // 100, 3)),
                         dask_address=at)  # fmt: skip
        t_append = time.perf_counter() - t0
        t_index, t_build_index = app["timings"]["bucket_index"], built["timings"]["bucket_index"]
        rows.append(("append n/100 (+ model, summary)", t_append,
                     f"index {t_index:.2f} s = {t_index / t_build_index:.1%} of the build's "
                     f"{t_build_index:.1f} s; {app['leaves_recomputed']} leaves"))  # fmt: skip
        t0 = time.perf_counter()
        app = run_ingest("gaussian", str(store), IngestOptions(gaussian=gaussian(a.n // 10, 2)),
                         dask_address=at)  # fmt: skip
        t_append = time.perf_counter() - t0
        t_index = app["timings"]["bucket_index"]
        rows.append(("append n/10 (+ model, summary)", t_append,
                     f"index {t_index:.2f} s = {t_index / t_build_index:.1%}; "
                     f"{app['leaves_recomputed']} leaves, "
                     f"{app.get('summary_nodes_recomputed', 0)} summary nodes"))  # fmt: skip
        st = FairpipeStore.open(str(store))
        ids = st.read("ids")
        gone = np.random.default_rng(0).choice(ids, size=ids.shape[0] // 100, replace=False)
        batch_times = []
        for b in range(0, gone.shape[0], a.batch):
            t0 = time.perf_counter()
            run_forget(str(store), gone[b : b + a.batch], dask_address=at)
            batch_times.append(time.perf_counter() - t0)
        rows.append((f"forget n/100 in {len(batch_times)} batches", sum(batch_times),
                     f"median batch {np.median(batch_times):.2f} s"))  # fmt: skip
        t0 = time.perf_counter()
        one = run_forget(str(store), [int(ids[12345 % ids.shape[0]])], dask_address=at)
        rows.append(("forget 1 id (flow)", time.perf_counter() - t0,
                     f"in-flow {one['timings']['total']:.3f} s"))  # fmt: skip

        # The fresh build on the live rows.
        st = FairpipeStore.open(str(store))
        s = st.readonly_session()
        alive = read_array(s, "alive")
        names = np.array(st.attrs(s)["group_names"])
        np.save(tmp / "live.npy", read_array(s, "points")[alive])
        np.save(tmp / "live_ids.npy", read_array(s, "ids")[alive])
        np.save(tmp / "live_groups.npy", names[read_array(s, "groups")[alive]])
        del alive
        attrs = st.attrs(s)
        fresh = tmp / "fresh"
        t0 = time.perf_counter()
        run_ingest(str(tmp / "live.npy"), str(fresh),
                   IngestOptions(seed=1, n_hashes=attrs["lsh"]["n_hashes"], n_tables=a.tables,
                                 bucket_width=attrs["lsh"]["bucket_width"],
                                 chunk_rows=attrs["chunk_rows"],
                                 ids_file=str(tmp / "live_ids.npy"),
                                 groups_file=str(tmp / "live_groups.npy")),
                   dask_address=at)  # fmt: skip
        run_fit(str(fresh), fit, dask_address=at)
        run_summarize(str(fresh), summ, dask_address=at)
        t_fresh = time.perf_counter() - t0
        rows.append(("fresh build on the live rows", t_fresh, "ingest + fit + summarize"))
        got, want = artifacts(store), artifacts(fresh)
        equal = sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
        small = tmp / "small"
        run_ingest("gaussian", str(small),
                   IngestOptions(seed=1, n_tables=a.tables, gaussian=gaussian(a.n // 10, 1)),
                   dask_address=at)  # fmt: skip
        t0 = time.perf_counter()
        small_one = run_forget(str(small), [12345 % (a.n // 10)], dask_address=at)
        rows.append(("forget 1 id at n/10 (flow)", time.perf_counter() - t0,
                     f"in-flow {small_one['timings']['total']:.3f} s"))  # fmt: skip

    n_final = int(attrs["n"])
    points_bytes = folder_bytes(fresh)  # compare the store with and without the index
    print(f"\nlifecycle at n = {a.n:,} x {a.d} dims, L = {a.tables} (2 worker processes)")
    print(f"{'operation':44s} {'seconds':>9s} {'vs fresh build':>15s}  note")
    for name, sec, note in rows:
        print(f"{name:44s} {sec:9.2f} {sec / t_fresh:15.3f}  {note}")
    print(f"every artifact equal to the fresh build: {equal}")
    print(f"store on disk: {points_bytes / n_final:.0f} B per row (fresh store, d = {a.d})")
    OUT.mkdir(exist_ok=True)
    (OUT / "lifecycle.json").write_text(json.dumps(
        {"n": a.n, "d": a.d, "rows": rows, "fresh": t_fresh, "base_build": base_build,
         "equal": bool(equal), "bytes_per_row": points_bytes / n_final}, indent=1))  # fmt: skip
    if os.environ.get("KEEP") is None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
