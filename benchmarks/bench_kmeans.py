"""Deletion-efficient k-means benchmarks, run on demand:

    .venv/bin/python benchmarks/bench_kmeans.py [--quick] [--only 12] [--out benchmarks/out]

1. online deletions (Ginart et al., Section 5): train once, then 1,000 deletions drawn uniformly
   without replacement, each answered (a valid model) before the next. Baseline: scikit-learn
   KMeans(n_init=1, max_iter=10, k-means++) refitted on the remaining data per deletion, as the
   paper's baseline; its per-deletion time is the mean of ``--refits`` refits measured in the same
   run (1,000 refits would take most of an hour), and its total is train + 1,000 x that mean.
   Quality: loss ratio to scikit-learn's best of 10 inits on the final data, silhouette (5,000
   sampled points) and NMI against the labels. Data: Gaussian mixture N=100k D=25 K=5, MNIST 5k
   (K=10), Census-Income KDD numeric columns (K=5, standardised).
2. one batch of 1,000 deletions at n = 1M (Gaussian, D=25, K=5) against one scikit-learn refit.

Prints a table (figure, baseline, ratio) and writes ``kmeans_online.png`` (amortised time per
deletion vs deletions) and JSON under ``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sklearn.cluster import KMeans  # noqa: E402
from sklearn.metrics import normalized_mutual_info_score, silhouette_score  # noqa: E402

from fairpipe.cluster import DCKMeans, QKMeans  # noqa: E402

DATA = ROOT.parent / "shared" / "data"


def report(what: str, figure: str, baseline: str = "", ratio: str = "") -> None:
    print(f"  {what:<62} {figure:>14} {baseline:>14} {ratio:>9}", flush=True)


def gaussian(n: int, d: int = 25, k: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    X = centres[y] + rng.normal(size=(n, d))
    return X.astype(np.float32), y


def mnist():
    raw = np.loadtxt(gzip.open(DATA / "mnist" / "mnist_5k.csv.gz"), delimiter=",", skiprows=0)
    return (raw[:, :-1] / 255.0).astype(np.float32), raw[:, -1].astype(int)


def census():
    import pandas as pd

    df = pd.read_csv(DATA / "census_kdd" / "census_income_1994_1995_train.csv.gz", header=None)
    numeric = [0, 5, 16, 17, 18, 30, 39]  # age, wage/hour, gains, losses, dividends, persons, weeks
    X = df[numeric].to_numpy(np.float64)
    X = (X - X.mean(0)) / X.std(0)
    y = (df[41].astype(str).str.contains("50000\\+")).to_numpy().astype(int)
    return X.astype(np.float32), y


def sk_refit(X, k, seed):
    return KMeans(n_clusters=k, n_init=1, max_iter=10, init="k-means++", random_state=seed).fit(X)


def quality(model, make, X, ids, y, k, best, seeds=5):
    """(median loss ratio over ``seeds`` seeds, ratio per seed, silhouette, NMI).

    Seed 0 is the timed model after its deletions; seeds 1.. are fresh fits on the same remaining
    data (what a deletion must equal: bit for bit for DC, the same quantised centroids for Q).
    """
    ratios = [model.loss(X) / best]
    for s in range(1, seeds):
        ratios.append(make(s).fit(X, ids=ids).loss(X) / best)
    label = model.predict(X)
    rng = np.random.default_rng(0)
    take = rng.choice(X.shape[0], size=min(5000, X.shape[0]), replace=False)
    sil = (
        silhouette_score(X[take], label[take]) if np.unique(label[take]).size > 1 else float("nan")
    )
    return float(np.median(ratios)), ratios, sil, normalized_mutual_info_score(y, label)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels once, outside every timed region."""
    X = np.random.default_rng(0).normal(size=(2000, 3))
    DCKMeans(n_clusters=3, fanout=2, height=2).fit(X).delete([0])
    QKMeans(n_clusters=3).fit(X).delete([1])


def q_probe(name, X, ids, k, q_params, n_del, refit, results):
    """High dimension: fit Q once and probe its certification rate instead of 1,000 deletions
    (each uncertified deletion is a full retrain); the total is an estimate from the probe."""
    t0 = time.perf_counter()
    model = QKMeans(n_clusters=k, **q_params).fit(X, ids=ids)
    train = time.perf_counter() - t0
    rate = model.certification_rate(n_probe=200)
    estimate = train * (1 + (1 - rate) * n_del)
    report(f"{name}: q train, s / probe: certified of 200", f"{train:.2f}", f"{rate:.1%}")
    report(f"{name}: q estimated train + {n_del} deletions, s", f"{estimate:.0f}",
           f"{refit * (n_del + 1):.1f}", f"{refit * (n_del + 1) / estimate:.1f}x")  # fmt: skip
    results[name]["q_probe"] = {"train_s": train, "certified": rate, "estimated_total_s": estimate}


def online(name, X, y, k, dc_params, q_params, n_del, refits, results, q3=False):
    n = X.shape[0]
    ids = np.arange(n)
    gone = np.random.default_rng(1).choice(ids, size=n_del, replace=False)
    print(f"\n[1] online deletions on {name}: n={n:,} d={X.shape[1]} k={k}, {n_del} deletions")
    # Baseline: scikit-learn refit on the remaining data, per deletion.
    times = []
    for i in range(refits):
        keep = np.ones(n, bool)
        keep[gone[: i + 1]] = False
        t0 = time.perf_counter()
        sk_refit(X[keep], k, i)
        times.append(time.perf_counter() - t0)
    refit = float(np.mean(times))
    base_total = refit * (n_del + 1)
    report(f"{name}: scikit-learn refit per deletion (mean of {refits})", f"{refit:.3f} s")
    out: dict = {"n": n, "d": int(X.shape[1]), "k": k, "refit_s": refit, "deletions": n_del}
    keep = np.ones(n, bool)
    keep[gone] = False
    best = KMeans(n_clusters=k, n_init=10, random_state=0).fit(X[keep]).inertia_
    # The baseline's own quality: its refit (one k-means++ init) on the final data, 5 seeds.
    base = [sk_refit(X[keep], k, s).inertia_ / best for s in range(5)]
    report(f"{name}: scikit-learn refit loss ratio (median of 5 seeds)",
           f"{np.median(base):.3f}", " ".join(f"{r:.2f}" for r in base))  # fmt: skip
    out["refit_loss_ratio"] = float(np.median(base))
    models = {"dc": lambda s: DCKMeans(n_clusters=k, seed=s, **dc_params)}
    if q_params is not None:
        models["q"] = lambda s: QKMeans(n_clusters=k, seed=s, **q_params)
    if q3:  # Q with 3 restarts: steadier loss, ~3x the training and 3 runs to certify
        models["q-n_init3"] = lambda s: QKMeans(n_clusters=k, seed=s, n_init=3, **q_params)
    for label, make in models.items():
        t0 = time.perf_counter()
        model = make(0).fit(X, ids=ids)
        train = time.perf_counter() - t0
        probe = model.certification_rate(n_probe=200) if label.startswith("q") else 0.0
        cum = []
        certified = 0
        t1 = time.perf_counter()
        for g in gone:
            rep = model.delete([g])
            certified += rep.certified or 0
            cum.append(time.perf_counter() - t1)
        total = train + cum[-1]
        ratio, ratios, sil, nmi = quality(model, make, X[keep], ids[keep], y[keep], k, best)
        report(f"{name}: {label} train + {n_del} deletions, s", f"{total:.2f}", f"{base_total:.1f}",
               f"{base_total / total:.0f}x")  # fmt: skip
        report(f"{name}: {label} amortised per deletion, ms", f"{1e3 * cum[-1] / n_del:.2f}",
               f"{1e3 * refit:.0f}", f"{refit * n_del / cum[-1]:.0f}x")  # fmt: skip
        report(f"{name}: {label} loss ratio (median of 5 seeds) / silhouette / NMI",
               f"{ratio:.3f}", f"{sil:.3f}", f"{nmi:.3f}")  # fmt: skip
        report(f"{name}: {label} loss ratio per seed", " ".join(f"{r:.3f}" for r in ratios))
        if label.startswith("q"):
            report(f"{name}: {label} certified deletions (probe before: {probe:.1%})",
                   f"{certified / n_del:.1%}")  # fmt: skip
        out[label] = {
            "train_s": train, "total_s": total, "speedup": base_total / total,
            "amortised_ms": 1e3 * cum[-1] / n_del, "loss_ratio": ratio, "loss_ratios": ratios,
            "silhouette": sil,
            "nmi": nmi, "cumulative_s": cum[:: max(1, n_del // 100)],
            "certified": certified / n_del if label.startswith("q") else None,
            "probe": probe if label.startswith("q") else None,
        }  # fmt: skip
    results[name] = out


def batch(n, k, trees, n_del, results):
    X, y = gaussian(n, seed=7)
    ids = np.arange(n)
    gone = np.random.default_rng(2).choice(ids, size=n_del, replace=False)
    keep = np.ones(n, bool)
    keep[gone] = False
    print(f"\n[2] one batch of {n_del} deletions, Gaussian n={n:,} d=25 k={k}")
    t0 = time.perf_counter()
    ref = sk_refit(X[keep], k, 0)
    refit = time.perf_counter() - t0
    report("scikit-learn refit on the remaining data, s", f"{refit:.2f}")
    results["batch"] = {"n": n, "refit_s": refit, "trees": []}
    for params in trees:
        tag = f"{params['fanout']} x {params['height']}, n_init {params['n_init']}"
        t0 = time.perf_counter()
        model = DCKMeans(n_clusters=k, **params).fit(X, ids=ids)
        train = time.perf_counter() - t0
        t0 = time.perf_counter()
        rep = model.delete(gone)
        dt = time.perf_counter() - t0
        ratio = model.loss(X[keep]) / ref.inertia_
        report(f"DC {tag}: train (whole tree), s", f"{train:.1f}")
        report(f"DC {tag}: delete one batch of {n_del}, s", f"{dt:.3f}", f"{refit:.2f}",
               f"{refit / dt:.1f}x")  # fmt: skip
        report(f"DC {tag}: leaves / nodes recomputed",
               f"{rep.leaves_recomputed} / {rep.nodes_recomputed}", f"of {model.n_leaves_}")  # fmt: skip
        report(f"DC {tag}: loss ratio to the scikit-learn refit", f"{ratio:.3f}")
        results["batch"]["trees"].append({
            **params, "train_s": train, "delete_s": dt, "speedup": refit / dt,
            "leaves": rep.leaves_recomputed, "nodes": rep.nodes_recomputed,
            "n_leaves": model.n_leaves_, "loss_ratio": ratio,
        })  # fmt: skip


def plot(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in results if n != "batch"]
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        r = results[name]
        for label in ("dc", "q", "q-n_init3"):
            if label in r:
                cum = np.array(r[label]["cumulative_s"])
                step = max(1, r["deletions"] // 100)
                x = np.arange(cum.size) * step + 1  # cumulative_s[i]: after i * step + 1
                ax.plot(x, 1e3 * cum / x, label=f"{label} (amortised)")
        ax.axhline(1e3 * r["refit_s"], color="k", linestyle="dashed", label="scikit-learn refit")
        ax.set_yscale("log")
        ax.set_xlabel("deletions")
        ax.set_ylabel("ms per deletion")
        ax.set_title(name)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"  plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="12")
    ap.add_argument("--refits", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_del = 200 if args.quick else 1000
    results: dict = {}
    print(f"  {'what':<62} {'figure':>14} {'baseline':>14} {'ratio':>9}")
    warm_up()
    if "1" in args.only:
        q = dict(epsilon=0.2, balance=0.2, max_iter=10)
        Xg, yg = gaussian(20_000 if args.quick else 100_000)
        dc = dict(fanout=32, height=2, max_iter=10, n_init=3)
        online("gaussian", Xg, yg, 5, dc, q, n_del, args.refits, results)
        Xm, ym = mnist()
        online("mnist-5k", Xm, ym, 10, dict(fanout=8, height=2, n_init=3), None, n_del,
               args.refits, results)  # fmt: skip
        q_probe("mnist-5k", Xm, np.arange(Xm.shape[0]), 10, q, n_del,
                results["mnist-5k"]["refit_s"], results)  # fmt: skip
        Xc, yc = census()
        online("census-kdd", Xc, yc, 5, dc, q, n_del, args.refits, results, q3=True)
        plot(results, out / "kmeans_online.png")
    if "2" in args.only:
        trees = [dict(fanout=4, height=7, n_init=1), dict(fanout=32, height=3, n_init=3)]
        batch(200_000 if args.quick else 1_000_000, 5, trees, 1000, results)
    (out / "kmeans.json").write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
