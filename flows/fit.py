"""Fit flow: the store's live points -> a DC-k-means tree (or a Q-k-means model) -> one commit.

DC-k-means runs on Dask: one job per row chunk reads its rows and splits them by leaf group (a
group is a run of consecutive leaves holding about ``LEAF_BATCH_POINTS`` points); one job per leaf
group gathers its parts from every chunk job (a shuffle: each worker holds only what passes
through it, never all points) and solves its leaves with the batched kernel; the tree is then
assembled from the leaves in one job (:meth:`DCKMeans.from_leaves`: the parents are small,
``fanout * k`` weighted centroids each). Every node's result
depends on its own inputs only, so the tree is identical whatever the chunking or worker count,
and identical to :class:`fairpipe.cluster.DCKMeans` fitted in memory.

Q-k-means is a global Lloyd iteration over all points; it runs as one job on a worker, on the
live points (its memory is n x d float64). The Prefect tasks run in the flow's process and send
these jobs to Dask (:func:`fairpipe.flows.dask_map.on_cluster`).
"""

from __future__ import annotations

import time

import numpy as np
from prefect.cache_policies import NO_CACHE

from fairpipe.cluster import DCKMeans, QKMeans, choose_model, nearest, solve_leaf_group
from fairpipe.errors import K_TOO_LARGE, FairpipeInputError
from fairpipe.flows.dask_map import dask_map, on_cluster
from fairpipe.flows.leaf_shuffle import shuffle_by_leaf
from fairpipe.flows.options import FitOptions
from fairpipe.flows.private import flow, task
from fairpipe.flows.task_runner import default_task_runner, run_flow
from fairpipe.settings import MODEL
from fairpipe.storage.lineage import record
from fairpipe.storage.models import write_model
from fairpipe.storage.rows import RowBlocks, n_features, read_all_live, read_live_rows
from fairpipe.storage.store import FairpipeStore

# Q-k-means' Lloyd steps run over every live point in one process (n x d float64): it is refused
# above this many bytes of points (DC-k-means has no such limit: each job holds one leaf group).
Q_MEMORY_LIMIT = 4 << 30
Q_TOO_LARGE = (
    "Q-k-means holds every live point in one process: the store {url} has {n} x {d} "
    "(= {gb:.1f} GB as float64), above its limit of {limit:.0f} GB. Use --model dc (no such "
    "limit), or a store with fewer points."
)


def q_too_large(n_alive: int, d: int) -> bool:
    """Whether the live points, as float64, exceed Q-k-means' one-process limit."""
    return n_alive * d * 8 > Q_MEMORY_LIMIT


def check_q_size(n_alive: int, d: int, url: str) -> None:
    """Refuse a Q-k-means model whose points would not fit its one-process limit."""
    if q_too_large(n_alive, d):
        raise FairpipeInputError(
            Q_TOO_LARGE.format(url=url, n=n_alive, d=d, gb=n_alive * d * 8 / 2**30,
                               limit=Q_MEMORY_LIMIT / 2**30)
        )  # fmt: skip


# -- Dask jobs ------------------------------------------------------------------------------------
def solve_leaves_on_dask(session, blocks: RowBlocks, params: dict, leaves, rows=None):
    """Solve ``leaves`` (sorted) with a shuffle by leaf group; returns (leaves, centroids,
    masses) in ``leaves`` order (leaves left without a live row are missing)."""
    n_leaves = int(params["fanout"]) ** int(params["height"])
    seed, k, T = int(params["seed"]), int(params["n_clusters"]), int(params["max_iter"])
    results = shuffle_by_leaf(
        session, blocks, seed, n_leaves, leaves, solve_leaf_group, (k, T, seed), rows
    )
    if not results:
        d = n_features(session)
        return leaves[:0], np.zeros((0, k, d)), np.zeros((0, k))
    got = np.concatenate([r[0] for r in results])
    order = np.argsort(got)
    return (
        got[order],
        np.concatenate([r[1] for r in results])[order],
        np.concatenate([r[2] for r in results])[order],
    )


def chunk_cost(session, a: int, b: int, centroids: np.ndarray, live: np.ndarray) -> tuple:
    """(A Dask job.) (sum of squared distances to the nearest live centroid, live rows) of the
    live rows of [a, b)."""
    X, _, _ = read_live_rows(session, a, b)
    if X.shape[0] == 0:
        return 0.0, 0
    return float(nearest(X, centroids, live)[1].sum()), int(X.shape[0])


# -- Prefect tasks --------------------------------------------------------------------------------
@task(name="solve-leaves", cache_policy=NO_CACHE)
def solve_leaves_task(session, blocks: RowBlocks, params: dict, leaves, rows=None) -> tuple:
    return solve_leaves_on_dask(session, blocks, params, leaves, rows)


def grow_tree(params: dict, d: int, solved, centroids, masses) -> DCKMeans:
    """(A Dask job.) The DC-k-means tree over its solved leaves (the others empty)."""
    return DCKMeans.from_leaves(d, solved, centroids, masses, **params)


def fit_q(session, params: dict) -> QKMeans:
    """(A Dask job.) A Q-k-means model fitted on the live points of ``session``."""
    X, ids = read_all_live(session)
    return QKMeans(**params).fit(X, ids=ids)


@task(name="grow-tree", cache_policy=NO_CACHE)
def grow_tree_task(params: dict, d: int, solved, centroids, masses) -> DCKMeans:
    return on_cluster(grow_tree, params, d, solved, centroids, masses)


@task(name="clustering-cost", cache_policy=NO_CACHE)
def clustering_cost_task(session, blocks: RowBlocks, centroids, masses) -> float:
    """The k-means objective of the root centroids over every live row: one job per block of
    rows, each reading its rows once."""
    starts, ends = [a for a, _ in blocks.ranges()], [b for _, b in blocks.ranges()]
    c, live = np.asarray(centroids), np.asarray(masses) > 0
    parts = dask_map(chunk_cost, [session] * len(starts), starts, ends, [c] * len(starts),
                     [live] * len(starts))  # fmt: skip
    return float(sum(p[0] for p in parts))


@task(name="fit-q-kmeans", cache_policy=NO_CACHE)
def fit_q_task(session, params: dict) -> QKMeans:
    return on_cluster(fit_q, session, params)


# -- the flow -------------------------------------------------------------------------------------
def check_request(store_url: str, o: FitOptions, attrs: dict | None = None):
    """The store and the model kind, every option checked before anything is read or written
    (against ``attrs``, default the tip's: the flow checks again inside the writer lock)."""
    model = MODEL.check(o.model, "fit")
    store = FairpipeStore.open(store_url)
    tip = store.require_data()
    attrs = tip if attrs is None else attrs
    n_alive, d = int(attrs["n_alive"]), int(attrs["d"])
    if model == "auto":
        model = choose_model(n_alive, d, o.n_clusters)
        if model == "q" and q_too_large(n_alive, d):
            model = "dc"
    if model == "dc":
        DCKMeans(**o.dc_params()).check_params()
    else:
        QKMeans(**o.q_params()).check_params()
        check_q_size(n_alive, d, store.url)
    if o.n_clusters > n_alive:
        raise FairpipeInputError(
            K_TOO_LARGE.format(
                name="n_clusters",
                k=o.n_clusters,
                n=n_alive,
                what=f"live points of the store {store.url}",
            )
        )
    return store, model


@flow(name="fairpipe-fit", log_prints=False, task_runner=default_task_runner())
def fit_flow(store_url: str, options: FitOptions | None = None) -> dict:
    """Fit the clustering model of the store at ``store_url``: one commit."""
    o = options or FitOptions()
    t_start = time.perf_counter()
    store, _ = check_request(store_url, o)
    timings: dict[str, float] = {}
    with store.transaction(
        f"fit {o.model} n_clusters={o.n_clusters}", lock_timeout=o.lock_timeout
    ) as txn:
        # n, the chunks and the model kind are read inside the lock (a concurrent ingest may
        # have committed since the first check).
        attrs = store.attrs(txn.session)
        _, model = check_request(store_url, o, attrs)
        blocks, n_alive = RowBlocks.of(attrs), int(attrs["n_alive"])
        if model == "dc":
            params = o.dc_params()
            t0 = time.perf_counter()
            all_leaves = np.arange(int(o.fanout) ** int(o.height))
            got, c0, m0 = txn.reading(solve_leaves_task, blocks, params, all_leaves)
            timings["leaves"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            tree = grow_tree_task.submit(params, int(attrs["d"]), got, c0, m0).result()
            timings["parents"] = time.perf_counter() - t0
            fitted: DCKMeans | QKMeans = tree
            root_c, root_m = tree.centroids_, tree.masses_
            nodes = sum(level.shape[0] for level in tree.centroids_by_level_)
            extra: dict[str, float] = {"leaves": int(tree.n_leaves_), "nodes": int(nodes)}
            # The tree's objective is its root's: a second read of the rows, chunk by chunk.
            t0 = time.perf_counter()
            inertia = txn.reading(clustering_cost_task, blocks, root_c, root_m)
            timings["objective"] = time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            fitted = txn.reading(lambda fork: fit_q_task.submit(fork, o.q_params()).result())
            timings["lloyd"] = time.perf_counter() - t0
            assert isinstance(fitted, QKMeans)
            root_c, root_m = fitted.centroids_, fitted.sizes_[-1]
            inertia = float(fitted.inertia_)  # the model holds its points
            # Dry run on 200 live points: how many deletions will be answered without a retrain.
            extra = {
                "steps": int(fitted.c_out_.shape[0]),
                "certification_rate": fitted.certification_rate(),
            }
        write_model(txn.root, fitted)
        objective = {"inertia": inertia, "mean_squared_distance": inertia / max(n_alive, 1)}
        used = o.dc_params() if model == "dc" else o.q_params()  # the estimator's parameters
        record(txn, "fit", {"model": model, **used}, rows={"n_alive": n_alive}, figures=objective)
    timings["total"] = time.perf_counter() - t_start
    return {
        "store": store.url,
        "model": model,
        "n_clusters": o.n_clusters,
        "n_alive": n_alive,
        "commit": txn.commit_id,
        "centroids": root_c.tolist(),
        "masses": root_m.tolist(),
        # The k-means cost of the root centroids: scikit-learn's inertia_, and per live row.
        **objective,
        **extra,
        "timings": timings,
    }


def run_fit(
    store_url, options=None, dask_address=None, n_workers=2, processes=True, dask_cluster=None
) -> dict:
    o = options or FitOptions()
    check_request(str(store_url), o)  # bad input fails here, before a cluster starts
    return run_flow(fit_flow, str(store_url), o, dask_address=dask_address, n_workers=n_workers,
                    processes=processes, dask_cluster=dask_cluster)  # fmt: skip
