"""The paper's Section 5 evaluation: TV distance to uniform over M(q), per method, and a plot."""

from __future__ import annotations

import time

import numpy as np

from fairpipe.evaluation import noise_floor, tv_to_uniform
from fairpipe.fair_nn import FairNN
from fairpipe.hashing import stable_hash

METHODS = ("exact", "approx", "rank", "weighted", "uniform")


def hash_order(ids: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """Positions of ``ids`` in an order fixed by hash of (seed, salt, id): a reproducible
    choice whatever the file order."""
    return np.argsort(stable_hash(seed, ids, salt=salt), kind="stable")


def pick_queries(nn: FairNN, n_queries: int, seed: int) -> np.ndarray:
    """Query rows chosen by hash of (seed, id): reproducible whatever the file order."""
    alive = np.flatnonzero(nn.alive_)
    return alive[hash_order(nn.ids_[alive], seed, salt=0x0E)[:n_queries]]


def evaluate_tv(
    nn: FairNN,
    query_rows,
    radius: float,
    mode: str = "exact",
    per_point: int = 100,
    seed: int = 0,
    methods=METHODS,
    min_size: int = 2,
    progress=None,
) -> dict:
    """Per method: mean TV over queries with |M(q)| >= min_size, its ratio to the noise floor,
    and accepted samples per second."""
    rows = []
    for q in query_rows:
        M = nn.neighbourhood(query_rows=[int(q)], radius=radius, mode=mode)[0]
        if M.shape[0] >= min_size:
            rows.append((int(q), M))
    floor = noise_floor(per_point)
    table = {}
    for m in methods:
        tvs, n_samples, seconds = [], 0, 0.0
        for j, (q, M) in enumerate(rows):
            S = per_point * M.shape[0]
            t0 = time.perf_counter()
            res = nn.sample(
                query_rows=[q], radius=radius, n_samples=S, method=m, mode=mode, seed=seed + j
            )
            seconds += time.perf_counter() - t0
            n_samples += int(res.counts[0])
            tvs.append(tv_to_uniform(res.rows[0, : res.counts[0]], M))
            if progress is not None:
                progress(m, j + 1, len(rows))
        tv = float(np.mean(tvs)) if tvs else float("nan")
        table[m] = {
            "tv": tv,
            "ratio_to_floor": tv / floor,
            "samples_per_s": n_samples / max(seconds, 1e-9),
        }
    sizes = [int(M.shape[0]) for _, M in rows]
    return {
        "methods": table,
        "noise_floor": floor,
        "queries": len(rows),
        "neighbourhood_sizes": sizes,
        "radius": radius,
        "mode": mode,
    }


def plot_tv(results: dict[str, dict], path: str, title: str) -> str:
    """Bar plot: TV to uniform per method (one bar group per data set), with the noise floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(names), 4))
    width = 0.8 / len(METHODS)
    for i, m in enumerate(METHODS):
        vals = [results[n]["methods"].get(m, {}).get("tv", np.nan) for n in names]
        ax.bar(np.arange(len(names)) + i * width, vals, width, label=m)
    floors = [results[n]["noise_floor"] for n in names]
    for j, f in enumerate(floors):
        ax.hlines(
            f,
            j - 0.1,
            j + 0.9,
            colors="k",
            linestyles="dashed",
            label="noise floor sqrt(1/(2 pi S))" if j == 0 else "_nolegend_",
        )
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2)
    ax.set_xticklabels(names)
    ax.set_ylabel("total variation distance to uniform on M(q)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
