"""Forget flow: deletion requests drained in batches, one commit per batch.

``forget_flow(store, ids)`` files the ids as a request (:mod:`fairpipe.storage.queue`), then drains the
queue; ``forget_flow(store)`` only drains. The drain (:mod:`fairpipe.storage.drain`) takes the
requests oldest first, in batches of whole requests up to ``max_batch`` ids, each applied
exactly once with its receipt; this flow applies each batch (:func:`_apply_batch`) to every
artifact, in one commit.

In each batch:
Erase the rows (points and sketch zeroed, groups -1, alive = false), remove them from the LSH
buckets (only the segments holding them are rewritten; their keys are recomputed from their
points), and update the clustering model: for DC-k-means only the deleted rows' leaves are
recomputed (from their remaining points), then only those leaves' ancestors; a Q-k-means model
certifies each deletion from its metadata and retrains only when one is not certified. A fair
summary, if the store has one, is updated the same way as the DC tree (its leaves, then their
ancestors). An error anywhere leaves the store at its previous commit.

Earlier snapshots still hold the erased rows until the store's ``erasure_retention`` (default 0)
has passed: the drain then expires them and garbage-collects the objects only they used, and
the receipts record ``erased_at`` (:mod:`fairpipe.storage.erasure`; ``purge_history`` does it now,
whatever the retention).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from prefect.cache_policies import NO_CACHE

from fairpipe.datasets import NO_IDS
from fairpipe.errors import FairpipeInputError
from fairpipe.flows import update
from fairpipe.flows.checks import ALL_UNKNOWN
from fairpipe.flows.dask_map import dask_map
from fairpipe.flows.jobs import remove_job
from fairpipe.flows.options import ForgetOptions
from fairpipe.flows.private import flow, task
from fairpipe.flows.task_runner import default_task_runner, run_flow, start_cluster_early
from fairpipe.flows.update import forget_q_task, update_dc, update_summary_tree
from fairpipe.settings import FORGET, check_settings
from fairpipe.storage.drain import drain as drain_queue
from fairpipe.storage.drain import filed
from fairpipe.storage.erasure import erase_due
from fairpipe.storage.formats import upgrade_format1
from fairpipe.storage.layers import layer_bits, load_lsh
from fairpipe.storage.lineage import operation_name, record
from fairpipe.storage.models import write_model
from fairpipe.storage.queue import (
    Request,
    has_queue,
    new_request,
)
from fairpipe.storage.receipts import REQUESTS_KEY, mark_forgotten, read_receipts, write_receipts
from fairpipe.storage.rows import RowBlocks, erase_rows, read_alive
from fairpipe.storage.segments import (
    buckets_per_table,
    keys_of_rows,
    table_blocks,
    update_index,
    write_removal,
)
from fairpipe.storage.store import FairpipeStore
from fairpipe.validation import IdLookup, as_id_array, check_ids, deletion_request

# A batch of at least this many rows rewrites the index as Dask jobs over blocks of tables (it
# reaches most segments of every table: 1,000 ids at 1M touch all of them); a smaller one is
# rewritten by the flow itself (a one-id forget touches one segment per table).
DISTRIBUTED_INDEX_ROWS = 256


@task(name="update-bucket-index", cache_policy=NO_CACHE)
def update_index_task(fork, attrs: dict, rows: np.ndarray, keys: np.ndarray, blocks: list) -> list:
    """The batch's rows removed from the index, a Dask job per block of tables (``keys``: the
    rows' bucket keys (r, L), computed by the flow before the rows were erased). The rows and
    each block's keys are sent to the cluster once, not copied into the task graph (the keys of
    50,000 rows made a 38 MB graph, and Dask warned)."""
    n = len(blocks)
    return dask_map(remove_job, [fork] * n, [attrs] * n, [rows] * n,
                    [keys[:, a:b] for a, b in blocks], [a for a, _ in blocks],
                    [b for _, b in blocks], scatter=(2, 3))  # fmt: skip


def _ids_array(ids) -> np.ndarray:
    # The one rule of ids: a float id is never truncated to another person (1.5 is refused).
    return np.unique(check_ids(np.atleast_1d(as_id_array(ids)), "the ids to forget"))


@flow(name="fairpipe-forget", log_prints=False, task_runner=default_task_runner(),
      private=("ids",))  # fmt: skip
def forget_flow(store_url: str, ids=None, options: ForgetOptions | None = None) -> dict:
    """File ``ids`` as a deletion request (if given), then drain the store's queue: one commit
    per batch. Ids none of which the store holds are an error, and nothing is filed."""
    o = options or ForgetOptions()
    check_settings("forget", FORGET, o)
    t_start = time.perf_counter()
    store = FairpipeStore.open(store_url)
    store.require_data()
    extra: list[Request] = []
    if ids is not None:
        ids = _ids_array(ids)
        if ids.size == 0:
            raise FairpipeInputError(NO_IDS)
        tip = store.readonly_session().snapshot_id
        if not IdLookup(store.ids_at(tip)).rows(ids)[1].any():
            raise FairpipeInputError(
                ALL_UNKNOWN.format(n=ids.size, url=store.url, first=int(ids[0]))
            )
        if has_queue(store.url):
            with filed(store, ids, o):  # under the writer lock: the drain applies it next
                return _drain_and_erase(store, o, [], t_start)
        # No queue beside a memory:// store: applied at once, with its receipt.
        extra.append(new_request(ids, o.reason))
    return _drain_and_erase(store, o, extra, t_start)


def drain(store: FairpipeStore, o: ForgetOptions, extra: list[Request],
          on_batch: Callable[[int, int], None] | None = None) -> dict:  # fmt: skip
    """Apply the pending requests (and ``extra``) in batches, each one commit made by
    :func:`_apply_batch` (:func:`fairpipe.storage.drain.drain`)."""
    return drain_queue(store, o, extra, lambda batch: _apply_batch(store, batch, o), on_batch)


def _drain_and_erase(store: FairpipeStore, o: ForgetOptions, extra: list[Request],
                     t_start: float) -> dict:  # fmt: skip
    result = drain(store, o, extra)
    t0 = time.perf_counter()
    erased = erase_due(store, o.lock_timeout, now_all=o.purge_history)
    if erased is not None:
        result["erasure"] = erased
        if o.purge_history:
            result["purged"] = erased
        result["timings"]["erasure"] = time.perf_counter() - t0
    result["timings"]["total"] = time.perf_counter() - t_start
    return result


def _apply_batch(store: FairpipeStore, batch: list[Request], o: ForgetOptions) -> dict | None:
    """One commit: the batch's ids erased from every artifact, and the requests' receipts."""
    rids = ",".join(r.request_id for r in batch)
    n_ids = sum(int(r.ids.size) for r in batch)
    timings: dict[str, float] = {}
    result: dict = {}
    message = f"forget {n_ids} ids ({len(batch)} requests)"
    with store.transaction(message, lock_timeout=o.lock_timeout,
                           metadata={REQUESTS_KEY: rids}) as txn:  # fmt: skip
        receipts = read_receipts(txn.session)
        done = {r["request"] for r in receipts}
        batch = [r for r in batch if r.request_id not in done]  # checked under the lock
        if not batch:
            return None
        ids = np.concatenate([r.ids for r in batch])
        attrs = store.attrs(txn.session)
        all_ids = store.ids_at(txn.base_snapshot)  # nothing written yet in this transaction
        alive = read_alive(txn.session)
        lookup = IdLookup(all_ids)
        ids, known, rows, live = deletion_request(ids, lookup, alive)
        receipts += [
            {"request": r.request_id, "n_ids": int(np.unique(r.ids).size),
             "not_found": np.unique(r.ids[~lookup.rows(r.ids)[1]]).tolist(), "reason": r.reason,
             "requested_at": r.requested_at, "applied_at": None, "commit": None,
             "erased_at": None}
            for r in batch
        ]  # fmt: skip
        write_receipts(txn.root, receipts)
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
            row_blocks = RowBlocks.of(attrs)
            attrs = upgrade_format1(txn.session, txn.root, attrs)
            t0 = time.perf_counter()
            distributed = rows.size >= DISTRIBUTED_INDEX_ROWS
            if distributed:  # the embedded cluster starts while the rows are erased
                start_cluster_early()
            # The rows' bucket keys come from their points, read (only the chunks holding them)
            # and hashed here before they are erased: at most max_batch rows.
            keys = keys_of_rows(txn.session, load_lsh(txn.session, attrs), rows)
            erase_rows(txn.session, txn.root, rows)
            mark_forgotten(
                txn.session,
                txn.root,
                row_blocks.n,
                rows,
                _receipt_of_rows(batch, lookup, rows, len(receipts) - len(batch)),
            )
            timings["erase"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            if distributed:
                blocks = table_blocks(int(attrs["lsh"]["n_tables"]), int(attrs["n"]))
                parts = update_index_task(txn.fork(), attrs, rows, keys, blocks)
                txn.merge([fork for fork, _ in parts])
                removed = write_removal(txn.session, txn.root, [part for _, part in parts])
            else:
                removed = update_index(txn.session, txn.root, attrs, rows, keys)
            result["segments_rewritten"] = removed
            timings["lsh_index"] = time.perf_counter() - t0
            result["buckets_per_table"] = buckets_per_table(txn.session, layer_bits(attrs))
            alive_after = alive.copy()
            alive_after[rows] = False
            t0 = time.perf_counter()
            if kind == "dc":
                result.update(
                    update_dc(txn, all_ids, alive_after, rows, row_blocks, update.LOCAL_LEAF_ROWS)
                )  # fmt: skip
            elif kind == "q":
                model, report = forget_q_task.submit(q_session, all_ids[rows]).result()
                write_model(txn.root, model)
                result.update(report)
            timings["model"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            summary = update_summary_tree(
                txn, all_ids, alive_after, rows, row_blocks, update.LOCAL_LEAF_ROWS
            )
            if summary:
                result.update(summary)
                timings["summary"] = time.perf_counter() - t0
        # Counts only: which ids, and why, stay in the receipts and the erased rows.
        record(txn, operation_name("drain"), {"requests": len(batch), "max_batch": o.max_batch},
               rows={"ids": int(ids.size), "erased": int(rows.size),
                     "unknown": int((~known).sum()), "already_forgotten": int((~live).sum()),
                     "n_alive": int(attrs["n_alive"]) - int(rows.size)})  # fmt: skip
        result["model"] = kind
    result["requests"] = [r.request_id for r in batch]
    return {"commit": txn.commit_id, **result, "timings": timings}


def _receipt_of_rows(batch: list[Request], lookup: IdLookup, rows: np.ndarray,
                     first: int) -> np.ndarray:  # fmt: skip
    """For each of ``rows`` (sorted), the position in the receipt list of the first request of
    ``batch`` naming its id (the batch's receipts start at ``first``)."""
    which = np.full(rows.size, -1, dtype=np.int64)
    for j in range(len(batch) - 1, -1, -1):  # the first request naming a row wins
        found, _ = lookup.rows(np.unique(batch[j].ids))
        pos = np.searchsorted(rows, found)
        hit = (pos < rows.size) & (rows[np.minimum(pos, rows.size - 1)] == found)
        which[pos[hit]] = first + j
    return which


def run_forget(store_url, ids=None, options=None, dask_address=None, n_workers=2,
               processes=True, dask_cluster=None):  # fmt: skip
    return run_flow(forget_flow, str(store_url), ids, options or ForgetOptions(),
                    dask_address=dask_address, n_workers=n_workers, processes=processes, dask_cluster=dask_cluster)  # fmt: skip
