"""The plot of docs/lsh_parameters.png: what k, L and w give at the query radius r. Run

    .venv/bin/python benchmarks/plot_lsh_parameters.py [--n 200000] [--d 128] [--clusters 16]
        [--rows 1000000] [--out docs/lsh_parameters.png]

On the built-in ``gaussian`` data (the width sample ingest reads: 2,000 rows by a hash of (seed,
id); r its median nearest-neighbour distance), the model of :mod:`fairpipe.neighbors._parameters`:

1. the recall at r (the probability that a point at distance r is in M(q)) against L, for a few
   k at the paper's w = 3.2 r: at k = 15, L = 100 it is 0.745; the target 0.95 needs L = 220;
2. the recall at r against w / r, for the same k at L = 100;
3. the expected cost per query (100 L + E|M(q)|, in candidate distances, for ``--rows`` rows)
   against w / r, each (k, w) with the fewest tables that reach the target;
4. the same points against L, with the limit of 200 tables and the chooser's pick.

Nothing is indexed: every figure is the model's (tests/neighbors/test_parameters.py checks the
model against fairpipe's hash functions and the coverage it buys). About 5 s.

``--measure``: also ingest the ``--n`` rows twice with ``fairpipe ingest`` (the parameters chosen
at the defaults, and the paper's k = 15, L = 100, w = 3.2 r at the same radius) and print, per
store, the expected recall, the mean and lowest coverage |M(q) & B(q, r)| / |B(q, r)| over 20
queries with a neighbour within r (B by brute force, without q), the mean candidates, the index
bytes per row, the ingest's time and a fresh reader's one-sample latency (median of 10). About
a minute at 200,000 rows; keep ``--n`` at most 200,000 on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairpipe.datasets import plan_source, read_source_sample  # noqa: E402
from fairpipe.neighbors import (  # noqa: E402
    DEFAULT_RECALL,
    MAX_CHOSEN_TABLES,
    TABLE_COST,
    DistanceProfile,
    choose_lsh_parameters,
    lsh_recall,
    width_sample_rows,
)
from fairpipe.neighbors._parameters import WIDTH_RATIOS, _tables_needed  # noqa: E402

KS = (5, 10, 15, 20)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000, help="rows of the gaussian data")
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--clusters", type=int, default=16)
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="rows the cost is computed for (the sample's profile, scaled)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "lsh_parameters.png")
    parser.add_argument("--measure", action="store_true", help="also ingest and measure coverage")
    a = parser.parse_args(argv)

    plan = plan_source("gaussian", gaussian={"n": a.n, "d": a.d, "clusters": a.clusters}, seed=0)
    sample = read_source_sample(plan, width_sample_rows(np.arange(a.n), 0))
    profile = DistanceProfile.of(sample)
    r = profile.suggested_radius
    choice = choose_lsh_parameters(profile, r, DEFAULT_RECALL, n_rows=a.rows)
    print(f"r = {r:.4g}; chosen for {a.rows} rows: k = {choice.n_hashes}, L = "
          f"{choice.n_tables}, w = {choice.bucket_width / r:.3g} r, expected recall "
          f"{choice.expected_recall:.4f}, E|M(q)| = {choice.expected_candidates:.0f}")  # fmt: skip

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(11, 8.5))
    tables = np.unique(np.geomspace(1, 2000, 200).astype(int))
    ratios = np.linspace(1.0, 12.0, 221)
    colours = dict(zip(KS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for k in KS:
        ax[0, 0].plot(tables, lsh_recall(r, k, tables, 3.2 * r), color=colours[k], label=f"k = {k}")
        ax[0, 1].plot(ratios, lsh_recall(r, k, 100, ratios * r), color=colours[k], label=f"k = {k}")
    ax[0, 0].plot([100], [lsh_recall(r, 15, 100, 3.2 * r)], "ko")
    ax[0, 0].annotate("k = 15, L = 100: 0.745", (100, lsh_recall(r, 15, 100, 3.2 * r)),
                      textcoords="offset points", xytext=(8, -14))  # fmt: skip
    ax[0, 0].set(xscale="log", xlabel="tables L", ylabel="recall at r",
                 title="recall at r against L (w = 3.2 r)")  # fmt: skip
    ax[0, 1].set(xlabel="w / r", ylabel="recall at r", title="recall at r against w (L = 100)")

    # The chooser's inner loop: each (k, w) of its grid with the fewest tables for the target.
    grid = np.array(WIDTH_RATIOS)
    for k in KS:
        p_table = lsh_recall(r, k, 1, grid * r)
        L = _tables_needed(p_table, DEFAULT_RECALL)
        cost = np.array([
            TABLE_COST * t + profile.expected_candidates(a.rows, k, int(t), g * r)
            if np.isfinite(t) else np.nan for t, g in zip(L, grid)
        ])  # fmt: skip
        ax[1, 0].plot(grid, cost, color=colours[k], label=f"k = {k}")
        ax[1, 1].plot(L, cost, ".-", color=colours[k], label=f"k = {k}")
    for axis, x in ((ax[1, 0], choice.bucket_width / r), (ax[1, 1], choice.n_tables)):
        axis.plot([x], [choice.cost], "k*", markersize=14,
                  label=f"chosen: k = {choice.n_hashes}, L = {choice.n_tables}, "
                  f"w = {choice.bucket_width / r:.2f} r")  # fmt: skip
    ax[1, 1].axvline(MAX_CHOSEN_TABLES, color="grey", linestyle=":", label="limit: 200 tables")
    ax[1, 0].set(xscale="log", yscale="log", xlabel="w / r", ylabel="expected cost per query",
                 title=f"cost for recall {DEFAULT_RECALL} at r, fewest L ({a.rows:,} rows)")  # fmt: skip
    ax[1, 1].set(xscale="log", yscale="log", xlabel="tables L", ylabel="expected cost per query",
                 title="the same (k, w) points against L")  # fmt: skip
    ax[1, 1].set_xlim(1, 3000)
    for axis in ax[1]:  # the least costs (a short w needs millions of tables)
        axis.set_ylim(0.8 * choice.cost, 10 * choice.cost)
    for axis in ax[0]:
        axis.axhline(DEFAULT_RECALL, color="grey", linestyle="--", label="target 0.95")
        axis.set_ylim(0, 1.02)
    for axis in ax.flat:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(f"E2LSH at the query radius r = {r:.3g} (gaussian {a.n:,} x {a.d}, "
                 f"{a.clusters} clusters; cost = {TABLE_COST:g} L + E|M(q)|)")  # fmt: skip
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=90)
    print(f"plot: {a.out}")
    if a.measure:
        measure(a)
    return a.out


def measure(a) -> None:
    """The chosen parameters against the paper's on ``--n`` rows: see the module docstring."""
    import zarr

    from fairpipe.datasets import load_gaussian
    from fairpipe.storage.reader import open_reader
    from fairpipe.storage.store import FairpipeStore

    exe = Path(sys.executable).parent / "fairpipe"
    ingest = [str(exe), "ingest", "gaussian", "--gaussian-n", str(a.n), "--gaussian-d", str(a.d),
              "--gaussian-clusters", str(a.clusters), "--json"]  # fmt: skip
    X = load_gaussian(n=a.n, d=a.d, clusters=a.clusters, seed=0).points.astype(np.float64)
    sq = (X * X).sum(1)
    folder = Path(tempfile.mkdtemp(prefix="lsh-parameters-"))
    try:
        stores, r = {}, None
        for name in ("chosen", "paper"):
            extra = [] if r is None else ["--n-hashes", "15", "--n-tables", "100", "--bucket-width",
                                          repr(3.2 * r), "--radius", repr(r)]  # fmt: skip
            t0 = time.perf_counter()
            out = subprocess.run([*ingest, "--store", str(folder / name), *extra],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            res = json.loads(out.stdout)
            stores[name] = (res, time.perf_counter() - t0)
            r = res["suggested_radius"]
        rng = np.random.default_rng(2024)
        queries, balls = [], []
        for q in rng.permutation(a.n):
            ball = np.flatnonzero(sq + sq[q] - 2 * X @ X[q] <= r * r)
            ball = ball[ball != q]
            if ball.size:
                queries.append(int(q))
                balls.append(ball)
            if len(queries) == 20:
                break
        for name, (res, wall) in stores.items():
            path = str(folder / name)
            found = open_reader(path).preload().neighbourhood(query_rows=queries, radius=r,
                                                             mode="buckets",
                                                             include_query=True)  # fmt: skip
            coverage = np.array([np.isin(b, m).mean() for b, m in zip(balls, found)])
            latency = []
            for q in queries[:10]:
                reader = open_reader(path)
                t0 = time.perf_counter()
                reader.sample(query_rows=[q], radius=r, n_samples=1, seed=1)
                latency.append(time.perf_counter() - t0)
            session = FairpipeStore.open(path).readonly_session()
            lsh_group = zarr.open_group(session.store, mode="r")["lsh"]
            index = sum(x.nbytes_stored() for _, x in lsh_group.members()
                        if isinstance(x, zarr.Array))  # fmt: skip
            lsh = res["lsh"]
            print(json.dumps({
                "parameters": name, "k": lsh["n_hashes"], "L": lsh["n_tables"],
                "w_over_r": round(lsh["bucket_width"] / r, 3), "expected_recall": lsh["expected_recall"],
                "coverage_mean": float(coverage.mean()), "coverage_min": float(coverage.min()),
                "ball_sizes": [int(min(map(len, balls))), int(max(map(len, balls)))],
                "candidates_mean": float(np.mean([m.size for m in found])),
                "expected_candidates": lsh["expected_candidates"],
                "index_bytes_per_row": index / a.n, "ingest_flow_s": res["timings"]["total"],
                "ingest_wall_s": wall, "fresh_reader_sample_ms": 1000 * float(np.median(latency)),
            }))  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
