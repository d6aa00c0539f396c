"""Backfill flow: a large backlog of ids to forget (a file of millions), filed as deletion
requests and drained, resumably.

The ids are read (text, CSV, Parquet or .npy: :func:`fairpipe.datasets.read_ids`), duplicates
counted and removed, and the rest ordered by their leaf in the fair summary's tree, then in the
DC-k-means tree, then by the row that holds them (ids the store never had last), then cut into
parts of ``batch_size`` ids. Each part is filed as one deletion request
whose id ends with ``bf<key>p<part>``, where the key is a hash of the backlog and the batch size;
the drain (:func:`fairpipe.flows.forget.drain`) then applies one part per commit, in which each row chunk,
index segment and tree node it touches is rewritten once. Ordered by leaf, a part recomputes
only a run of neighbouring leaves (and their few ancestors), so over the whole backfill each
leaf is recomputed about once, as in one fresh build. (Row chunks and index segments cannot
follow the same order: a part of random ids touches most of them.)

Rerun after an interruption with the same file: parts already receipted or still queued are
recognised by their key and not filed again, so every id is applied exactly once; the drain
picks up where it stopped. (Another batch size, or a store changed in between by an append or a
refit, is another backlog: its parts are filed anew, and ids already forgotten are then reported
as such, not forgotten twice.)
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time

import numpy as np

from fairpipe.cluster import DCKMeans
from fairpipe.datasets import read_ids
from fairpipe.flows.forget import drain
from fairpipe.flows.options import BackfillOptions, ForgetOptions
from fairpipe.flows.private import flow
from fairpipe.flows.task_runner import default_task_runner, run_flow
from fairpipe.settings import BACKFILL, check_settings
from fairpipe.storage import rows as stored_rows
from fairpipe.storage.erasure import erase_due
from fairpipe.storage.lineage import operation
from fairpipe.storage.models import read_model
from fairpipe.storage.queue import (
    Request,
    file_request,
    has_queue,
    new_request,
    pending,
)
from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.store import FairpipeStore
from fairpipe.storage.summary import has_summary, summary_tree
from fairpipe.tree import leaf_of
from fairpipe.validation import IdLookup


def backlog_key(unique_ids: np.ndarray, batch_size: int, plan_inputs) -> str:
    """The backlog's key: a hash of its ids, the batch size and what else decides how the ids
    are cut into parts (``plan_inputs``: the store's row count and leaf trees). The same key,
    the same parts: a rerun skips the parts it finds."""
    digest = hashlib.sha256(unique_ids.astype("<i8").tobytes())
    digest.update(repr((int(batch_size), plan_inputs)).encode())
    return digest.hexdigest()[:10]


def part_tag(key: str, part: int) -> str:
    return f"bf{key}p{part:06d}"


def parts_seen(request_ids, key: str) -> set[int]:
    """The part numbers of the backlog ``key`` among ``request_ids``."""
    pattern = re.compile(rf"-bf{key}p(\d{{6}})$")
    return {int(m.group(1)) for rid in request_ids if (m := pattern.search(rid))}


def leaf_trees(store: FairpipeStore) -> tuple[tuple[int, int], ...]:
    """(seed, leaves) of the store's trees whose leaves a deletion recomputes: the fair
    summary's first (its leaves cost the most), then the DC-k-means tree's."""
    session = store.readonly_session()
    trees = []
    if has_summary(session):
        params, fanout, height, _ = summary_tree(session)
        trees.append((int(params.seed), int(fanout) ** int(height)))
    if store.attrs(session).get("model") == "dc":
        model = read_model(session, "dc")
        assert isinstance(model, DCKMeans)
        trees.append((int(model.get_params()["seed"]), int(model.n_leaves_)))
    return tuple(trees)


def plan_parts(all_ids: np.ndarray, unique_ids: np.ndarray, batch_size: int,
               trees: tuple[tuple[int, int], ...] = ()) -> list[np.ndarray]:  # fmt: skip
    """``unique_ids`` ordered by their leaf in each of ``trees`` (seed, leaves), then by the row
    holding them (unknown ids last), in parts: a part recomputes a run of neighbouring leaves
    (and few of their ancestors), so over the backfill each leaf is recomputed about once."""
    rows, known = IdLookup(all_ids).rows(unique_ids)
    ids_known = unique_ids[known]
    keys = [rows] + [leaf_of(ids_known, seed, n) for seed, n in reversed(list(trees))]
    order = np.concatenate([np.flatnonzero(known)[np.lexsort(keys)], np.flatnonzero(~known)])
    ordered = unique_ids[order]
    return [ordered[a : a + batch_size] for a in range(0, ordered.size, batch_size)]


@flow(name="fairpipe-backfill", log_prints=False, task_runner=default_task_runner())
def backfill_flow(store_url: str, ids_file: str, options: BackfillOptions | None = None) -> dict:
    """Forget every id of ``ids_file``: file the backlog's parts not yet filed, then drain."""
    o = options or BackfillOptions()
    check_settings("backfill", BACKFILL, o)
    t_start = time.perf_counter()
    store = FairpipeStore.open(store_url)
    store.require_data()
    given = read_ids(path=ids_file)
    unique = np.unique(given)
    with store.named():
        all_ids = stored_rows.read_ids(store.readonly_session())
    trees = leaf_trees(store)
    # Should the store change between two runs (rows appended, a refit), the parts change and
    # so does the key: the rerun files its parts anew, and ids an earlier run already forgot are
    # reported as already forgotten, never forgotten twice.
    key = backlog_key(unique, o.batch_size, (int(all_ids.size), trees))
    parts = plan_parts(all_ids, unique, o.batch_size, trees)
    receipted = parts_seen((r["request"] for r in read_receipts(store.readonly_session())), key)
    queued = parts_seen(pending(store.url), key)
    local = has_queue(store.url)
    extra: list[Request] = []
    filed = 0
    for i, part in enumerate(parts):
        if i in receipted or i in queued:
            continue
        if local:
            file_request(store.url, part, o.reason, tag=part_tag(key, i))
        else:  # no queue beside a memory:// store: the parts go to this drain only
            extra.append(new_request(part, o.reason, tag=part_tag(key, i)))
        filed += 1
    forget = ForgetOptions(lock_timeout=o.lock_timeout, max_batch=o.batch_size, reason=o.reason)
    with _progress(o.progress) as bar, operation("backfill"):
        result = drain(store, forget, extra, on_batch=bar)
    t0 = time.perf_counter()
    erased = erase_due(store, o.lock_timeout)
    if erased is not None:
        result["erasure"] = erased
        result["timings"]["erasure"] = time.perf_counter() - t0
    result["timings"]["total"] = time.perf_counter() - t_start
    n_batches = len(result["batches"])
    return {
        "store": store.url,
        "ids_file": str(ids_file),
        "ids_given": int(given.size),
        "duplicates": int(given.size - unique.size),
        "unique": int(unique.size),
        "backlog": key,
        "parts": len(parts),
        "parts_filed": filed,
        "parts_applied_before": len(receipted),
        "forgotten": len(result.pop("deleted")),
        "unknown": len(result.pop("unknown")),
        "already_deleted": len(result.pop("already_deleted")),
        "ids_per_second": (
            sum(b["ids"] for b in result["batches"]) / sum(b["seconds"] for b in result["batches"])
            if n_batches
            else None
        ),  # fmt: skip
        **result,
    }


@contextlib.contextmanager
def _progress(enabled: bool):
    """A callback ``(applied, waiting)`` advancing a bar with ETA on stderr (or doing nothing)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                  transient=False) as bar:  # fmt: skip
        task = bar.add_task("forgetting ids", total=None)

        def update(applied: int, waiting: int) -> None:
            bar.update(task, completed=applied, total=applied + waiting)

        yield update


def run_backfill(store_url, ids_file, options=None, dask_address=None, n_workers=2,
                 processes=True, dask_cluster=None):  # fmt: skip
    return run_flow(backfill_flow, str(store_url), str(ids_file), options or BackfillOptions(),
                    dask_address=dask_address, n_workers=n_workers, processes=processes, dask_cluster=dask_cluster)  # fmt: skip
