"""``fairpipe fit``: the store's clustering model, a DC-k-means tree or Q-k-means (one commit)."""

from __future__ import annotations

from typing import Any

from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import FitOptions
from fairpipe.settings import FIT
from fairpipe.tree import check_tree


def _render(r: dict) -> None:
    shape = (
        f"{r['leaves']} leaves, {r['nodes']} nodes"
        if r["model"] == "dc"
        else f"{r['steps']} steps; {r['certification_rate']:.0%} of a 200-point probe "
        "would be certified at deletion"
    )
    out = result_console()
    out.print(
        f"fitted {r['model']} n_clusters={r['n_clusters']} on {r['n_alive']} points ({shape}); "
        f"commit {r['commit']} in {r['timings']['total']:.1f} s"
    )
    out.print(
        f"k-means cost (inertia, the sum of squared distances to the nearest centroid) "
        f"{r['inertia']:.6g}; {r['mean_squared_distance']:.4g} per point"
    )
    out.print("cluster masses: " + " ".join(f"{m:.0f}" for m in r["masses"]))


def _check(**o) -> None:
    check_tree(o["fanout"], o["height"], "fairpipe fit", needs_root_above_leaves=True)
    from fairpipe.flows.checks import check_fit

    check_fit(o["store"], o["n_clusters"], o["model"])


@command(shared=WRITES_STORES, render=_render, check=_check, settings=FIT)
def fit(store: Store, *, shared: Shared, **settings: Any) -> dict:
    """Fit the store's clustering model (DC-k-means tree or Q-k-means): one commit.

    \b
    Examples (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe fit --store digits.store --n-clusters 10
      fairpipe fit --store digits.store --n-clusters 10 --fanout 4 --height 2
    """
    from fairpipe.flows.checks import small_store
    from fairpipe.flows.fit import run_fit

    options = FitOptions(**settings, lock_timeout=shared.lock_timeout)
    return run_fit(store, options, **shared.cluster, processes=not small_store(store))
