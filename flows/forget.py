"""Forget flow: one deletion batch in one commit.

Erase the rows (points zeroed, LSH keys overwritten, groups -1, alive = false), remove them from
the LSH buckets, and update the clustering model: for DC-k-means only the deleted rows' leaves are
recomputed (from their remaining points), then only those leaves' ancestors; a Q-k-means model
certifies each deletion from its metadata and retrains only when one is not certified. A fair
summary, if the store has one, is updated the same way as the DC tree (its leaves, then their
ancestors). An error anywhere leaves the store at its previous commit.

The rows stay erased in the new snapshot only: earlier snapshots still hold them until they are
expired and garbage-collected (``purge_history``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.cluster import DCKMeans, QKMeans
from fairpipe.datasets import NO_IDS
from fairpipe.errors import FairpipeInputError
from fairpipe.validation import IdLookup, deletion_request
from flows.fit import solve_leaf_group, solve_leaves_task, solve_parents_task
from flows.runtime import default_task_runner, reached_leaves, read_leaf_rows, run_flow
from flows.summarize import update_summary_after_forget
from storage.index import erase_rows, read_all_live, remove_from_index
from storage.models import read_model, write_model, write_tree_nodes
from storage.store import FairpipeStore, read_array

ALL_UNKNOWN = "None of the {n} ids to forget is in the store {url} (first: {first})."
NOT_INTEGER_IDS = "Ids to forget must be integers. Got values of type {dtype}."
# Up to this many rows in the leaves a deletion touches, the leaves and their ancestors are
# solved in the flow process: a Dask round trip (task, nested shuffle) costs seconds, the kernel
# milliseconds. Larger batches go to Dask.
LOCAL_LEAF_ROWS = 200_000


@dataclass
class ForgetOptions:
    lock_timeout: float = 0.0
    # Also drop every earlier snapshot and the objects only they used (storage.purge_history):
    # without it, time travel to an earlier snapshot still reads the erased rows.
    purge_history: bool = False


@task(name="update-q-kmeans", cache_policy=NO_CACHE)
def forget_q_task(session, ids_to_delete: np.ndarray) -> tuple[QKMeans, dict]:
    # The model was fitted on the live rows: rebuild it over them, then delete.
    X, ids = read_all_live(session)
    rows = {"points": X, "ids": ids, "alive": np.ones(ids.shape[0], bool)}
    model = read_model(session, "q", rows)
    assert isinstance(model, QKMeans)
    report = model.delete(ids_to_delete)
    return model, {
        "certified": report.certified,
        "certified_fraction": report.certified_fraction,
        "retrained": report.retrained,
    }


def _ids_array(ids) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(ids))
    if arr.size and arr.dtype.kind not in "iu":
        # A float id (1.5, or 2.0 from a careless caller) is never truncated to another person.
        raise FairpipeInputError(NOT_INTEGER_IDS.format(dtype=arr.dtype))
    return np.unique(arr.astype(np.int64))


@flow(name="fairpipe-forget", log_prints=False, task_runner=default_task_runner())
def forget_flow(store_url: str, ids, options: ForgetOptions | None = None) -> dict:
    """Forget ``ids`` in the store at ``store_url``: one commit (none if nothing changes)."""
    o = options or ForgetOptions()
    t_start = time.perf_counter()
    ids = _ids_array(ids)
    if ids.size == 0:
        raise FairpipeInputError(NO_IDS)
    store = FairpipeStore.open(store_url)
    store.require_data()
    timings: dict[str, float] = {}
    result: dict = {}
    with store.transaction(f"forget {ids.size} ids", lock_timeout=o.lock_timeout) as txn:
        attrs = store.attrs(txn.session)
        all_ids = read_array(txn.session, "ids")
        alive = read_array(txn.session, "alive")
        ids, known, rows, live = deletion_request(ids, IdLookup(all_ids), alive)
        if not known.any():
            raise FairpipeInputError(
                ALL_UNKNOWN.format(n=ids.size, url=store.url, first=int(ids[0]))
            )
        rows = np.sort(rows[live])
        result.update(
            deleted=ids[known][live].tolist(),
            unknown=ids[~known].tolist(),
            already_deleted=ids[known][~live].tolist(),
        )
        # The Q model needs the live points as they were fitted: read them before erasing.
        kind = attrs.get("model")
        q_session = store.readonly_session(txn.base_snapshot) if kind == "q" else None
        if rows.size:
            n_rows, chunk_rows = int(attrs["n"]), int(attrs["chunk_rows"])
            t0 = time.perf_counter()
            erase_rows(txn.session, txn.root, rows, chunk_rows)
            timings["erase"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            counts = remove_from_index(
                txn.session, txn.root, rows, int(attrs["lsh"]["n_tables"]), n_rows,
                int(alive.sum()),
            )  # fmt: skip
            timings["lsh_index"] = time.perf_counter() - t0
            result["buckets_per_table"] = float(counts.mean())
            alive_after = alive.copy()
            alive_after[rows] = False
            t0 = time.perf_counter()
            if kind == "dc":
                result.update(_forget_dc(txn, all_ids, alive_after, rows, n_rows, chunk_rows))
            elif kind == "q":
                model, report = forget_q_task.submit(q_session, all_ids[rows]).result()
                write_model(txn.root, model)
                result.update(report)
            timings["model"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            summary = update_summary_after_forget(
                txn, all_ids, alive_after, rows, n_rows, chunk_rows, LOCAL_LEAF_ROWS
            )
            if summary:
                result.update(summary)
                timings["summary"] = time.perf_counter() - t0
        result["model"] = kind
    if o.purge_history:
        t0 = time.perf_counter()
        result["purged"] = store.purge_history(lock_timeout=o.lock_timeout)
        timings["purge"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    return {"store": store.url, "commit": txn.commit_id, **result, "timings": timings}


def _forget_dc(txn, all_ids, alive_after, rows, n_rows, chunk_rows) -> dict:
    model = read_model(txn.session, "dc")
    assert isinstance(model, DCKMeans)
    params = model.get_params()
    centroids, masses = model.centroids_by_level_, model.masses_by_level_
    n_leaves, seed = model.n_leaves_, int(params["seed"])
    k, T = int(params["n_clusters"]), int(params["max_iter"])
    leaves, leaf_rows = reached_leaves(all_ids, alive_after, rows, seed, n_leaves)
    local = leaf_rows.size <= LOCAL_LEAF_ROWS
    if local:
        # Same functions as the Dask path (so the same bits), without its round trips.
        d = int(centroids[0].shape[2])
        parts = read_leaf_rows(txn.session, leaf_rows, chunk_rows, n_rows, seed, n_leaves, d)
        got, c, m = solve_leaf_group(leaves, k, T, seed, d, parts)
    else:
        fork = txn.fork()
        got, c, m = solve_leaves_task.submit(
            fork, n_rows, chunk_rows, params, leaves, leaf_rows
        ).result()
        txn.merge([fork])  # read only
    # Leaves left with no live row at all get no part: they become empty (zero mass).
    centroids[0][leaves] = 0.0
    masses[0][leaves] = 0.0
    centroids[0][got], masses[0][got] = c, m
    if local:
        centroids, masses, changed = solve_parents_task.fn(params, centroids, masses, leaves)
    else:
        centroids, masses, changed = solve_parents_task.submit(
            params, centroids, masses, leaves
        ).result()
    for level, nodes in enumerate(changed):
        write_tree_nodes(txn.root, level, nodes, centroids[level][nodes], masses[level][nodes])
    return {
        "leaves_recomputed": int(leaves.size),
        "nodes_recomputed": int(sum(n.size for n in changed)),
    }


def run_forget(store_url, ids, options=None, dask_address=None, n_workers=2, processes=True):
    return run_flow(forget_flow, str(store_url), ids, options or ForgetOptions(),
                    dask_address=dask_address, n_workers=n_workers, processes=processes)  # fmt: skip
