"""What a fairness search reports: batches merged on wall-clock time, per-method figures, a plot.

A search run as several batches (Dask tasks) gives one :class:`SearchResult` per batch and the
time it started; :func:`merge_batches` puts their discriminatory inputs together (distinct across
batches) and their traces on one clock, :func:`search_figures` gives #ID, #GDiff, the success
rate, IDs per second and the seconds to 1,000 IDs, and :func:`plot_traces` draws IDs against time
and against inputs generated, per method.
"""

from __future__ import annotations

import numpy as np

from fairpipe.audit._discrimination import SearchResult


def merge_batches(parts: list[tuple[SearchResult, float]], t0: float):
    """The batches' distinct inputs, and one trace over wall-clock time since ``t0``: each batch's
    counts added at the moment it reached them (distinct within a batch; the final #ID is
    de-duplicated across batches)."""
    found = np.unique(np.concatenate([p.discriminatory for p, _ in parts]), axis=0)
    events = []
    for p, started in parts:
        prev_g = prev_f = 0
        for t, g, f in p.trace:
            events.append((started - t0 + t, g - prev_g, f - prev_f))
            prev_g, prev_f = g, f
    events.sort()
    trace, g_sum, f_sum = [], 0, 0
    for t, dg, df in events:
        g_sum, f_sum = g_sum + dg, f_sum + df
        trace.append((t, g_sum, f_sum))
    return found, trace


def time_to(trace, ids: int) -> float | None:
    """Seconds in ``trace`` until ``ids`` distinct discriminatory inputs were found (None: never)."""
    return next((t for t, _, f in trace if f >= ids), None)


def search_figures(found: np.ndarray, generated: int, global_found, trace, seconds) -> dict:
    """One method's figures, under the keys the audit reports use."""
    return {
        "ids": int(found.shape[0]),
        "generated": int(generated),
        "global_ids": global_found,
        "success_rate": found.shape[0] / generated if generated else 0.0,
        "seconds": seconds,
        "ids_per_second": found.shape[0] / seconds if seconds > 0 else None,
        "seconds_to_1000_ids": time_to(trace, 1000),
    }


def plot_traces(traces: dict, path, title: str) -> None:
    """Two panels: distinct discriminatory inputs against seconds and against inputs generated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, trace in traces.items():
        if trace:
            t, g, f = zip(*trace)
            left.plot(t, f, label=name)
            right.plot(g, f, label=name)
    left.set(xlabel="seconds since the method started", ylabel="discriminatory inputs found")
    right.set(xlabel="distinct inputs generated", ylabel="distinct discriminatory inputs")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
