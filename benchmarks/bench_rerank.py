"""Fair re-ranking: the paper's simulation, throughput, and a real example (law school by race).

1. Geyik et al.'s simulation: for |A| = 2..10, desired distributions drawn uniformly and
   normalised, 100 candidates per group with uniform random scores, the top 100 re-ranked by each
   algorithm; InfeasibleIndex, MinSkew@100, MaxSkew@100, NDKL and NDCG averaged per |A| and plotted
   like the paper's figures (``benchmarks/out/rerank_simulation.png``).
2. Throughput on lists of 100 candidates (|A| = 2 and 10), k = 100, against a plain-Python
   transcription of each algorithm measured in the same run; metrics alone.
3. The LSAC law-school table (../shared/data/law_school): one list per tier ranked by LSAT, groups
   by race, top 100 re-ranked toward each tier's own distribution; Skew@k curves before and after
   (``benchmarks/out/rerank_law_school_skew.png``).

Run: .venv/bin/python benchmarks/bench_rerank.py [--lists N] (N distributions per |A|; the paper
used 100,000, the default here; --lists 10000 takes well under a minute).
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

from fairpipe.ranking import ALGORITHMS, ndcg, ranking_metrics, rerank, skew  # noqa: E402

NAMES = {"detgreedy": "DetGreedy", "detcons": "DetCons", "detrelaxed": "DetRelaxed",
         "detconstsort": "DetConstSort"}  # fmt: skip


def simulate(n_groups: int, n_lists: int, seed: int, chunk: int = 20_000) -> dict:
    """Mean metrics per algorithm over ``n_lists`` simulated lists (in chunks of ``chunk``)."""
    rng = np.random.default_rng(seed)
    sums = {a: np.zeros(6) for a in ALGORITHMS}
    seconds = dict.fromkeys(ALGORITHMS, 0.0)
    groups_one = np.repeat(np.arange(n_groups), 100)
    done = 0
    while done < n_lists:
        m = min(chunk, n_lists - done)
        scores = rng.random((m, 100 * n_groups))
        groups = np.broadcast_to(groups_one, scores.shape)
        p = rng.random((m, n_groups))
        p /= p.sum(axis=1, keepdims=True)
        for a in ALGORITHMS:
            t = time.perf_counter()
            out = rerank(scores, groups, p, 100, a)
            seconds[a] += time.perf_counter() - t
            ranked = np.take_along_axis(groups, out, axis=1)
            met = ranking_metrics(ranked, p)
            nd = ndcg(np.take_along_axis(scores, out, axis=1), scores)
            finite = np.isfinite(met["min_skew"])  # -inf: a group got no slot in the top 100
            sums[a] += [
                met["infeasible_index"].sum(), met["min_skew"][finite].sum(),
                met["max_skew"].sum(), met["ndkl"].sum(), nd.sum(), (~finite).sum(),
            ]  # fmt: skip
        done += m
    keys = ("infeasible_index", "min_skew", "max_skew", "ndkl", "ndcg", "share_min_skew_inf")
    out = {}
    for a in ALGORITHMS:
        r = dict(zip(keys, (sums[a] / n_lists).tolist()))
        finite = n_lists - sums[a][5]
        r["min_skew"] = float(sums[a][1] / finite) if finite else float("nan")  # finite lists
        out[a] = {**r, "lists_per_s": n_lists / seconds[a]}
    return out


def throughput(n_groups: int, n_lists: int = 50_000) -> dict:
    from tests.ranking.test_reranking import reference  # the tests' plain-Python transcription

    rng = np.random.default_rng(n_groups)
    scores = rng.random((n_lists, 100))
    groups = rng.integers(0, n_groups, size=(n_lists, 100))
    p = rng.random((n_lists, n_groups))
    p /= p.sum(axis=1, keepdims=True)
    res: dict = {}
    for a in ALGORITHMS:
        rerank(scores[:10], groups[:10], p[:10], 100, a)
        t = time.perf_counter()
        out = rerank(scores, groups, p, 100, a)
        fast = n_lists / (time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(200):
            reference(scores[i], groups[i], p[i], 100, a)
        slow = 200 / (time.perf_counter() - t)
        res[a] = {"lists_per_s": fast, "reference_lists_per_s": slow, "speedup": fast / slow}
    ranked = np.take_along_axis(groups, out, axis=1)
    ranking_metrics(ranked[:10], p[:10])
    t = time.perf_counter()
    ranking_metrics(ranked, p)
    res["metrics"] = {"lists_per_s": n_lists / (time.perf_counter() - t)}
    return res


def law_school(plot_path: Path) -> dict:
    import pandas as pd

    frame = pd.read_csv(DATA / "law_school" / "law_school_clean.csv.gz")
    names = sorted(frame["race"].unique())
    out: dict = {}
    curves = {}
    for tier, sub in frame.groupby("tier"):
        scores = sub["lsat"].to_numpy(np.float64)[None]
        codes = sub["race"].map({n: i for i, n in enumerate(names)}).to_numpy()[None]
        p = np.bincount(codes[0], minlength=len(names)) / codes.shape[1]
        before = np.argsort(-scores, axis=1, kind="stable")[:, :100]
        after = rerank(scores, codes, p, 100, "detconstsort")
        row = {"rows": int(sub.shape[0]), "p": dict(zip(names, p.round(4).tolist()))}
        for when, ranking in (("before", before), ("after", after)):
            ranked = np.take_along_axis(codes, ranking, axis=1)
            m = ranking_metrics(ranked, p)
            row[when] = {
                "min_skew": float(m["min_skew"][0]), "max_skew": float(m["max_skew"][0]),
                "ndkl": float(m["ndkl"][0]), "infeasible_index": int(m["infeasible_index"][0]),
                "ndcg": float(ndcg(np.take_along_axis(scores, ranking, axis=1), scores)[0]),
            }  # fmt: skip
            curves[(tier, when)] = np.array(
                [skew(ranked, p, k=k, smoothing=0.5)[0] for k in range(1, 101)]
            )
        out[str(tier)] = row
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = sorted({t for t, _ in curves})
    fig, axes = plt.subplots(1, len(tiers), figsize=(3.2 * len(tiers), 3.2), sharey=True)
    for ax, tier in zip(np.atleast_1d(axes), tiers):
        for when, style in (("before", "--"), ("after", "-")):
            for j, name in enumerate(names):
                ax.plot(range(1, 101), curves[(tier, when)][:, j], style, color=f"C{j}",
                        label=f"{name}, {when}")  # fmt: skip
        ax.axhline(0, color="grey", lw=0.6)
        ax.set(title=f"tier {int(tier)}", xlabel="k")
    np.atleast_1d(axes)[0].set_ylabel("Skew@k (smoothing 0.5)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.suptitle(
        "Law school, ranked by LSAT: DetConstSort toward each tier's own race distribution"
    )
    fig.tight_layout()
    fig.savefig(plot_path, dpi=110)
    return out


def plot_simulation(sim: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(sim)
    keys = [("infeasible_index", "InfeasibleIndex"), ("min_skew", "MinSkew@100 (finite lists)"),
            ("max_skew", "MaxSkew@100"), ("ndkl", "NDKL"), ("ndcg", "NDCG")]  # fmt: skip
    fig, axes = plt.subplots(1, 5, figsize=(19, 3.4))
    for ax, (key, title) in zip(axes, keys):
        for a in ALGORITHMS:
            ax.plot(sizes, [sim[s][a][key] for s in sizes], marker="o", label=NAMES[a])
        ax.set(title=title, xlabel="|A|")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lists", type=int, default=100_000, help="simulated lists per |A|")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    results: dict = {"simulation": {}}
    t0 = time.perf_counter()
    print(f"1. simulation: {args.lists} lists per |A|, 100 candidates per group, top 100")
    print("   (MinSkew: mean over the lists where every group got a slot; '-inf' = share of lists"
          " where one did not)")  # fmt: skip
    print(f"{'|A|':>3s} {'algorithm':13s} {'Infeasible':>10s} {'MinSkew':>8s} {'-inf':>6s} "
          f"{'MaxSkew':>8s} {'NDKL':>7s} {'NDCG':>7s} {'lists/s':>9s}")  # fmt: skip
    warm = np.random.default_rng(0).random((4, 200))
    for a in ALGORITHMS:  # compile (or load) every kernel before timing
        rerank(warm, np.tile(np.repeat([0, 1], 100), (4, 1)), [0.5, 0.5], 100, a)
    for n_groups in range(2, 11):
        sim = simulate(n_groups, args.lists, seed=n_groups)
        results["simulation"][n_groups] = sim
        for a in ALGORITHMS:
            r = sim[a]
            print(f"{n_groups:3d} {NAMES[a]:13s} {r['infeasible_index']:10.3f} {r['min_skew']:8.3f} "
                  f"{r['share_min_skew_inf']:6.1%} {r['max_skew']:8.3f} {r['ndkl']:7.4f} "
                  f"{r['ndcg']:7.4f} {r['lists_per_s']:9.0f}")  # fmt: skip
    results["simulation_seconds"] = time.perf_counter() - t0
    plot_simulation(results["simulation"], OUT / "rerank_simulation.png")
    print(f"   {results['simulation_seconds']:.0f} s; plot {OUT / 'rerank_simulation.png'}")
    print("\n2. throughput, lists of 100 candidates, k = 100 (2 threads), vs plain Python")
    results["throughput"] = {}
    for n_groups in (2, 10):
        tp = throughput(n_groups)
        results["throughput"][n_groups] = tp
        for a in ALGORITHMS:
            r = tp[a]
            print(f"   |A| = {n_groups:2d} {NAMES[a]:13s} {r['lists_per_s']:9.0f} lists/s "
                  f"(plain Python {r['reference_lists_per_s']:6.0f}/s, {r['speedup']:.0f}x)")  # fmt: skip
        print(f"   |A| = {n_groups:2d} metrics       {tp['metrics']['lists_per_s']:9.0f} lists/s")
    print("\n3. law school (LSAT by tier, race, top 100, desired = the tier's own distribution)")
    law = law_school(OUT / "rerank_law_school_skew.png")
    results["law_school"] = law
    for tier, row in law.items():
        b, a = row["before"], row["after"]
        print(f"   tier {tier}: {row['rows']} rows, p {row['p']}: MinSkew {b['min_skew']:.3f} -> "
              f"{a['min_skew']:.3f}, NDKL {b['ndkl']:.4f} -> {a['ndkl']:.4f}, InfeasibleIndex "
              f"{b['infeasible_index']} -> {a['infeasible_index']}, NDCG {a['ndcg']:.4f}")  # fmt: skip
    print(f"   plot {OUT / 'rerank_law_school_skew.png'}")
    (OUT / "rerank_results.json").write_text(json.dumps(results, default=str, indent=1))


if __name__ == "__main__":
    main()
