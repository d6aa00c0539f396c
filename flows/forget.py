"""Forget flow: one deletion batch in one commit.

Erase the rows (points zeroed, LSH keys overwritten, groups -1, alive = false), remove them from
the LSH buckets, and update the clustering model: for DC-k-means only the deleted rows' leaves are
recomputed (from their remaining points), then only those leaves' ancestors; a Q-k-means model
certifies each deletion from its metadata and retrains only when one is not certified. A fair
summary, if the store has one, is updated the same way as the DC tree (its leaves, then their
ancestors). An error anywhere leaves the store at its previous commit.

The rows stay erased in the new snapshot only: earlier snapshots still hold them until they are
expired and garbage-collected (not done by this flow yet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.dc_kmeans import leaf_of
from fairpipe.errors import FairpipeInputError
from fairpipe.q_kmeans import QKMeans
from fairpipe.validation import IdLookup, deletion_request
from flows.fit import _solve_group, _split_chunk, solve_leaves_task, solve_parents_task
from flows.ingest import _default_task_runner, remove_from_index
from flows.summarize import update_summary_after_forget
from storage.store import FairpipeStore, read_array, write_rows
from storage.tree import read_dc_tree, read_q_model, update_dc_nodes, write_q_model

ALL_UNKNOWN = "None of the {n} ids to forget is in the store {url} (first: {first})."
NO_IDS = "No ids to forget: give --ids 1,2,3 or --ids-file FILE."
BAD_ID = "Id {value!r} in {where} is not an integer."
NO_FILE = "The ids file {path} does not exist."
EMPTY_FILE = "The ids file {path} holds no ids."
ERASED_KEY = np.iinfo(np.uint64).max


@dataclass
class ForgetOptions:
    lock_timeout: float = 0.0
    # Also drop every earlier snapshot and the objects only they used (storage.purge_history):
    # without it, time travel to an earlier snapshot still reads the erased rows.
    purge_history: bool = False


def parse_ids(text: str | None = None, path: str | None = None) -> np.ndarray:
    """Ids from '1,2,3' or from a file (.npy, or text with one id per line / comma separated)."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FairpipeInputError(NO_FILE.format(path=path))
        if p.suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
            if arr.size and arr.dtype.kind not in "iu":
                raise FairpipeInputError(BAD_ID.format(value=arr.ravel()[0], where=path))
            ids = arr.ravel().astype(np.int64)
        else:
            tokens = p.read_text().replace(",", "\n").split()
            ids = _ints(tokens, path)
        if ids.size == 0:
            raise FairpipeInputError(EMPTY_FILE.format(path=path))
        return ids
    if text is None or not text.strip():
        raise FairpipeInputError(NO_IDS)
    return _ints([t for t in text.split(",") if t.strip()], "--ids")


def _ints(tokens, where) -> np.ndarray:
    out = []
    for t in tokens:
        try:
            out.append(int(t.strip()))
        except ValueError:
            raise FairpipeInputError(BAD_ID.format(value=t.strip(), where=where)) from None
    return np.array(out, dtype=np.int64)


def _erase(txn, rows: np.ndarray, chunk_rows: int) -> None:
    """Zero the points, overwrite the keys and groups, clear alive of ``rows``, chunk by chunk."""
    for c in np.unique(rows // chunk_rows):
        a = int(c) * chunk_rows
        sel = rows[(rows >= a) & (rows < a + chunk_rows)] - a
        b = a + chunk_rows
        erased = (("points", 0.0), ("lsh/keys", ERASED_KEY), ("groups", -1), ("alive", False))
        for name, value in erased:
            block = read_array(txn.session, name, slice(a, b))
            block[sel] = value
            write_rows(txn.session, name, a, block)


@task(name="update-q-kmeans", cache_policy=NO_CACHE)
def forget_q_task(session, attrs_q, arrays, rows):
    params = {k: attrs_q[k] for k in QKMeans().params() if k in attrs_q}
    alive = read_array(session, "alive")
    X = read_array(session, "points")
    ids = read_array(session, "ids")
    # The model was fitted on the live rows: rebuild it over them, then delete.
    model = QKMeans.from_state(
        params, arrays, attrs_q, X[alive], ids[alive], np.ones(int(alive.sum()), bool)
    )
    report = model.delete(ids[rows])
    return model, report


@flow(name="fairpipe-forget", log_prints=False, task_runner=_default_task_runner())
def forget_flow(store_url: str, ids, options: ForgetOptions | None = None) -> dict:
    """Forget ``ids`` in the store at ``store_url``: one commit (none if nothing changes)."""
    o = options or ForgetOptions()
    t_start = time.perf_counter()
    ids = np.unique(np.asarray(ids, dtype=np.int64))
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
            _erase(txn, rows, chunk_rows)
            txn.root.attrs["n_alive"] = int(attrs["n_alive"]) - int(rows.size)
            timings["erase"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            counts = remove_from_index(
                txn, rows, int(attrs["lsh"]["n_tables"]), n_rows, int(alive.sum())
            )
            timings["lsh_index"] = time.perf_counter() - t0
            result["buckets_per_table"] = float(counts.mean())
            t0 = time.perf_counter()
            if kind == "dc":
                result.update(_forget_dc(txn, all_ids, alive, rows, n_rows, chunk_rows))
            elif kind == "q":
                model, report = forget_q_task.submit(
                    q_session, *read_q_model(q_session), rows
                ).result()
                arrays, scalars = model.state()
                write_q_model(txn.root, {"model": "q", **model.params()}, arrays, scalars)
                result.update(
                    certified=report.certified,
                    certified_fraction=report.certified_fraction,
                    retrained=report.retrained,
                )
            timings["model"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            alive_after = alive.copy()
            alive_after[rows] = False
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


# Up to this many rows in the leaves a deletion touches, the leaves and their ancestors are
# solved in the flow process: a Dask round trip (task, nested shuffle) costs seconds, the kernel
# milliseconds. Larger batches go to Dask.
LOCAL_LEAF_ROWS = 200_000


def _forget_dc(txn, all_ids, alive_before, rows, n_rows, chunk_rows) -> dict:
    params, centroids, masses = read_dc_tree(txn.session)
    n_leaves = int(params["width"]) ** int(params["height"])
    leaf_all = leaf_of(all_ids, int(params["seed"]), n_leaves)
    leaves = np.unique(leaf_all[rows])
    alive = alive_before.copy()
    alive[rows] = False
    leaf_rows = np.flatnonzero(alive & np.isin(leaf_all, leaves))
    local = leaf_rows.size <= LOCAL_LEAF_ROWS
    if local:
        # Same functions as the Dask path (so the same bits), without its round trips.
        seed, k, T = int(params["seed"]), int(params["n_clusters"]), int(params["iterations"])
        chunks = np.unique(leaf_rows // chunk_rows) * chunk_rows
        parts = [
            _split_chunk(txn.session, int(a), min(int(a) + chunk_rows, n_rows), seed, n_leaves,
                         np.zeros(1, np.int64), leaf_rows).get(0)
            for a in chunks
        ]  # fmt: skip
        d = int(centroids[0].shape[2])
        got, c, m = _solve_group(leaves, k, T, seed, d, *parts)
    else:
        fork = txn.fork()
        got, c, m = solve_leaves_task.submit(
            fork, n_rows, chunk_rows, params, n_leaves, leaves, leaf_rows
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
        update_dc_nodes(txn.root, level, nodes, centroids[level][nodes], masses[level][nodes])
    return {
        "leaves_recomputed": int(leaves.size),
        "nodes_recomputed": int(sum(n.size for n in changed)),
    }


def run_forget(store_url, ids, options=None, dask_address=None, n_workers=2, processes=True):
    from flows.runtime import prefect_api, task_runner

    with prefect_api():
        runner = task_runner(dask_address, n_workers=n_workers, processes=processes)
        return forget_flow.with_options(task_runner=runner)(
            str(store_url), ids, options or ForgetOptions()
        )
