"""The drain of a store's deletion queue (:mod:`fairpipe.storage.queue`): its requests applied
oldest first, in batches of whole requests, one commit per batch with the requests' receipts
(:mod:`fairpipe.storage.receipts`). A request already receipted is skipped, so a rerun after a
crash at any point applies each request exactly once; applied request objects are deleted after
their commit, and a last small commit writes each receipt's commit id. What a batch does to the
rows, the index and the models is the caller's (the forget flow's ``apply``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from fairpipe.errors import note_outcome
from fairpipe.storage.lock import StoreBusyError
from fairpipe.storage.queue import (
    MalformedRequest,
    Request,
    delete_requests,
    file_request,
    pending,
    set_aside,
    sweep_abandoned,
    unrecognised,
)
from fairpipe.storage.queue import read_request as read_queued
from fairpipe.storage.receipts import REQUESTS_KEY, read_receipts, write_receipts
from fairpipe.storage.store import FairpipeStore


class DrainOptions(Protocol):
    """What a drain is told (the forget flow's options): ids per batch, how long to wait for
    another writer, and what becomes of a request filed for the drain (:func:`filed`)."""

    max_batch: int
    lock_timeout: float
    unapplied: str  # "withdraw" or "keep"
    reason: str


NO_PROGRESS = "A drain of {url} came back to requests it had already applied ({rids})."


WITHDRAWN = "the request for these {n} ids is withdrawn: nothing of it is applied"
NOT_FILED = "no request for these {n} ids is filed: nothing of it is applied"
KEPT = (
    "the request {rid} for these {n} ids stays filed: the next drain applies it ('fairpipe "
    "status --store {url}' lists it)"
)


@contextlib.contextmanager
def filed(store: FairpipeStore, ids: np.ndarray, o: DrainOptions) -> Iterator[Request]:
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


def drain(store: FairpipeStore, o: DrainOptions, extra: list[Request],
          apply: Callable[[list[Request]], dict | None],
          on_batch: Callable[[int, int], None] | None = None) -> dict:  # fmt: skip
    """Apply the pending requests (and ``extra``), oldest first, in batches of whole requests
    up to ``o.max_batch`` ids, each by ``apply(batch)`` (one commit with the batch's receipts;
    None: another drain applied them first); returns the merged result of the batches.
    ``on_batch(applied, waiting)`` is called before the first batch and after each: ids applied
    so far, ids still waiting."""
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
        res = apply(batch)
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
        record_commits(store, o)
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


def record_commits(store: FairpipeStore, o: DrainOptions) -> None:
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
