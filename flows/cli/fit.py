"""``fairpipe fit``: the store's clustering model, a DC-k-means tree or Q-k-means (one commit)."""

from __future__ import annotations

from typing import Annotated

import typer

from fairpipe.errors import check_int_range, check_open_unit
from fairpipe.flows.cli._options import Seed, Store, check_options, choice
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import FitOptions
from fairpipe.tree import check_tree

# The old flags, hidden aliases for one release.
MODELS = ("dc", "q", "auto")
# DCKMeans' and QKMeans' parameters that their error messages name, and their flags.
FLAGS = {name: "--" + name.replace("_", "-")
         for name in ("n_clusters", "fanout", "height", "max_iter", "n_init", "balance")}  # fmt: skip


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
    check_options(
        "fairpipe fit", n_clusters=("positive", o["n_clusters"]), fanout=("fanout", o["fanout"]),
        height=("positive", o["height"]), max_iter=("positive", o["max_iter"]),
        n_init=("positive", o["n_init"]), epsilon=("positive_float", o["epsilon"]),
        seed=("seed", o["seed"]),
    )  # fmt: skip
    check_open_unit(o["balance"], "--balance", "fairpipe fit")
    from fairpipe.cluster import MAX_N_INIT

    if o["n_init"] is not None:
        check_int_range(o["n_init"], "--n-init", "fairpipe fit", 1, MAX_N_INIT)
    check_tree(o["fanout"], o["height"], "fairpipe fit", needs_root_above_leaves=True)
    from fairpipe.flows.checks import check_fit

    check_fit(o["store"], o["n_clusters"], o["model"])


@command(FLAGS, shared=WRITES_STORES, render=_render, check=_check)
def fit(
    store: Store,
    n_clusters: Annotated[
        int, typer.Option("--n-clusters", help="Number of clusters.")
    ] = FitOptions.n_clusters,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="dc: a DC-k-means tree (deletions recompute one leaf-to-root path); q: "
            "Q-k-means (most deletions certified without a retrain); auto: q up to 30 dimensions "
            "with at least 1,000 live points per cluster, else dc.",
            **choice(*MODELS),
        ),
    ] = FitOptions.model,
    fanout: Annotated[
        int,
        typer.Option("--fanout", help="dc: children per node of the tree (fanout^height leaves)."),
    ] = FitOptions.fanout,
    height: Annotated[
        int,
        typer.Option("--height", help="dc: levels below the root (a large store: 2 or more)."),
    ] = FitOptions.height,
    max_iter: Annotated[
        int, typer.Option("--max-iter", help="Most Lloyd iterations (dc: per node).")
    ] = FitOptions.max_iter,
    n_init: Annotated[
        int | None,
        typer.Option(
            "--n-init",
            help="Restarts, the lowest loss kept: dc, of each internal node; q, whole "
            "training runs.",
            show_default="10 for dc, 1 for q",
        ),
    ] = None,
    epsilon: Annotated[
        float,
        typer.Option(
            "--epsilon",
            help="q: lattice spacing, in the data's units (larger: more certified deletions, "
            "higher loss).",
        ),
    ] = FitOptions.epsilon,
    balance: Annotated[
        float, typer.Option("--balance", help="q: balance correction, in (0, 1).")
    ] = FitOptions.balance,
    seed: Seed = FitOptions.seed,
    *,
    shared: Shared,
) -> dict:
    """Fit the store's clustering model (DC-k-means tree or Q-k-means): one commit.

    \b
    Examples (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe fit --store digits.store --n-clusters 10
      fairpipe fit --store digits.store --n-clusters 10 --fanout 4 --height 2
    """
    from fairpipe.flows.fit import run_fit

    options = FitOptions(
        n_clusters=n_clusters, model=model, fanout=fanout, height=height, max_iter=max_iter,
        n_init=n_init, seed=seed, epsilon=epsilon, balance=balance,
        lock_timeout=shared.lock_timeout,
    )  # fmt: skip
    from fairpipe.flows.checks import small_store

    result = run_fit(store, options, **shared.cluster, processes=not small_store(store))
    return result
