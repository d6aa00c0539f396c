"""Measures of sampling fairness (Har-Peled & Mahabadi, Section 5): total variation distance to
uniform over each query's neighbourhood, per sampler, against the noise floor of a perfect sampler
with as many samples, and a plot of it."""

from __future__ import annotations

import math
import time

import numpy as np

from fairpipe.hashing import stable_hash
from fairpipe.neighbors._fair_nn import FairNN


def tv_to_uniform(samples: np.ndarray, support: np.ndarray) -> float:
    """Total variation distance between the empirical distribution of ``samples`` and the uniform
    distribution on ``support``; samples outside the support count as mass off the support.

    >>> tv_to_uniform(np.array([0, 1, 0, 1]), np.array([0, 1]))
    0.0
    >>> tv_to_uniform(np.array([0, 0, 0, 0]), np.array([0, 1]))
    0.5
    """
    support = np.unique(support)
    samples = np.asarray(samples)
    if support.size == 0 or samples.size == 0:
        return float("nan")
    pos = np.searchsorted(support, samples)
    pos_c = np.minimum(pos, support.size - 1)
    inside = support[pos_c] == samples
    counts = np.bincount(pos_c[inside], minlength=support.size)
    emp = counts / samples.size
    off = 1.0 - float(inside.mean())
    return 0.5 * (float(np.abs(emp - 1.0 / support.size).sum()) + off)


def noise_floor(samples_per_point: float) -> float:
    """Expected TV of a perfect sampler with S samples per support point: sqrt(1 / (2 pi S)).

    >>> round(noise_floor(100), 4)
    0.0399
    """
    return math.sqrt(1.0 / (2.0 * math.pi * samples_per_point))


def chi_square_uniform(samples: np.ndarray, support: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square statistic of ``samples`` against uniform on ``support``, and its dof."""
    support = np.unique(support)
    pos = np.searchsorted(support, samples)
    counts = np.bincount(pos, minlength=support.size).astype(float)
    expected = samples.size / support.size
    return float(((counts - expected) ** 2 / expected).sum()), int(support.size - 1)


EVALUATED_SAMPLERS = ("exact", "approx", "rank", "weighted", "uniform")


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
    samplers=EVALUATED_SAMPLERS,
    min_size: int = 2,
    progress=None,
) -> dict:
    """Per sampler: mean TV over queries with |M(q)| >= min_size, its ratio to the noise floor,
    and accepted samples per second. ``progress(sampler, done, total)`` is called after each
    query. The result keeps the key ``methods`` (one entry per sampler), as reports read it."""
    rows = []
    for q in query_rows:
        M = nn.neighbourhood(query_rows=[int(q)], radius=radius, mode=mode)[0]
        if M.shape[0] >= min_size:
            rows.append((int(q), M))
    floor = noise_floor(per_point)
    table = {}
    for m in samplers:
        tvs, n_samples, seconds = [], 0, 0.0
        for j, (q, M) in enumerate(rows):
            S = per_point * M.shape[0]
            t0 = time.perf_counter()
            res = nn.sample(
                query_rows=[q], radius=radius, n_samples=S, sampler=m, mode=mode, seed=seed + j
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
    """Bar plot: TV to uniform per sampler (one bar group per data set), with the noise floor."""
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt

    names = list(results)
    # Wide enough for the title and the bars; the legend sits beside the axes, never on a bar.
    fig, ax = plt.subplots(figsize=(4.5 + 1.6 * len(names), 4.2))
    width = 0.8 / len(EVALUATED_SAMPLERS)
    for i, m in enumerate(EVALUATED_SAMPLERS):
        vals = [results[n]["methods"].get(m, {}).get("tv", np.nan) for n in names]
        bars = ax.bar(np.arange(len(names)) + i * width, vals, width, label=m)
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
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
    ax.set_ylabel("TV distance to uniform on M(q)")
    ax.margins(y=0.15)  # room for the value labels above the tallest bar
    ax.set_title("\n".join(textwrap.wrap(title, 48)), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
