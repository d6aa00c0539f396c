"""Forget flow: deletion requests drained in batches, one commit per batch.

``forget_flow(store, ids)`` files the ids as a request (:mod:`fairpipe.storage.queue`), then drains the
queue; ``forget_flow(store)`` only drains. Each batch (whole requests, oldest first, up to
``max_batch`` ids) is one commit that applies it to every artifact and adds the requests'
receipts (:mod:`fairpipe.storage.receipts`); a request already receipted is skipped, so a rerun after a
crash at any point applies each request exactly once. Applied request objects are deleted after
their commit, and a last small commit writes each receipt's commit id.

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

import contextlib
import time
from collections.abc import Callable

import numpy as np
from prefect.cache_policies import NO_CACHE

from fairpipe.datasets import NO_IDS
from fairpipe.errors import FairpipeInputError, note_outcome
from fairpipe.flows import update
from fairpipe.flows.checks import ALL_UNKNOWN
from fairpipe.flows.dask_map import dask_map
from fairpipe.flows.jobs import remove_job
from fairpipe.flows.options import ForgetOptions
from fairpipe.flows.private import flow, task
from fairpipe.flows.task_runner import default_task_runner, run_flow, start_cluster_early
from fairpipe.flows.update import forget_q_task, update_dc, update_summary_tree
from fairpipe.settings import FORGET, check_settings
from fairpipe.storage.erasure import erase_due
from fairpipe.storage.formats import upgrade_format1
from fairpipe.storage.layers import layer_bits, load_lsh
from fairpipe.storage.lineage import operation_name, record
from fairpipe.storage.lock import StoreBusyError
from fairpipe.storage.models import write_model
from fairpipe.storage.queue import (
    MalformedRequest,
    Request,
    delete_requests,
    file_request,
    has_queue,
    new_request,
    pending,
    set_aside,
    sweep_abandoned,
    unrecognised,
)
from fairpipe.storage.queue import read_request as read_queued
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

NO_PROGRESS = "A drain of {url} came back to requests it had already applied ({rids})."


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


WITHDRAWN = "the request for these {n} ids is withdrawn: nothing of it is applied"
NOT_FILED = "no request for these {n} ids is filed: nothing of it is applied"
KEPT = (
    "the request {rid} for these {n} ids stays filed: the next drain applies it ('fairpipe "
    "status --store {url}' lists it)"
)


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
            with _filed(store, ids, o):  # under the writer lock: the drain applies it next
                return _drain_and_erase(store, o, [], t_start)
        # No queue beside a memory:// store: applied at once, with its receipt.
        extra.append(new_request(ids, o.reason))
    return _drain_and_erase(store, o, extra, t_start)


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


@contextlib.contextmanager
def _filed(store: FairpipeStore, ids: np.ndarray, o: ForgetOptions):
    """File ``ids`` as a request while holding the store's writer lock for the block (the drain
    that applies it), so that no other drain can apply it meanwhile. If the block cannot apply
    it (or the lock is busy), the request is withdrawn, or kept filed (``o.unapplied``), and the
    error says which (:func:`fairpipe.errors.note_outcome`): nothing is applied later without
    the user being told."""
    n = int(ids.size)
    try:
        lock = store.writer_lock(o.lock_timeout)
        lock.__enter__()
    except BaseException as refused:  # busy, or the lock's note refused (a full disk)
        if isinstance(refused, StoreBusyError) and o.unapplied == "keep":
            request = file_request(store.url, ids, o.reason)
            note_outcome(refused, KEPT.format(rid=request.request_id, n=n, url=store.url))
        else:
            note_outcome(refused, NOT_FILED.format(n=n))
        raise
    try:
        tip = store.repo.lookup_branch("main")
        try:
            request = file_request(store.url, ids, o.reason)  # durable: a crash leaves it
        except BaseException as failed:
            note_outcome(failed, NOT_FILED.format(n=n))
            raise
        try:
            yield request
        except BaseException as failed:
            if not _applied(store, request.request_id, tip):
                if o.unapplied == "keep":
                    note_outcome(failed, KEPT.format(rid=request.request_id, n=n, url=store.url))
                else:
                    delete_requests(store.url, [request.request_id])
                    note_outcome(failed, WITHDRAWN.format(n=n))
            raise
    finally:
        lock.__exit__(None, None, None)


def _applied(store: FairpipeStore, request_id: str, tip: str) -> bool:
    """Whether the request ``request_id`` has a receipt (``tip``: ``main`` when it was filed;
    unmoved, nothing was applied since)."""
    try:
        if store.repo.lookup_branch("main") == tip:
            return False
        return any(r["request"] == request_id for r in read_receipts(store.readonly_session()))
    except Exception:  # the store cannot say (damaged): a batch was committed, so leave it be
        return True


def drain(store: FairpipeStore, o: ForgetOptions, extra: list[Request],
          on_batch: Callable[[int, int], None] | None = None) -> dict:  # fmt: skip
    """Apply the pending requests (and ``extra``), oldest first, in batches of whole requests
    up to ``o.max_batch`` ids; returns the merged result of the batches. ``on_batch(applied,
    waiting)`` is called before the first batch and after each: ids applied so far, ids
    still waiting."""
    merged: dict = {"store": store.url, "commit": None, "deleted": [], "unknown": [],
                    "already_deleted": [], "requests": [], "batches": [],
                    "set_aside": []}  # fmt: skip
    timings: dict[str, float] = {}
    n_applied = 0
    cache: dict[str, Request] = {}
    # Bound: every round applies at least one request no earlier round tried (a round that
    # would retry only tried ones is a bug, raised as one), so a drain ends once the queue is
    # empty, after at most as many rounds as requests were filed.
    tried: set[str] = set()
    while True:
        applied = {r["request"] for r in read_receipts(store.readonly_session())}
        queue = _queued(store.url, applied, cache, merged["set_aside"])
        queue += [r for r in extra if r.request_id not in applied]
        if on_batch is not None:
            on_batch(n_applied, sum(int(r.ids.size) for r in queue))
        if not queue:
            break
        batch: list[Request] = []
        size = 0
        for req in queue:
            if batch and size + req.ids.size > o.max_batch:
                break
            batch.append(req)
            size += int(req.ids.size)
        done = [r.request_id for r in batch]
        if tried.issuperset(done):
            raise RuntimeError(NO_PROGRESS.format(rids=", ".join(done[:3]), url=store.url))
        tried.update(done)
        t0 = time.perf_counter()
        res = _apply_batch(store, batch, o)
        n_applied += size
        delete_requests(store.url, [rid for rid in done if rid in cache])
        extra = [r for r in extra if r.request_id not in done]
        if res is None:  # another drain applied them first
            continue
        for key in ("deleted", "unknown", "already_deleted"):
            merged[key] += res.pop(key)
        for key, sec in res.pop("timings").items():
            timings[key] = timings.get(key, 0.0) + sec
        requests = res.pop("requests")
        merged["requests"] += requests
        merged["batches"].append({"requests": len(requests), "ids": size,
                                  "commit": res["commit"],
                                  "seconds": time.perf_counter() - t0})  # fmt: skip
        merged.update(res)
    # Also after a crash between a batch's commit and this step (a rerun finds no batch to do).
    if any(r["commit"] is None for r in read_receipts(store.readonly_session())):
        _record_commits(store, o)
    # Files of producers killed before their request was filed: never applied, but they hold ids.
    merged["abandoned_removed"] = sweep_abandoned(store.url)
    merged["timings"] = timings
    return merged


def _queued(url: str, applied: set[str], cache: dict[str, Request],
            set_aside: list[dict]) -> list[Request]:  # fmt: skip
    """The queue's requests not yet applied, oldest first. On the way: objects of applied
    requests are deleted; objects that are not requests this queue wrote are set aside (their
    notes added to ``set_aside``); requests are read once per drain (they are immutable)."""
    for name in unrecognised(url):
        _set_aside(url, name, "its name is not '<request id>.json'", set_aside)
    listed = pending(url)  # an object store has no queue yet: nothing listed
    delete_requests(url, [rid for rid in listed if rid in applied])
    queue = []
    for rid in listed:
        if rid in applied:
            continue
        if rid not in cache:
            try:
                cache[rid] = read_queued(url, rid)
            except MalformedRequest as e:
                _set_aside(url, f"{rid}.json", str(e), set_aside)
                continue
            except FileNotFoundError:  # applied and deleted by another drain meanwhile
                continue
        queue.append(cache[rid])
    return queue


def _set_aside(url: str, name: str, why: str, notes: list[dict]) -> None:
    with contextlib.suppress(FileNotFoundError):  # set aside by another drain meanwhile
        set_aside(url, name, why)
        notes.append({"object": name, "why": why})


def _record_commits(store: FairpipeStore, o: ForgetOptions) -> None:
    """Write into each receipt the commit that applied its request (found by the commits'
    metadata: a commit cannot hold its own id)."""
    by_request: dict[str, tuple[str, str]] = {}
    for snap in store.history():
        for rid in str(snap["metadata"].get(REQUESTS_KEY, "")).split(","):
            if rid:
                by_request.setdefault(rid, (snap["id"], snap["time"]))
    with store.transaction("receipts", lock_timeout=o.lock_timeout) as txn:
        receipts = read_receipts(txn.session)
        changed = False
        for r in receipts:
            if r["commit"] is None and r["request"] in by_request:
                r["commit"], r["applied_at"] = by_request[r["request"]]
                changed = True
        if changed:
            write_receipts(txn.root, receipts)


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
