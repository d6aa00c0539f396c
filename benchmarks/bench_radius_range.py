"""Fair at every radius of a store's range, on data the defaults were not tuned on:

    .venv/bin/python benchmarks/bench_radius_range.py [--sets mnist,word2vec,...] [--queries 40]

For each data set, a store made by ``ingest`` at its defaults (the index in scales up to 4 r,
recall 0.98; r the suggested radius) and, in the same run, the baseline: a store of one scale
chosen for recall 0.95 at r (``--recall 0.95 --radius r --max-radius r``), the index ingest made
before scales. For each radius 0.5 r, r, 1.5 r, 2 r, 3 r, 4 r and 8 r (beyond the range), on
``--queries`` rows taken in an order fixed by a hash of their ids (those whose true ball holds
another point): the true ball B(q, radius) by brute force, the points a query can draw (its
neighbourhood M(q) in exact mode), their coverage |M & B| / |B|, and the TV distance to uniform
on B that a uniform sampler on M gives with S = 100 |B| samples
(:func:`fairpipe.neighbors.expected_tv_on_ball`: about 1 - coverage plus the noise floor; the
samplers' own uniformity on M is tested statistically in the test suite) over the noise floor
sqrt(1 / (2 pi S)) (target <= 1.5x). Also the query's candidates (the rows of its buckets: its
cost) and whether the store says the radius is in its range.

The data sets: the real ones in ../shared/data (MNIST 5k, word2vec 26k x 300, Census-Income
KDD's 199k rows, Adult's 32k, standardised as ingest standardises a table), and three mixtures
of our own: ``gaussian`` (ingest's built-in, 200k x 128, 16 clusters), ``anisotropic`` (200k x
64, 20 clusters, each with its own random axes and spreads) and ``multiscale`` (200k x 32,
clusters of spreads 0.25, 1 and 4). Output: a table per data set, benchmarks/out/radius_range.json
and benchmarks/out/radius_range.png (TV over the floor against the radius, both stores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_peers import folder_bytes  # noqa: E402  (the same bytes beyond the points)

from fairpipe.flows.ingest import run_ingest  # noqa: E402
from fairpipe.flows.options import IngestOptions  # noqa: E402
from fairpipe.neighbors import (  # noqa: E402
    expected_tv_on_ball,
    noise_floor,
    pick_queries,
    true_balls,
)
from fairpipe.storage.reader import open_reader  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)
TARGET_TV = 1.5
PER_POINT = 100  # samples per point of B(q, r)
FLOOR_SHOWN = 0.03  # the plot's lowest TV ratio


def anisotropic(n: int = 200_000, d: int = 64, k: int = 20, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = np.empty((n, d), np.float32)
    label = rng.integers(k, size=n)
    for c in range(k):
        m = label == c
        axes = np.linalg.qr(rng.normal(size=(d, d)))[0]
        X[m] = (rng.normal(size=(int(m.sum()), d)) * np.exp(rng.normal(0, 1, d))) @ axes
        X[m] += 6 * rng.normal(size=d)
    return X


def multiscale(n: int = 200_000, d: int = 32, k: int = 12, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    label = rng.integers(k, size=n)
    spread = np.array([0.25, 1.0, 4.0])[np.arange(k) % 3]
    centres = 30 * rng.normal(size=(k, d))
    return (rng.normal(size=(n, d)) * spread[label, None] + centres[label]).astype(np.float32)


def sources(folder: Path) -> dict[str, tuple[str, dict]]:
    """Each data set's ingest source and its options beyond the defaults."""
    np.save(folder / "anisotropic.npy", anisotropic())
    np.save(folder / "multiscale.npy", multiscale())
    return {
        "mnist": (f"mnist:{DATA / 'mnist' / 'mnist_5k.csv.gz'}", {}),
        "word2vec": (f"word2vec:{DATA / 'word2vec' / 'GoogleNews-vectors-negative300-bolukbasi.bin.gz'}", {}),
        "census-kdd": (f"census-kdd:{DATA / 'census_kdd' / 'census_income_1994_1995_train.csv.gz'}", {}),
        "adult": (f"adult:{DATA / 'adult' / 'adult.data.gz'}", {}),
        "gaussian": ("gaussian", {"gaussian": {"n": 200_000, "d": 128, "clusters": 16, "groups": 4}}),
        "anisotropic": (str(folder / "anisotropic.npy"), {}),
        "multiscale": (str(folder / "multiscale.npy"), {}),
    }  # fmt: skip


def measure(store: str, r: float, n_queries: int) -> dict:
    reader = open_reader(store)
    nn = reader.preload()
    alive = nn.alive_
    rows = pick_queries(nn, 4 * n_queries, seed=7)
    balls = true_balls(nn.points_, nn.points_[rows], r, alive)
    rows = np.array([q for q, b in zip(rows, balls) if b.shape[0] > 1][:n_queries])
    out: dict = {"queries": len(rows), "radii": {}}
    for f in FACTORS:
        radius = f * r
        balls = true_balls(nn.points_, nn.points_[rows], radius, alive)
        found = nn.neighbourhood(query_rows=rows, radius=radius, include_query=True)
        cands = nn.neighbourhood(query_rows=rows, radius=radius, mode="buckets", include_query=True)
        cover, ratio = [], []
        for b, m in zip(balls, found):
            inside = int(np.isin(b, m).sum())
            cover.append(inside / b.shape[0])
            ratio.append(expected_tv_on_ball(inside, b.shape[0], PER_POINT * b.shape[0])
                         / noise_floor(PER_POINT))  # fmt: skip
        reach = reader.reach(radius)
        out["radii"][f] = {
            "ball_median": float(np.median([b.shape[0] for b in balls])),
            "coverage_mean": float(np.mean(cover)), "coverage_min": float(np.min(cover)),
            "tv_ratio_mean": float(np.mean(ratio)), "tv_ratio_max": float(np.max(ratio)),
            "candidates_median": float(np.median([c.shape[0] for c in cands])),
            "expected_recall": reach["expected_recall"], "in_range": reach["in_range"],
        }  # fmt: skip
    return out


def ingest(source: str, store: Path, **options) -> tuple[dict, float]:
    t0 = time.perf_counter()
    res = run_ingest(source, str(store), IngestOptions(**options))
    return res, time.perf_counter() - t0


def run_set(name: str, source: str, extra: dict, folder: Path, n_queries: int) -> dict:
    made, t_new = ingest(source, folder / f"{name}-scales", **extra)
    r = float(made["lsh"]["radius"])
    base, t_base = ingest(source, folder / f"{name}-one", recall=0.95, radius=r, max_radius=r,
                          **extra)  # fmt: skip
    n, d = int(made["n"]), int(made["d"])
    res = {"n": n, "d": d, "radius": r}
    for key, store, built, seconds in (("scales", "scales", made, t_new),
                                       ("baseline", "one", base, t_base)):  # fmt: skip
        path = folder / f"{name}-{store}"
        res[key] = {"n_tables": built["lsh"]["n_tables"], "scales": built["lsh"].get("scales"),
                    "ingest_s": seconds,
                    "bytes_per_point": (folder_bytes(path) - n * d * 4) / n,
                    **measure(str(path), r, n_queries)}  # fmt: skip
    return res


def print_set(name: str, res: dict) -> None:
    s, b = res["scales"], res["baseline"]
    print(f"\n{name}: {res['n']:,} x {res['d']}, r = {res['radius']:.4g}, {s['queries']} queries; "
          f"scales: {s['n_tables']} tables, {s['bytes_per_point']:.0f} B/point beyond the points, "
          f"ingest {s['ingest_s']:.1f} s; baseline (one scale, recall 0.95): {b['n_tables']} "
          f"tables, {b['bytes_per_point']:.0f} B/point, {b['ingest_s']:.1f} s")  # fmt: skip
    print(
        f"  {'radius':>7} {'|B| med':>8} {'coverage mean/min':>18} {'TV/floor mean/max':>18} "
        f"{'in range':>8} {'cands':>8} | {'baseline coverage':>18} {'TV/floor':>12}"
    )
    for f in FACTORS:
        m, o = s["radii"][f], b["radii"][f]
        ok = "yes" if m["in_range"] else "NO (says so)"
        print(f"  {f:>6}r {m['ball_median']:>8.0f} {m['coverage_mean']:>9.3f}/{m['coverage_min']:<8.3f}"
              f" {m['tv_ratio_mean']:>9.2f}/{m['tv_ratio_max']:<8.2f} {ok:>8} "
              f"{m['candidates_median']:>8.0f} | {o['coverage_mean']:>9.3f}/{o['coverage_min']:<8.3f}"
              f" {o['tv_ratio_mean']:>5.2f}/{o['tv_ratio_max']:<6.2f}")  # fmt: skip


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, key, title in ((axes[0], "scales", "index in scales up to 4 r, recall 0.98 (default)"),
                           (axes[1], "baseline", "one scale at r, recall 0.95 (baseline)")):  # fmt: skip
        for name, res in results.items():
            # (a ball holding the query alone has TV 0: drawn at the axis's floor)
            ys = [max(res[key]["radii"][str(f)]["tv_ratio_mean"], FLOOR_SHOWN) for f in FACTORS]
            ax.plot(FACTORS, ys, marker="o", label=name)
        ax.axhline(TARGET_TV, color="k", linestyle="dashed", label="target 1.5x")
        ax.axvspan(0.5, 4.0, color="0.92")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(FLOOR_SHOWN / 1.2, 40)
        ax.set_xlabel("radius / suggested radius r (shaded: the default range)")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("mean TV on B(q, radius) / noise floor")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sets", default="mnist,word2vec,census-kdd,adult,gaussian,anisotropic,multiscale"
    )
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--plot-only", action="store_true", help="plot the last run's JSON again")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        plot(json.loads((out / "radius_range.json").read_text()), out / "radius_range.png")
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="fairpipe-range-") as tmp:
        folder = Path(tmp)
        known = sources(folder)
        for name in args.sets.split(","):
            source, extra = known[name]
            results[name] = run_set(name, source, extra, folder, args.queries)
            print_set(name, results[name])
    (out / "radius_range.json").write_text(json.dumps(results, indent=1, default=str))
    plot(json.loads((out / "radius_range.json").read_text()), out / "radius_range.png")
    print(f"\nwrote {out / 'radius_range.json'} and {out / 'radius_range.png'}")


if __name__ == "__main__":
    main()
