"""``fairpipe fit``: the store's clustering model, a DC-k-means tree or Q-k-means (one commit)."""

from __future__ import annotations

from typing import Annotated

import typer

from fairpipe.errors import check_int_range, check_open_unit
from fairpipe.tree import check_tree
from flows.cli._options import Seed, Store, check_options
from flows.cli._runner import WRITES_STORES, Shared, command, result_console

# DCKMeans' and QKMeans' parameters, as their error messages name them.
PARAMETER_FLAGS = {
    "n_clusters": "--k",
    "fanout": "--tree-width",
    "height": "--tree-height",
    "max_iter": "--iterations",
    "balance": "--gamma",
}


def _render(r: dict) -> None:
    shape = (
        f"{r['leaves']} leaves, {r['nodes']} nodes"
        if r["model"] == "dc"
        else f"{r['steps']} steps; {r['certification_rate']:.0%} of a 200-point probe "
        "would be certified at deletion"
    )
    out = result_console()
    out.print(
        f"fitted {r['model']} k={r['k']} on {r['n_alive']} points ({shape}); "
        f"commit {r['commit']} in {r['timings']['total']:.1f} s"
    )
    out.print(
        f"k-means cost (inertia, the sum of squared distances to the nearest centroid) "
        f"{r['inertia']:.6g}; {r['mean_squared_distance']:.4g} per point"
    )
    out.print("cluster masses: " + " ".join(f"{m:.0f}" for m in r["masses"]))


def _check(**o) -> None:
    check_options(
        "fairpipe fit", k=("positive", o["k"]), tree_width=("fanout", o["tree_width"]),
        tree_height=("positive", o["tree_height"]), iterations=("positive", o["iterations"]),
        n_init=("positive", o["n_init"]), epsilon=("positive_float", o["epsilon"]),
        seed=("seed", o["seed"]),
    )  # fmt: skip
    check_open_unit(o["gamma"], "--gamma", "fairpipe fit")
    from fairpipe.cluster._batched_kmeans import MAX_N_INIT

    if o["n_init"] is not None:
        check_int_range(o["n_init"], "--n-init", "fairpipe fit", 1, MAX_N_INIT)
    check_tree(o["tree_width"], o["tree_height"], "fairpipe fit", needs_root_above_leaves=True)
    from flows.checks import check_fit

    check_fit(o["store"], o["k"], o["model"])


@command(PARAMETER_FLAGS, shared=WRITES_STORES, render=_render, check=_check)
def fit(
    store: Store,
    k: Annotated[int, typer.Option("--k", help="Number of clusters.", show_default=False)],
    model: Annotated[str, typer.Option("--model", help="dc | q | auto (see choose_model).")] = "dc",
    tree_width: Annotated[
        int, typer.Option("--tree-width", help="DC: children per node (the tree's fan-out).")
    ] = 8,
    tree_height: Annotated[
        int, typer.Option("--tree-height", help="DC: levels below the root.")
    ] = 2,
    iterations: Annotated[
        int, typer.Option("--iterations", help="Lloyd iterations (DC: per node).")
    ] = 10,
    n_init: Annotated[
        int | None,
        typer.Option(
            "--n-init",
            help="Restarts, the lowest loss kept: DC, of each internal node (default 10); "
            "Q, whole training runs (default 1).",
        ),
    ] = None,
    epsilon: Annotated[
        float,
        typer.Option(
            "--epsilon",
            help="Q: lattice spacing, in the data's units (larger: more certified deletions, "
            "higher loss).",
        ),
    ] = 0.05,
    gamma: Annotated[
        float, typer.Option("--gamma", help="Q: balance correction, in (0, 1).")
    ] = 0.2,
    seed: Seed = 0,
    *,
    shared: Shared,
) -> dict:
    """Fit the store's clustering model (DC-k-means tree or Q-k-means): one commit."""
    from flows.fit import FitOptions, run_fit

    options = FitOptions(
        k=k, model=model, width=tree_width, height=tree_height, iterations=iterations,
        n_init=n_init, seed=seed, epsilon=epsilon, gamma=gamma, lock_timeout=shared.lock_timeout,
    )  # fmt: skip
    from flows.checks import small_store

    result = run_fit(store, options, **shared.cluster, processes=not small_store(store))
    return result
