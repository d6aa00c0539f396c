"""The main job: ingest the built-in digits, build the index, sample fairly, report and plot."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from flows.evaluate import evaluate_tv, pick_queries, plot_tv
from flows.ingest import IngestOptions, run_ingest
from flows.sample import load_sampler


def run_demo(
    store: str | None = None,
    n_queries: int = 20,
    seed: int = 0,
    plot: str | None = None,
    source: str = "digits",
    log=print,
) -> dict:
    t0 = time.perf_counter()
    folder = Path(store) if store else Path(tempfile.mkdtemp(prefix="fairpipe-demo-")) / "store"
    log(f"[1/3] ingest {source} into {folder} (Prefect flow on a local Dask cluster)")
    # k=10, L=50 keep the digits' buckets well populated (1,797 points); w from the data.
    options = IngestOptions(seed=seed, lsh_k=10, lsh_tables=50)
    ingest = run_ingest(source, str(folder), options)
    log(
        f"      {ingest['n']} points x {ingest['d']} dims, {len(ingest['groups'])} groups, "
        f"commit {ingest['commit']}, {ingest['timings']['total']:.1f} s"
    )
    log("[2/3] open the committed index")
    nn, attrs = load_sampler(str(folder))
    radius = float(attrs["suggested_radius"]) * 1.5
    queries = pick_queries(nn, n_queries, seed)
    log(
        f"[3/3] sample 100 x |M(q)| fair neighbours for {len(queries)} queries, radius {radius:.2f}"
    )
    done = {}

    def progress(method, j, total):
        if j == total and method not in done:
            done[method] = True
            log(f"      {method:<8} done")

    ev = evaluate_tv(nn, queries, radius, mode="exact", seed=seed, progress=progress)
    plot_path = plot or str(folder.parent / "fairpipe-demo-tv.png")
    plot_tv({source: ev}, plot_path, f"{source}: fair sampling, k=10, L=50, r={radius:.1f}")
    return {
        "store": str(folder),
        "ingest": ingest,
        "evaluation": ev,
        "plot": plot_path,
        "seconds": time.perf_counter() - t0,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run_demo(), indent=2, default=str))
