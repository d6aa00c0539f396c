"""Fit flow: the store's live points -> a DC-k-means tree (or a Q-k-means model) -> one commit.

DC-k-means runs on Dask: one job per row chunk reads its rows and splits them by leaf group (a
group is a run of consecutive leaves holding about ``LEAF_BATCH_POINTS`` points); one job per leaf
group gathers its parts from every chunk job (a shuffle: each worker holds only what passes
through it, never all points) and solves its leaves with the batched kernel; the parents (small:
``width * k`` weighted centroids each) are solved bottom-up in the flow. Every node's result
depends on its own inputs only, so the tree is identical whatever the chunking or worker count.

Q-k-means is a global Lloyd iteration over all points; it runs in the flow process on the live
points (its memory is n x d float64).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.dc_kmeans import (
    LEAF_BATCH_POINTS,
    DCKMeans,
    leaf_of,
    solve_leaves,
    solve_parents,
)
from fairpipe.errors import FairpipeInputError, check_one_of
from fairpipe.q_kmeans import QKMeans, choose_model
from flows.ingest import _default_task_runner, dask_client
from storage.store import FairpipeStore, read_array
from storage.tree import write_dc_tree, write_q_model

K_TOO_LARGE = "k = {k} is larger than the {n} live points of the store {url}."


@dataclass
class FitOptions:
    k: int = 8
    model: str = "dc"  # dc | q | auto
    width: int = 8
    height: int = 2
    iterations: int = 10
    n_init: int | None = None  # restarts: DC, of each internal node (10); Q, whole runs (1)
    seed: int = 0
    epsilon: float = 0.05
    gamma: float = 0.2
    lock_timeout: float = 0.0


def leaf_groups(n_leaves: int, n_alive: int) -> np.ndarray:
    """Edges of runs of consecutive leaves with about LEAF_BATCH_POINTS points each (>= 8 runs
    where there are that many leaves, so the work spreads over the workers)."""
    per_leaf = max(n_alive / max(n_leaves, 1), 1.0)
    size = max(1, min(int(LEAF_BATCH_POINTS // per_leaf), math.ceil(n_leaves / 8)))
    return np.append(np.arange(0, n_leaves, size), n_leaves)


# -- Dask jobs ------------------------------------------------------------------------------------
def _split_chunk(session, a: int, b: int, seed: int, n_leaves: int, edges: np.ndarray, rows=None):
    """Live rows of [a, b) (or only ``rows`` of it) split by leaf group:
    {group: (X, ids, leaf, groups)}."""
    ids = read_array(session, "ids", slice(a, b))
    alive = read_array(session, "alive", slice(a, b))
    keep = alive if rows is None else alive & np.isin(np.arange(a, b), rows)
    if not keep.any():
        return {}
    X = read_array(session, "points", slice(a, b))[keep]
    colours = read_array(session, "groups", slice(a, b))[keep]
    ids = ids[keep]
    leaf = leaf_of(ids, seed, n_leaves)
    group = np.searchsorted(edges, leaf, side="right") - 1
    return {
        int(g): (X[group == g], ids[group == g], leaf[group == g], colours[group == g])
        for g in np.unique(group)
    }


def _gather(d: int, given) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One leaf group's parts from every chunk job, concatenated: (X, ids, leaf, groups)."""
    parts = [p for p in given if p is not None]
    if not parts:
        z = np.zeros(0, np.int64)
        return np.zeros((0, d), np.float32), z, z, z.astype(np.int32)
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(4))  # type: ignore[return-value]


def _solve_group(leaves, k, iterations, seed, d, *given):
    X, ids, leaf, _ = _gather(d, given)
    mine = np.isin(leaf, leaves)
    return leaves, *solve_leaves(X[mine], ids[mine], leaf[mine], leaves, k, iterations, seed)


def shuffle_by_leaf(session, n_rows, chunk_rows, seed, n_leaves, leaves_wanted, solve, args,
                    rows=None) -> list:  # fmt: skip
    """Run ``solve(leaves, *args, d, *parts)`` on Dask for every leaf group of ``leaves_wanted``
    (sorted): one job per row chunk splits its live rows (or only ``rows``) by leaf group, one job
    per leaf group gathers its parts (a shuffle). Returns the jobs' results, in group order."""
    d = int(read_array(session, "points", slice(0, 1)).shape[1])
    edges = leaf_groups(n_leaves, n_rows)
    group_of = np.searchsorted(edges, leaves_wanted, side="right") - 1
    chunks = [(a, min(a + chunk_rows, n_rows)) for a in range(0, n_rows, chunk_rows)]
    if rows is not None:  # only the chunks holding rows of interest
        chunks = [(a, b) for a, b in chunks if ((rows >= a) & (rows < b)).any()]
    with dask_client() as client:
        split = [
            client.submit(_split_chunk, session, a, b, seed, n_leaves, edges, rows, pure=False)
            for a, b in chunks
        ]
        jobs = []
        for g in np.unique(group_of):
            parts = [client.submit(_pick, s, int(g), pure=False) for s in split]
            leaves = leaves_wanted[group_of == g]
            jobs.append(client.submit(solve, leaves, *args, d, *parts, pure=False))
        return client.gather(jobs)


def solve_leaf_groups(session, n_rows, chunk_rows, params, n_leaves, leaves_wanted, rows=None):
    """Solve ``leaves_wanted`` (sorted) on Dask with a shuffle by leaf group; returns
    (leaves, centroids, masses) in ``leaves_wanted`` order."""
    seed, k, T = int(params["seed"]), int(params["n_clusters"]), int(params["iterations"])
    results = shuffle_by_leaf(
        session, n_rows, chunk_rows, seed, n_leaves, leaves_wanted, _solve_group, (k, T, seed),
        rows,
    )  # fmt: skip
    if not results:
        d = int(read_array(session, "points", slice(0, 1)).shape[1])
        return leaves_wanted, np.zeros((0, k, d)), np.zeros((0, k))
    leaves = np.concatenate([r[0] for r in results])
    order = np.argsort(leaves)
    return (
        leaves[order],
        np.concatenate([r[1] for r in results])[order],
        np.concatenate([r[2] for r in results])[order],
    )


def _pick(parts: dict, g: int):
    return parts.get(g)


# -- Prefect tasks --------------------------------------------------------------------------------
@task(name="solve-leaves", cache_policy=NO_CACHE)
def solve_leaves_task(session, n_rows, chunk_rows, params, n_leaves, leaves, rows=None):
    return solve_leaf_groups(session, n_rows, chunk_rows, params, n_leaves, leaves, rows)


@task(name="solve-parents", cache_policy=NO_CACHE)
def solve_parents_task(params, centroids, masses, changed_leaves):
    """Recompute the ancestors of ``changed_leaves`` level by level; returns (centroids, masses,
    nodes recomputed per level). The task may run on a worker: it returns what it changed."""
    w, k = int(params["width"]), int(params["n_clusters"])
    changed = [changed_leaves]
    for level in range(1, int(params["height"]) + 1):
        nodes = np.unique(changed[-1] // w)
        children = (nodes[:, None] * w + np.arange(w)).ravel()
        c, m = solve_parents(
            centroids[level - 1][children], masses[level - 1][children], nodes, level, w, k,
            int(params["iterations"]), int(params["n_init"]), int(params["seed"]),
        )  # fmt: skip
        centroids[level][nodes], masses[level][nodes] = c, m
        changed.append(nodes)
    return centroids, masses, changed


@task(name="fit-q-kmeans", cache_policy=NO_CACHE)
def fit_q_task(session, params):
    alive = read_array(session, "alive")
    X = read_array(session, "points")
    ids = read_array(session, "ids")
    model = QKMeans(**params)
    model.fit(X[alive], ids=ids[alive])
    return model


# -- the flow -------------------------------------------------------------------------------------
@flow(name="fairpipe-fit", log_prints=False, task_runner=_default_task_runner())
def fit_flow(store_url: str, options: FitOptions | None = None) -> dict:
    """Fit the clustering model of the store at ``store_url``: one commit."""
    o = options or FitOptions()
    t_start = time.perf_counter()
    model = check_one_of(o.model, ("dc", "q", "auto"), "model", "fit")
    store = FairpipeStore.open(store_url)
    attrs = store.require_data()
    n_alive, d = int(attrs["n_alive"]), int(attrs["d"])
    if model == "auto":
        model = choose_model(n_alive, d, o.k)
    dc_params = dict(
        n_clusters=o.k, width=o.width, height=o.height, iterations=o.iterations,
        n_init=10 if o.n_init is None else o.n_init, seed=o.seed,
    )  # fmt: skip
    q_params = dict(
        n_clusters=o.k, epsilon=o.epsilon, gamma=o.gamma, iterations=o.iterations,
        n_init=1 if o.n_init is None else o.n_init, seed=o.seed,
    )  # fmt: skip
    # Validate every parameter before anything is read or written.
    if model == "dc":
        DCKMeans(**dc_params)._check_params()
    else:
        QKMeans(**q_params)._check_params()
    if o.k > n_alive:
        raise FairpipeInputError(K_TOO_LARGE.format(k=o.k, n=n_alive, url=store.url))
    timings: dict[str, float] = {}
    with store.transaction(f"fit {model} k={o.k}", lock_timeout=o.lock_timeout) as txn:
        n_rows, chunk_rows = int(attrs["n"]), int(attrs["chunk_rows"])
        if model == "dc":
            t0 = time.perf_counter()
            n_leaves = int(o.width) ** int(o.height)
            all_leaves = np.arange(n_leaves)
            fork = txn.fork()
            _, c0, m0 = solve_leaves_task.submit(
                fork, n_rows, chunk_rows, dc_params, n_leaves, all_leaves
            ).result()
            txn.merge([fork])  # read only; merged so the transaction may commit
            timings["leaves"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            centroids = [c0] + [
                np.zeros((n_leaves // o.width**j, o.k, d)) for j in range(1, o.height + 1)
            ]
            masses = [m0] + [
                np.zeros((n_leaves // o.width**j, o.k)) for j in range(1, o.height + 1)
            ]
            centroids, masses, _ = solve_parents_task.submit(
                dc_params, centroids, masses, all_leaves
            ).result()
            timings["parents"] = time.perf_counter() - t0
            write_dc_tree(txn.root, {"model": "dc", **dc_params}, centroids, masses)
            root_c, root_m = centroids[-1][0], masses[-1][0]
            extra = {"leaves": n_leaves, "nodes": sum(c.shape[0] for c in centroids)}
        else:
            t0 = time.perf_counter()
            fork = txn.fork()
            qm = fit_q_task.submit(fork, q_params).result()
            txn.merge([fork])
            arrays, scalars = qm.state()
            write_q_model(txn.root, {"model": "q", **q_params}, arrays, scalars)
            timings["lloyd"] = time.perf_counter() - t0
            root_c, root_m = qm.centroids_, qm.sizes_[-1]
            # Dry run on 200 live points: how many deletions will be answered without a retrain.
            extra = {
                "steps": int(qm.c_out_.shape[0]),
                "certification_rate": qm.certification_rate(),
            }
        txn.root.attrs["model"] = model
    timings["total"] = time.perf_counter() - t_start
    return {
        "store": store.url,
        "model": model,
        "k": o.k,
        "n_alive": n_alive,
        "commit": txn.commit_id,
        "centroids": root_c.tolist(),
        "masses": root_m.tolist(),
        **extra,
        "timings": timings,
    }


def run_fit(store_url, options=None, dask_address=None, n_workers=2, processes=True) -> dict:
    from flows.runtime import prefect_api, task_runner

    with prefect_api():
        runner = task_runner(dask_address, n_workers=n_workers, processes=processes)
        return fit_flow.with_options(task_runner=runner)(str(store_url), options or FitOptions())
