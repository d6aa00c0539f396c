"""Measures of sampling fairness (Har-Peled & Mahabadi, Section 5): total variation distance to
uniform over each query's neighbourhood, per sampler, against the noise floor of a perfect sampler
with as many samples, and a plot of it.

The paper measures TV on M(q), the points the index finds within r. The promise is about the true
ball B(q, r), every point within r; :func:`true_balls` finds it by brute force, :func:`coverage`
says how much of it M(q) holds, and :func:`expected_tv_on_ball` what TV on B(q, r) a sampler
uniform on M(q) gives: about (1 - coverage) plus the noise floor."""

from __future__ import annotations

import math
import time

import numpy as np

from fairpipe.hashing import stable_hash
from fairpipe.neighbors._fair_nn import FairNN
from fairpipe.neighbors._query_buckets import squared
from fairpipe.settings import MODE


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


# Rows per block of the brute-force scan: 32 MB of float32 differences at d = 128, whatever n is.
BALL_CHUNK_ROWS = 1 << 16


def true_balls(
    points: np.ndarray,
    queries: np.ndarray,
    radius: float,
    alive: np.ndarray | None = None,
    chunk_rows: int = BALL_CHUNK_ROWS,
) -> list[np.ndarray]:
    """The true ball B(q, r) of each query: the sorted rows of ``points`` (only the ``alive``
    ones, if given) within ``radius``, by brute force.

    A distance is computed as the samplers' ``exact`` mode computes it (the difference in the
    points' dtype, the sum of its squares, compared with r squared), so a row the index finds
    within r is in its ball. The points are read ``chunk_rows`` rows at a time (an array or a
    memory map): memory stays at ``chunk_rows`` x d values whatever n is.

    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], dtype=np.float32)
    >>> [b.tolist() for b in true_balls(X, X[:2], 1.5, chunk_rows=3)]
    [[0, 1], [0, 1]]
    """
    Q = np.atleast_2d(np.asarray(queries, dtype=points.dtype))
    limit2 = squared(radius)
    found: list[list[np.ndarray]] = [[] for _ in range(Q.shape[0])]
    for lo in range(0, points.shape[0], chunk_rows):
        block = np.asarray(points[lo : lo + chunk_rows])
        keep = None if alive is None else np.asarray(alive[lo : lo + chunk_rows], dtype=bool)
        for i, q in enumerate(Q):
            diff = block - q
            hit = np.einsum("ij,ij->i", diff, diff) <= limit2
            if keep is not None:
                hit &= keep
            found[i].append(np.flatnonzero(hit) + lo)
    return [np.concatenate(f) if f else np.zeros(0, np.int64) for f in found]


def true_ball(points, query, radius: float, alive=None, chunk_rows: int = BALL_CHUNK_ROWS):
    """The sorted rows within ``radius`` of one ``query`` (see :func:`true_balls`)."""
    return true_balls(points, np.asarray(query)[None, :], radius, alive, chunk_rows)[0]


def coverage(found: np.ndarray, ball: np.ndarray) -> float:
    """|found ∩ ball| / |ball|: the share of the true ball B(q, r) among the rows the index can
    draw, M(q) (nan for an empty ball).

    >>> coverage(np.array([1, 2, 9]), np.array([1, 2, 3, 4]))
    0.5
    """
    ball = np.unique(ball)
    if ball.size == 0:
        return float("nan")
    return float(np.isin(ball, found).sum() / ball.size)


def expected_tv_on_ball(found_size: int, ball_size: int, n_samples: int) -> float:
    """E[TV to uniform on B] of ``n_samples`` independent draws uniform on M, a subset of the ball
    B holding ``found_size`` of its ``ball_size`` points (1 if M is empty).

    Each point of M gets X ~ Binomial(N, 1/|M|) of the N draws and each point of B outside M
    none, so TV = (1/2) (sum over M of |X/N - 1/|B|| + (|B| - |M|)/|B|): about (1 - coverage)
    plus the noise floor sqrt(1/(2 pi S)) at S = N/|B| draws per point (each term computed
    exactly here from the binomial distribution).

    >>> round(expected_tv_on_ball(100, 100, 10_000), 4)  # the noise floor, a hair below
    0.0397
    >>> round(expected_tv_on_ball(80, 100, 10_000), 3)  # 1 - coverage dominates
    0.2
    """
    m, b, n = int(found_size), int(ball_size), int(n_samples)
    if m == 0 or n == 0:
        return 1.0
    from scipy.stats import binom

    mean, sd = n / m, math.sqrt(n * (1 / m) * (1 - 1 / m))
    lo, hi = max(0, math.floor(mean - 12 * sd - 1)), min(n, math.ceil(mean + 12 * sd + 1))
    k = np.arange(lo, hi + 1)
    pmf = binom.pmf(k, n, 1 / m) if m > 1 else (k == n).astype(float)
    deviation = float((pmf * np.abs(k / n - 1 / b)).sum())
    return 0.5 * (m * deviation + (b - m) / b)


def tv_margin(n_samples, alpha: float) -> float:
    """A one-sided margin t with P(mean TV - E[mean TV] >= t) <= ``alpha``, for the mean over
    queries of the TV of each query's ``n_samples`` independent draws (McDiarmid: one draw of
    query i moves the mean by at most 1 / (Q N_i), so t = sqrt(ln(1/alpha) sum 1/N_i / (2 Q^2))).

    >>> round(tv_margin([10_000], 1e-3), 4)
    0.0186
    """
    n = np.atleast_1d(np.asarray(n_samples, dtype=float))
    return math.sqrt(math.log(1 / alpha) * float((1 / n).sum()) / (2 * n.size**2))


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
    mode: str = MODE.default,
    per_point: int = 100,
    seed: int = 0,
    samplers=EVALUATED_SAMPLERS,
    min_size: int = 2,
    progress=None,
) -> dict:
    """Per sampler: mean TV to uniform on M(q) (the rows the index finds, by ``mode``; the
    first ``per_point`` x |M(q)| draws) and on the true ball B(q, r) (by brute force over the
    live rows; ``per_point`` x |B(q, r)| draws, the same draws continued), each with its ratio
    to the noise floor, and accepted samples per second. Per query: |M(q)|, |B(q, r)|,
    coverage |M(q) ∩ B(q, r)| / |B(q, r)| and, in ``exact`` mode (M(q) within B(q, r)), the
    TV on B(q, r) a sampler uniform on M(q) would give (:func:`expected_tv_on_ball`). The
    queries are those with |B(q, r)| >= ``min_size``; TV on M(q) is averaged, as the paper
    does, over those with |M(q)| >= ``min_size``. As in the paper, a query's own row is part
    of M(q) and B(q, r) (``include_query=True``). ``progress(sampler, done, total)`` is called after each query. The result
    keeps the key ``methods`` (one entry per sampler), as reports read it."""
    query_rows = np.asarray(query_rows, dtype=np.int64).reshape(-1)
    balls = true_balls(nn.points_, nn.points_[query_rows], radius, alive=nn.alive_)
    rows = []
    for q, B in zip(query_rows.tolist(), balls):
        if B.shape[0] >= min_size:
            M = nn.neighbourhood(query_rows=[q], radius=radius, mode=mode, include_query=True)[0]
            rows.append((q, M, B))
    floor = noise_floor(per_point)
    table = {}
    for m in samplers:
        tvs, tvs_ball, n_samples, asked, seconds = [], [], 0, 0, 0.0
        for j, (q, M, B) in enumerate(rows):
            S = per_point * max(M.shape[0], B.shape[0])
            t0 = time.perf_counter()
            res = nn.sample(
                query_rows=[q],
                radius=radius,
                n_samples=S,
                sampler=m,
                mode=mode,
                seed=seed + j,
                include_query=True,
            )
            seconds += time.perf_counter() - t0
            got = res.rows[0, : res.counts[0]]
            n_samples += int(res.counts[0])
            asked += S
            if M.shape[0] >= min_size:  # as the paper: TV on M(q) where |M(q)| >= min_size
                tvs.append(tv_to_uniform(got[: per_point * M.shape[0]], M))
            # No draw at all for a non-empty ball: every point of it was left out.
            ball_draws = got[: per_point * B.shape[0]]
            tvs_ball.append(tv_to_uniform(ball_draws, B) if ball_draws.size else 1.0)
            if progress is not None:
                progress(m, j + 1, len(rows))
        tv = float(np.mean(tvs)) if tvs else float("nan")
        tv_ball = float(np.mean(tvs_ball)) if tvs_ball else float("nan")
        table[m] = {
            "tv": tv,
            "ratio_to_floor": tv / floor,
            "tv_ball": tv_ball,
            "ball_ratio_to_floor": tv_ball / floor,
            "samples_per_s": n_samples / max(seconds, 1e-9),
            "drawn": n_samples,
            "asked": asked,
        }
    found = [int(M.shape[0]) for _, M, _ in rows]
    ball = [int(B.shape[0]) for _, _, B in rows]
    cover = [coverage(M, B) for _, M, B in rows]
    # A sampler uniform on M(q) in B(q, r) (the exact mode; other modes draw beyond r too).
    expected = [expected_tv_on_ball(int(M.shape[0]), b, per_point * b) if mode == "exact"
                else float("nan") for (_, M, _), b in zip(rows, ball)]  # fmt: skip
    return {
        "methods": table,
        "noise_floor": floor,
        "queries": len(rows),
        "query_rows": [q for q, _, _ in rows],
        "neighbourhood_sizes": found,
        "ball_sizes": ball,
        "coverage": cover,
        "mean_coverage": float(np.mean(cover)) if cover else float("nan"),
        "min_coverage": float(np.min(cover)) if cover else float("nan"),
        "expected_tv_ball": float(np.mean(expected)) if expected else float("nan"),
        "radius": radius,
        "mode": mode,
    }


def plot_tv(results: dict[str, dict], path: str, title: str) -> str:
    """Bar plots: TV to uniform per sampler on M(q) (left) and on the true ball B(q, r) (right),
    one bar group per data set, with the noise floor; the right panel names each data set's mean
    coverage of B(q, r)."""
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt

    names = list(results)
    # Wide enough for the titles and the bars; the legend sits beside the axes, never on a bar.
    fig, axes = plt.subplots(1, 2, figsize=(4.8 + 2.6 * len(names), 4.4), sharey=True)
    width = 0.8 / len(EVALUATED_SAMPLERS)
    panels = (
        ("tv", "on M(q),\nthe points the index finds"),
        ("tv_ball", "on B(q, r),\nthe true ball"),
    )
    for ax, (key, where) in zip(axes, panels):
        for i, m in enumerate(EVALUATED_SAMPLERS):
            vals = [results[n]["methods"].get(m, {}).get(key, np.nan) for n in names]
            bars = ax.bar(np.arange(len(names)) + i * width, vals, width, label=m)
            ax.bar_label(bars, fmt="%.3f", fontsize=6, padding=2, rotation=90)
        for j, n in enumerate(names):
            ax.hlines(results[n]["noise_floor"], j - 0.1, j + 0.9, colors="k",
                      linestyles="dashed",
                      label="noise floor sqrt(1/(2 pi S))" if j == 0 else "_nolegend_")  # fmt: skip
        ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2)
        labels = names
        if key == "tv_ball":
            labels = [f"{n}\ncoverage {results[n].get('mean_coverage', np.nan):.2f}" for n in names]
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(f"TV to uniform {where}", fontsize=9)
        ax.margins(y=0.2)  # room for the value labels above the tallest bar
    axes[0].set_ylabel("TV distance to uniform")
    fig.suptitle("\n".join(textwrap.wrap(title, 80)), fontsize=10)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
