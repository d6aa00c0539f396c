"""Forget flow: one deletion batch in one commit.

Erase the rows (points zeroed, groups -1, alive = false), remove them from the LSH buckets (only
the segments holding them are rewritten; their keys are recomputed from their points), and
update the clustering model: for DC-k-means only the deleted rows' leaves are
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
from prefect import flow

from fairpipe.datasets import NO_IDS
from fairpipe.errors import FairpipeInputError
from fairpipe.validation import IdLookup, deletion_request
from flows import update
from flows.runtime import default_task_runner, run_flow
from flows.update import forget_q_task, update_dc, update_summary_tree
from storage.index import (
    buckets_per_table,
    erase_rows,
    keys_of_rows,
    load_lsh,
    update_index,
    upgrade_format1,
)
from storage.models import write_model
from storage.store import FairpipeStore, read_array

ALL_UNKNOWN = "None of the {n} ids to forget is in the store {url} (first: {first})."
NOT_INTEGER_IDS = "Ids to forget must be integers. Got values of type {dtype}."


@dataclass
class ForgetOptions:
    lock_timeout: float = 0.0
    # Also drop every earlier snapshot and the objects only they used (storage.purge_history):
    # without it, time travel to an earlier snapshot still reads the erased rows.
    purge_history: bool = False


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
            attrs = upgrade_format1(txn.session, txn.root, attrs)
            t0 = time.perf_counter()
            # The rows' bucket keys, from their points (read before they are erased).
            keys = keys_of_rows(txn.session, load_lsh(txn.session, attrs), rows)
            erase_rows(txn.session, txn.root, rows, chunk_rows)
            timings["erase"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            result["segments_rewritten"] = update_index(txn.session, txn.root, attrs, rows, keys)
            timings["lsh_index"] = time.perf_counter() - t0
            result["buckets_per_table"] = buckets_per_table(txn.session)
            alive_after = alive.copy()
            alive_after[rows] = False
            t0 = time.perf_counter()
            if kind == "dc":
                result.update(
                    update_dc(txn, all_ids, alive_after, rows, n_rows, chunk_rows,
                              update.LOCAL_LEAF_ROWS)
                )  # fmt: skip
            elif kind == "q":
                model, report = forget_q_task.submit(q_session, all_ids[rows]).result()
                write_model(txn.root, model)
                result.update(report)
            timings["model"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            summary = update_summary_tree(
                txn, all_ids, alive_after, rows, n_rows, chunk_rows, update.LOCAL_LEAF_ROWS
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


def run_forget(store_url, ids, options=None, dask_address=None, n_workers=2, processes=True):
    return run_flow(forget_flow, str(store_url), ids, options or ForgetOptions(),
                    dask_address=dask_address, n_workers=n_workers, processes=processes)  # fmt: skip
