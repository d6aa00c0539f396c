"""ADF fairness testing: the paper's Table IV protocol, with Tables VI, VII, X and XII beside the
paper's own numbers (Zhang et al., "Automatic Fairness Testing of Neural Classifiers through
Adversarial Sampling", IEEE TSE).

For each data set and protected attribute (census = Adult: age, race, sex; bank: age; credit =
German: age, sex), the paper's six-layer MLP (64-32-16-8-4, scikit-learn; 50 epochs, 1,000 for the
1,000 rows of German, where 50 epochs are 250 updates and an underfit model: the paper's German
model has 100% training accuracy, ours 97%) is trained,
then, in this process (numpy on 2 cores, no Dask, so the times are the algorithms'):

- Table IV: ADF from 1,000 clustered seeds (600 for German), 1,000 local steps per discriminatory
  input; AEQUITAS (fully directed) with 1,000 (600) random global inputs and 1,000 local steps per
  discriminatory input; #GDiff, #ID, success rate; random search with ADF's #GDiff as budget.
- Table VI: discriminatory inputs of each global phase.
- Table VII: the local phases from the same starts (up to 100 of ADF's global IDs), 1,000 steps
  each; distinct IDs per start.
- Table X: seconds to the first 1,000 distinct IDs (ADF's includes choosing the seeds).
- Table XII: discrimination rate on 10,000 random inputs before and after retraining with 5% of
  each method's IDs, averaged over 5 repeats.
- Throughput: distinct IDs per second of each method, and the ratio ADF / AEQUITAS measured here.

Plot: ``benchmarks/out/adf_ids_over_time.png`` (IDs found against time, every configuration).

Run: .venv/bin/python benchmarks/bench_adf.py [--quick] [--repeats N] [--only census-age,...]
(about 15 minutes; --quick: 200 seeds x 200 local steps, 1 repeat, about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "out"

import fairpipe.audit as audit  # noqa: E402
from fairpipe.datasets import load_audit_data  # noqa: E402

CONFIGS = [("census", "adult", "age"), ("census", "adult", "race"), ("census", "adult", "sex"),
           ("bank", "bank", "age"), ("credit", "german", "age"), ("credit", "german", "sex")]  # fmt: skip
# The paper's figures: Table IV (AEQUITAS #GDiff, #ID; ADF #GDiff, #ID), VI (AEQUITAS, ADF global
# IDs), VII (AEQUITAS, ADF local IDs), X (AEQUITAS, ADF seconds to 1,000 IDs), XII (before %,
# after % AEQUITAS, after % ADF).
PAPER = {
    "census-age": dict(iv=(56955, 6045, 491650, 256980), vi=(101, 658), vii=(216, 598),
                       x=(172.64, 59.15), xii=(10.88, 4.03, 2.26)),
    "census-race": dict(iv=(54734, 4737, 344162, 139179), vi=(95, 456), vii=(153, 526),
                        x=(128.75, 65.95), xii=(9.75, 7.05, 6.15)),
    "census-sex": dict(iv=(32148, 2930, 259227, 47644), vi=(37, 334), vii=(189, 321),
                       x=(158.37, 78.68), xii=(3.14, 2.33, 1.65)),
    "bank-age": dict(iv=(32870, 8949, 700285, 364758), vi=(43, 872), vii=(221, 708),
                     x=(191.16, 106.93), xii=(4.60, 1.68, 1.19)),
    "credit-age": dict(iv=(99560, 38479, 398209, 233664), vi=(175, 594), vii=(448, 750),
                       x=(176.31, 64.92), xii=(27.93, 13.91, 12.05)),
    "credit-sex": dict(iv=(33137, 4996, 312919, 73497), vi=(47, 451), vii=(142, 337),
                       x=(156.22, 102.90), xii=(7.68, 4.58, 3.93)),
}  # fmt: skip


EPOCHS = {"adult": 50, "bank": 50, "german": 1000}


def run_config(label, dataset, attr, n_seeds, n_local, repeats, seed=0) -> dict:
    data = load_audit_data(dataset, DATA)
    domain = data.domain([attr])
    t = time.perf_counter()
    model = audit.fit_quietly(audit.paper_mlp(seed, EPOCHS[dataset]), data.X, data.y)
    train_s = time.perf_counter() - t
    adapter = audit.adapter_for(model, n_features=domain.d)
    accuracy = float((model.predict(data.X.astype(float)) == data.y).mean())
    n_seeds = min(n_seeds, 600) if dataset == "german" else n_seeds

    t = time.perf_counter()
    seeds = audit.cluster_seeds(data.X, n_seeds, seed=seed)
    seeds_s = time.perf_counter() - t
    adf = audit.adf_search(adapter, seeds, domain, n_local=n_local, seed=seed)
    aeq = audit.aequitas_search(adapter, domain, n_global=n_seeds, n_local=n_local, seed=seed)
    rnd = audit.random_search(adapter, domain, budget=adf.generated, seed=seed)

    # Table VII: both local phases from the same starts.
    starts = audit.global_generation(adapter, seeds, domain)[:100]
    local = {}
    for name, run in (("adf", audit.local_generation), ("aequitas", audit.aequitas_local)):
        tally = audit.Tally(domain)
        run(adapter, starts, domain, n_local, np.random.default_rng(seed), tally=tally)
        local[name] = len(tally.found) / max(len(starts), 1)

    rate = audit.discrimination_rate(adapter, domain, 10_000, seed=seed)
    retrain = {}
    for name, res in (("adf", adf), ("aequitas", aeq)):
        if res.discriminatory.shape[0]:
            retrain[name] = audit.retraining_improvement(
                model, adapter, data.X, data.y, res.discriminatory, domain, repeats=repeats,
                seed=seed,
            )  # fmt: skip
    out = {
        "label": label,
        "rows": int(data.X.shape[0]),
        "accuracy": accuracy,
        "train_s": train_s,
        "seeds": n_seeds,
        "local": n_local,
        "rate": rate,
        "local_per_start": local,
        "local_starts": int(len(starts)),
        "retrain": retrain,
        "traces": {"ADF": adf.trace, "AEQUITAS": aeq.trace, "random": rnd.trace},
    }
    for name, res, extra in (("adf", adf, seeds_s), ("aequitas", aeq, 0.0), ("random", rnd, 0.0)):
        t1000 = res.time_to(1000)
        out[name] = {
            "ids": int(res.discriminatory.shape[0]),
            "generated": res.generated,
            "global_ids": res.global_found,
            "success": res.success_rate,
            "seconds": res.seconds + extra,
            "ids_per_s": res.discriminatory.shape[0] / (res.seconds + extra),
            "to_1000": None if t1000 is None else t1000 + extra,
        }
    return out


def fmt(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def table(title: str, header: str, results: list[dict], row) -> None:
    """One of the paper's tables: a title, a header, and ``row(result, paper's figures)`` each."""
    print(f"\n{title}\n{header}")
    for r in results:
        print(row(r, PAPER[r["label"]]))


def table_iv(r: dict, paper: dict) -> str:
    p, (a, d, z) = paper["iv"], (r["aequitas"], r["adf"], r["random"])
    return (
        f"{r['label']:12} {a['generated']:>8,}/{a['ids']:>7,} {a['success']:5.1%} "
        f"[{p[0]:>6,}/{p[1]:>6,}] {d['generated']:>8,}/{d['ids']:>8,} {d['success']:5.1%} "
        f"[{p[2]:>7,}/{p[3]:>7,}] {z['generated']:>8,}/{z['ids']:>7,} "
        f"{d['ids'] / max(a['ids'], 1):>10.1f}x"
    )


def tables_vi_vii(r: dict, paper: dict) -> str:
    lp = r["local_per_start"]
    return (
        f"{r['label']:12} {r['aequitas']['global_ids']:>7} [{paper['vi'][0]:>4}] "
        f"{r['adf']['global_ids']:>5} [{paper['vi'][1]:>4}] {lp['aequitas']:>9.0f} "
        f"[{paper['vii'][0]:>4}] {lp['adf']:>7.0f} [{paper['vii'][1]:>4}]   "
        f"({r['local_starts']} starts)"
    )


def table_x(r: dict, paper: dict) -> str:
    p, a, d = paper["x"], r["aequitas"], r["adf"]
    return (
        f"{r['label']:12} {fmt(a['to_1000'], '.2f'):>7} [{p[0]:>6.1f}] "
        f"{fmt(d['to_1000'], '.2f'):>5} [{p[1]:>6.1f}] {d['ids_per_s']:>10,.0f} "
        f"{a['ids_per_s']:>10,.0f} {d['ids_per_s'] / max(a['ids_per_s'], 1e-9):>5.1f}x"
    )


def table_xii(r: dict, paper: dict) -> str:
    p, rt = paper["xii"], r["retrain"]
    aeq = rt.get("aequitas", {}).get("rate_after")
    adf = rt.get("adf", {}).get("rate_after")
    imp = rt.get("adf", {}).get("improvement")
    return (
        f"{r['label']:12} {100 * r['rate']:>6.2f} [{p[0]:>5.2f}] "
        f"{fmt(None if aeq is None else 100 * aeq, '.2f'):>6} [{p[1]:>5.2f}] "
        f"{fmt(None if adf is None else 100 * adf, '.2f'):>6} [{p[2]:>5.2f}] "
        f"{fmt(None if imp is None else 100 * imp, '.0f'):>6}% [{100 * (1 - p[2] / p[0]):.0f}%] "
        f"{r['accuracy']:>6.3f}"
    )


def report(results: list[dict]) -> None:
    table("Table IV (#GDiff / #ID / success; paper's in brackets)",
          f"{'config':12} {'AEQUITAS':>34} {'ADF':>38} {'random':>22} {'ADF/AEQ #ID':>11}",
          results, table_iv)  # fmt: skip
    table("Tables VI and VII (global IDs; local IDs per start, same starts; paper's in brackets)",
          f"{'config':12} {'VI AEQUITAS':>16} {'VI ADF':>12} {'VII AEQUITAS':>16} {'VII ADF':>14}",
          results, tables_vi_vii)  # fmt: skip
    table("Table X (seconds to 1,000 IDs) and throughput (distinct IDs per second)",
          f"{'config':12} {'AEQUITAS':>17} {'ADF':>15} {'ADF IDs/s':>10} {'AEQ IDs/s':>10} "
          f"{'ratio':>6}", results, table_x)  # fmt: skip
    table("Table XII (discrimination rate %, before and after retraining with 5% of the IDs)",
          f"{'config':12} {'before':>15} {'AEQUITAS':>15} {'ADF':>15} {'ADF improvement':>16} "
          f"{'acc':>6}", results, table_xii)  # fmt: skip
    imps = [r["retrain"]["adf"]["improvement"] for r in results if "adf" in r["retrain"]]
    imps = [i for i in imps if i is not None]
    if imps:
        print(f"mean ADF improvement {100 * np.mean(imps):.1f}% (paper: 57.2%)")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, r in zip(axes.ravel(), results):
        for name, trace in r["traces"].items():
            if trace:
                t, _, f = zip(*trace)
                ax.plot(t, f, label=name)
        ax.set(title=r["label"], xlabel="seconds", ylabel="distinct discriminatory inputs")
        ax.set_yscale("symlog", linthresh=100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes.ravel()[len(results) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--only", default=None, help="comma-separated labels, e.g. census-age")
    args = ap.parse_args()
    n_seeds, n_local = (200, 200) if args.quick else (1000, 1000)
    repeats = args.repeats or (1 if args.quick else 5)
    only = set(args.only.split(",")) if args.only else None
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for ds_label, dataset, attr in CONFIGS:
        label = f"{ds_label}-{attr}"
        if only and label not in only:
            continue
        t = time.perf_counter()
        r = run_config(label, dataset, attr, n_seeds, n_local, repeats)
        print(
            f"{label}: ADF {r['adf']['ids']:,} IDs in {r['adf']['seconds']:.2f} s, AEQUITAS "
            f"{r['aequitas']['ids']:,} in {r['aequitas']['seconds']:.2f} s "
            f"({time.perf_counter() - t:.0f} s with training and retraining)",
            flush=True,
        )
        results.append(r)
    report(results)
    plot(results, OUT / "adf_ids_over_time.png")
    slim = [{k: v for k, v in r.items() if k != "traces"} for r in results]
    (OUT / "adf.json").write_text(json.dumps(slim, indent=1, default=float))
    print(f"\nplot: {OUT / 'adf_ids_over_time.png'}; figures: {OUT / 'adf.json'}")


if __name__ == "__main__":
    main()
