"""Fair summaries: FSM (the summary tree, and one stream) vs MSM, random and offline fair greedy.

El Halabi et al.'s setup on Bank Marketing (6 age groups, k = 10..70, l_c = 0.1k, u_c = 0.2k) and
the FSM paper's on a large census table (Census-Income KDD with the paper's age groups; the paper's
Census1990 is not available here). Every method is scored on the same evaluation points: the 4,096
rows with the smallest hash of (seed, id) (the tree's root evaluates on the first 2,048 of them);
offline fair greedy maximises that same objective and is the reference (ratio 1).

Also the distributed path: the summarize flow on a store of Census-Income KDD (2 Dask worker
processes), then forget flows of 100 ids, with their summary equal to a fresh summarize.

Run: .venv/bin/python benchmarks/bench_summary.py [--quick] (about 8 minutes; --quick: 2).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "out"

from fairpipe.datasets import AGE_NAMES, load_bank, load_census_kdd  # noqa: E402
from fairpipe.hashing import stable_hash  # noqa: E402
from fairpipe.summary import (  # noqa: E402
    EVAL_SALT,
    STREAM_SALT,
    FairSummary,
    Utility,
    bound_error,
    fair_greedy,
    fair_stream,
    msm_stream,
    random_subset,
)

EVAL_POINTS = 4096


def bounds(k: int, n_groups: int) -> tuple[list[int], list[int]]:
    return [math.floor(0.1 * k + 1e-9)] * n_groups, [math.ceil(0.2 * k - 1e-9)] * n_groups


def run_methods(X, groups, ids, k, quick: bool) -> dict[str, dict]:
    n_groups = len(AGE_NAMES)
    lower, upper = bounds(k, n_groups)
    sample = np.argsort(stable_hash(0, ids, salt=EVAL_SALT), kind="stable")[:EVAL_POINTS]
    util = Utility("exemplar", X[sample].astype(np.float64))
    order = np.argsort(stable_hash(0, ids, salt=STREAM_SALT), kind="stable")  # a random order
    Xo, co = X[order], groups[order]
    out: dict[str, dict] = {}

    def record(name, rows_of_X, seconds, calls):
        counts = np.bincount(groups[rows_of_X], minlength=n_groups)
        out[name] = {
            "value": util.value(X[rows_of_X].astype(np.float64)),
            "counts": counts.tolist(),
            "error": bound_error(counts, lower, upper),
            "calls": int(calls),
            "seconds": seconds,
            "elements_per_s": X.shape[0] / seconds if seconds > 0 else float("nan"),
        }

    for name, rule in (("FSM tree", "swap"), ("FSM-CK tree", "ck")):
        t = time.perf_counter()
        tree = FairSummary(k=k, lower=lower, upper=upper, rule=rule, fanout=16, height=2)
        tree.fit(X, ids=ids, groups=groups)
        dt = time.perf_counter() - t
        rows = np.searchsorted(ids, tree.summary_ids_)  # ids are sorted row numbers here
        record(name, rows, dt, tree.oracle_calls_)
    for name, fn, kw in (
        ("FSM stream", fair_stream, {"swap": True}),
        ("FSM-CK stream", fair_stream, {}),
        ("MSM stream", msm_stream, {}),
    ):
        t = time.perf_counter()
        res = fn(Xo, co, lower, upper, k, util, **kw)
        record(name, order[res.rows], time.perf_counter() - t, res.calls)
    res = random_subset(X, groups, lower, upper, k, util, seed=0)
    record("random", res.rows, 0.0, 0)
    if not quick or k in (30, 70):
        t = time.perf_counter()
        res = fair_greedy(X, groups, lower, upper, k, util)
        record("fair greedy (offline)", res.rows, time.perf_counter() - t, res.calls)
        ref = out["fair greedy (offline)"]["value"]
        for r in out.values():
            r["ratio"] = r["value"] / ref
    return out


def table(dataset: str, k: int, results: dict[str, dict]) -> None:
    print(f"\n{dataset}, k = {k} (l_c = {bounds(k, 6)[0][0]}, u_c = {bounds(k, 6)[1][0]})")
    print(f"{'method':24s} {'utility':>9s} {'ratio':>7s} {'error':>5s} {'oracle calls':>12s} "
          f"{'elements/s':>11s}  counts per age group {AGE_NAMES}")  # fmt: skip
    for name, r in results.items():
        ratio = f"{r['ratio']:.4f}" if "ratio" in r else "-"
        eps = f"{r['elements_per_s']:.0f}" if r["seconds"] > 0 else "-"
        print(f"{name:24s} {r['value']:9.4f} {ratio:>7s} {r['error']:5d} {r['calls']:12d} "
              f"{eps:>11s}  {r['counts']}")  # fmt: skip


def flow_benchmark(X, groups, names) -> dict:
    """The summarize flow on a store, on one local cluster of 2 worker processes: the first run
    starts with cold workers (they import and load the compiled kernels), the next ones are what
    a long-running cluster gives. Then forget batches of 100 ids, and a check that the stored
    summary after a forget equals a fresh summarize."""
    from distributed import LocalCluster

    from fairpipe.flows.cluster import local_cluster_kwargs
    from fairpipe.flows.forget import run_forget
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import IngestOptions, SummarizeOptions
    from fairpipe.flows.prefect_api import prefect_api
    from fairpipe.flows.summarize import run_summarize
    from fairpipe.storage.store import FairpipeStore
    from fairpipe.storage.summary import read_summary_ids

    tmp = Path(tempfile.mkdtemp(prefix="fairpipe-bench-summary-"))
    np.save(tmp / "X.npy", X)
    np.save(tmp / "groups.npy", np.array(names)[groups])
    store = str(tmp / "store")
    out: dict = {}
    with prefect_api(), LocalCluster(**local_cluster_kwargs()) as cluster:
        at = cluster.scheduler_address
        run_ingest(str(tmp / "X.npy"), store,
                   IngestOptions(n_hashes=4, n_tables=2, groups_file=str(tmp / "groups.npy")),
                   dask_address=at)  # fmt: skip
        opts = SummarizeOptions(k=30, lower=0.1, upper=0.2, fanout=16, height=2)
        runs = [run_summarize(store, opts, dask_address=at) for _ in range(3)]
        out["summarize"] = [r["timings"] for r in runs]
        out["elements_per_s"] = [r["elements_per_second"] for r in runs]
        out["error"] = runs[-1]["error"]
        rng = np.random.default_rng(0)
        out["forget"] = []
        for _ in range(3):
            gone = rng.choice(X.shape[0], size=100, replace=False)
            out["forget"].append(run_forget(store, gone, dask_address=at)["timings"])
        run_forget(store, [int(runs[-1]["ids"][0])], dask_address=at)  # a summary member
        stored = read_summary_ids(FairpipeStore.open(store).readonly_session()).tolist()
        fresh = run_summarize(store, opts, dask_address=at)
        out["forget_equals_fresh"] = fresh["ids"] == stored
    return out


def plot(all_results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    bank = all_results["bank"]
    ks = sorted(bank)
    methods = [m for m in bank[ks[0]] if m != "FSM-CK stream"]
    for m in methods:
        axes[0].plot(ks, [bank[k][m]["value"] for k in ks], marker="o", label=m)
        axes[1].plot(ks, [bank[k][m]["error"] for k in ks], marker="o", label=m)
    axes[0].set(xlabel="k", ylabel="exemplar utility", title="Bank Marketing: utility")
    axes[1].set(xlabel="k", ylabel="error(S)", title="Bank Marketing: bound violations")
    axes[0].legend(fontsize=7)
    census = all_results["census-kdd"]
    names = list(census[max(census)])
    width = 0.8 / len(census)
    for j, k in enumerate(sorted(census)):
        vals = [census[k][m].get("ratio", np.nan) for m in names]
        axes[2].bar(np.arange(len(names)) + j * width, vals, width, label=f"k = {k}")
    axes[2].set_xticks(
        np.arange(len(names)) + width / 2, names, rotation=30, ha="right", fontsize=7
    )
    axes[2].set(ylim=(0.5, 1.05), ylabel="utility / offline fair greedy",
                title="Census-Income KDD")  # fmt: skip
    axes[2].axhline(0.98, color="grey", lw=0.8, ls="--")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer k, no greedy below k = 30")
    ap.add_argument("--no-flow", action="store_true")
    ap.add_argument("--only-flow", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    # Compile (or load from cache) every kernel before any timing.
    warm = np.random.default_rng(0).normal(size=(300, 3))
    wc = np.arange(300) % 6
    for fn in (fair_stream, msm_stream, fair_greedy):
        fn(warm, wc, [1] * 6, [2] * 6, 10)
    fair_stream(warm, wc, [1] * 6, [2] * 6, 10, swap=True)
    FairSummary(k=10, lower=[1] * 6, upper=[2] * 6, fanout=2, height=1).fit(warm, groups=wc)

    all_results: dict = {"bank": {}, "census-kdd": {}}
    bank = load_bank(DATA / "bank" / "bank-full.csv.gz")
    census = load_census_kdd(DATA / "census_kdd" / "census_income_1994_1995_train.csv.gz")
    datasets = [] if args.only_flow else [
        ("bank", bank, [10, 30, 70] if args.quick else [10, 20, 30, 40, 50, 60, 70]),
        ("census-kdd", census, [30, 70]),
    ]  # fmt: skip
    for name, ds, ks in datasets:
        X, groups = ds.points, ds.groups.astype(np.int64)
        ids = np.arange(X.shape[0], dtype=np.int64)
        print(f"\n== {name}: {X.shape[0]} rows x {X.shape[1]} numeric columns (standardised); "
              f"rows per age group {np.bincount(groups).tolist()}")  # fmt: skip
        for k in ks:
            res = run_methods(X, groups, ids, k, args.quick)
            all_results[name][k] = res
            table(name, k, res)
    if datasets:
        plot(all_results, OUT / "summary_quality.png")
        print(f"\nplot: {OUT / 'summary_quality.png'}")
    if not args.no_flow:
        flow = flow_benchmark(census.points, census.groups.astype(np.int64), AGE_NAMES)
        all_results["flow"] = flow
        print("\nsummarize flow on Census-Income KDD (k = 30, one cluster of 2 worker processes):")
        for j, (t, eps) in enumerate(zip(flow["summarize"], flow["elements_per_s"])):
            state = "cold workers" if j == 0 else "warm workers"
            print(f"  {state}: total {t['total']:.2f} s = {eps:.0f} elements/s (leaves on Dask "
                  f"{t['leaves']:.2f} s, parents {t['parents']:.2f} s)")  # fmt: skip
        for t in flow["forget"]:
            print(f"  forget 100 ids: total {t['total']:.2f} s, summary update "
                  f"{t.get('summary', float('nan')):.2f} s")  # fmt: skip
        print(f"  error(S) = {flow['error']}; after a forget the stored summary equals a fresh "
              f"summarize: {flow['forget_equals_fresh']}")  # fmt: skip
    name = "summary_flow.json" if args.only_flow else "summary_results.json"
    (OUT / name).write_text(json.dumps(all_results, default=str, indent=1))


if __name__ == "__main__":
    main()
