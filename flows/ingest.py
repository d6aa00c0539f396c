"""Ingest flow: source -> validated row chunks -> points, ids, groups -> LSH bucket index.

Prefect tasks are coarse; the fine-grained work (one job per row chunk, one per block of tables)
is mapped on the Dask cluster from inside them, and they are called in the flow's process (a trip
to a worker delayed the first job by about 1.5 s: docs/design/flows.md). The chunk jobs read
their rows (or are sent them: :func:`write_rows_task`), hash them and stage the keys in the
store's own storage, outside its repository (:mod:`fairpipe.storage.staging`); the table jobs build their
tables' segments from them. A small append patches only the segments its rows fall in; a larger
one rebuilds the tables from their entries and the staged keys. An append also brings the model
and the summary up to date (:mod:`fairpipe.flows.update`). Everything is written inside one store
transaction, published as one commit at the end: an error anywhere leaves the store as it was.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
from prefect.cache_policies import NO_CACHE

from fairpipe.datasets import (
    SourcePlan,
    chunk_plan,
    is_url,
    plan_source,
    read_source_rows,
    remap_groups,
    rows_plan,
)
from fairpipe.flows.checks import check_append
from fairpipe.flows.dask_map import cluster_running, dask_client, dask_map, gather
from fairpipe.flows.jobs import index_job, ingest_chunk, raise_bad_input
from fairpipe.flows.options import IngestOptions
from fairpipe.flows.parameters import check_recall_options, new_store_parameters, scaled_plan
from fairpipe.flows.private import flow, task
from fairpipe.flows.task_runner import default_task_runner, run_flow, start_cluster_early
from fairpipe.flows.update import update_after_append
from fairpipe.neighbors import E2LSH, WIDTH_PER_RADIUS
from fairpipe.settings import INDEX, check_settings
from fairpipe.storage.formats import upgrade_format1
from fairpipe.storage.layers import MAIN, layer_bits, load_lsh, plan_layers
from fairpipe.storage.lineage import options_record, record
from fairpipe.storage.lock import StoreBusyError
from fairpipe.storage.rows import (
    RowBlocks,
    counts_of,
    create_layout,
    grow,
    live_group_counts,
    scale_method,
    scaler_of,
    sketch_arrays,
    write_dataset_attrs,
    write_new_rows,
)
from fairpipe.storage.segments import (
    buckets_per_table,
    build_tables_here,
    index_staged_rows,
    table_blocks,
)
from fairpipe.storage.staging import Staging
from fairpipe.storage.store import CREATED_MEANWHILE, FairpipeStore

# The ``lsh`` attribute's record of what the parameters promise (fairpipe.flows.parameters).
TUNING = ("radius", "recall_target", "expected_recall", "expected_candidates", "max_radius")
# A small append is done by the flow itself, without Dask jobs (a round of jobs costs about
# 0.3-0.5 s before any work, and starting the embedded cluster about 2 s): its rows up to
# LOCAL_ROWS are hashed and written here, and a delta of up to LOCAL_ENTRIES entries (rows x
# tables; the flow reads at most fairpipe.storage.segments.READ_AHEAD_ENTRIES of them at once) is rebuilt
# here, about 0.2 s per million entries (measured at 1M rows: the fourth 1% append's delta of
# 4M entries took 0.7 s in the flow; before, as Dask jobs, 3.0 s, most of it the cluster's start).
LOCAL_ENTRIES = 16_000_000
# Threads the flow hashes and indexes a small append on (its process has the machine's cores to
# itself: the Dask jobs, where there are any, run after).
FLOW_THREADS = min(os.cpu_count() or 1, 8)
LOCAL_ROWS = 20_000
# Where the embedded cluster has not started yet, starting it costs about 1.3 s before any
# job (its two worker processes): an append of up to LOCAL_CELLS_COLD values (rows x d) is
# then hashed here too. At d = 128 that is 131,072 rows, about 1.2 s in the flow; measured at
# 10M rows, a 1% append (100,000 rows) took 4.46 s in the flow on the cluster.
LOCAL_CELLS_COLD = 1 << 24


def append_here(rows: int, d: int) -> bool:
    """Whether the flow hashes and writes an append of ``rows`` x ``d`` itself (no Dask jobs)."""
    return rows <= LOCAL_ROWS or (rows * d <= LOCAL_CELLS_COLD and not cluster_running())


# -- Prefect tasks --------------------------------------------------------------------------------
@task(name="plan-source", cache_policy=NO_CACHE)
def plan_source_task(source: str, options: IngestOptions) -> SourcePlan:
    return plan_source(
        source,
        group_column=options.group_column,
        id_column=options.id_column,
        groups_file=options.groups_file,
        ids_file=options.ids_file,
        gaussian=options.gaussian,
        seed=options.get("seed"),
    )


@task(name="hash-and-write-rows", cache_policy=NO_CACHE)
def write_rows_task(fork, plan, lsh, chunks, base, staging, sketch: list[str]) -> list:
    """Read, write and hash the new rows, a Dask job per row chunk. A job reads its rows of the
    source itself (its share of the plan, :func:`chunk_plan`): a URL, a built-in, or a local file
    where the workers run on this machine (the embedded cluster). For a local file and a cluster
    given by address, whose workers do not see this machine's disk, the rows are read here, a
    chunk at a time, and sent with the jobs (:func:`ship_rows`)."""
    n = len(chunks)
    if plan.kind in LOCAL_FILES and not is_url(plan.path or ""):
        with dask_client() as client:
            if not workers_share_disk(client):
                return ship_rows(client, fork, plan, lsh, chunks, base, staging, sketch)
    plans = [chunk_plan(plan, a, b) for a, b in chunks]
    return dask_map(
        ingest_chunk, [fork] * n, plans, [lsh] * n, [a for a, _ in chunks],
        [b for _, b in chunks], [base] * n, [staging] * n, [sketch] * n,
    )  # fmt: skip


# Source kinds that are a file the client reads (a local path, unless a URL).
LOCAL_FILES = ("npy", "csv", "parquet")
# Chunks of rows sent ahead per worker thread (each about 16 MB of points by default): enough
# that no worker waits for the client's next read, few enough that memory stays bounded.
BLOCKS_PER_THREAD = 2


def workers_share_disk(client) -> bool:
    """Whether the cluster's workers run on this machine, started by this process (the embedded
    LocalCluster): they then read a local source's path themselves. A cluster given by address
    may run anywhere."""
    from distributed import LocalCluster

    return isinstance(getattr(client, "cluster", None), LocalCluster)


def ship_rows(client, fork, plan, lsh, chunks, base, staging, sketch) -> list:
    """:func:`write_rows_task` for a local file on a cluster that does not see it: each chunk's
    rows read and validated here (a bad value raised here, naming its row, before any later
    chunk is read), sent to the cluster, and hashed and written there by a job, with at most
    BLOCKS_PER_THREAD chunks per worker thread sent and not yet done (the client holds one chunk
    at a time, the cluster that many)."""
    import threading

    window = max(2, BLOCKS_PER_THREAD * sum(client.nthreads().values()))
    slots = threading.Semaphore(window)  # released by each job as it ends (on a client thread)
    futures: list = []
    try:
        for a, b in chunks:
            slots.acquire()
            if any(f.status == "error" for f in futures):
                break  # raised by gather below: no more rows read for nothing
            block = rows_plan(plan, a, b, read_source_rows(plan, a, b))
            (sent,) = client.scatter([block], hash=False)
            future = client.submit(ingest_chunk, fork, sent, lsh, a, b, base, staging, sketch,
                                   pure=False)  # fmt: skip
            del block, sent  # the cluster holds the rows until the job has them
            future.add_done_callback(lambda _: slots.release())
            futures.append(future)
    except BaseException:
        with contextlib.suppress(BaseException):
            gather(client, futures)  # the jobs sent end before the caller removes what they wrote
        raise
    return gather(client, futures)


@task(name="build-bucket-index", cache_policy=NO_CACHE)
def build_index_task(fork, staging, n_tables: int, n_rows: int, bits: int, sources: tuple,
                     target: str) -> list:  # fmt: skip
    blocks = table_blocks(n_tables, n_rows)
    n = len(blocks)
    return dask_map(index_job, [fork] * n, [staging] * n, [a for a, _ in blocks],
                    [b for _, b in blocks], [bits] * n, [sources] * n, [target] * n)  # fmt: skip


def index_by_jobs(attrs: dict, base: int, n_total: int, added: int) -> bool:
    """Whether an append of rows [base, n_total) (``added`` of them) into a store with root
    attributes ``attrs`` is indexed by Dask jobs (a rebuild of the main layer, or a large
    delta layer), as :func:`index_new_rows` decides."""
    plan = plan_layers(attrs, base, n_total, int(attrs.get("n_alive", 0)) + added)
    return _by_jobs(plan, n_total, int(attrs["lsh"]["n_tables"]))


def _by_jobs(plan, n_total: int, n_tables: int) -> bool:
    return plan.target == MAIN or (n_total - plan.start) * n_tables > LOCAL_ENTRIES


def index_new_rows(txn, staging: Staging, n_tables: int, n_alive: int,
                   attrs: dict | None) -> tuple[dict, int]:  # fmt: skip
    """Put the staged new rows in the index (:func:`fairpipe.storage.segments.index_staged_rows`):
    a layer of up to LOCAL_ENTRIES entries built here on FLOW_THREADS threads (a task and its
    jobs cost about 0.3-0.5 s before any work; this takes about 0.1 s per million entries),
    larger ones and a rebuild of the main layer by Dask jobs over blocks of tables. Returns (the
    index layout for the ``lsh`` attribute, segments written)."""

    def build(plan) -> list:
        if not _by_jobs(plan, staging.n_total, n_tables):
            return build_tables_here(txn.session, staging, n_tables, plan, FLOW_THREADS)
        return build_index_task(txn.fork(), staging, n_tables, staging.n_total - plan.start,
                                plan.bits, plan.sources, plan.target)  # fmt: skip

    return index_staged_rows(txn, staging, n_tables, n_alive, attrs, build)


@flow(name="fairpipe-ingest", log_prints=False, task_runner=default_task_runner())
def ingest_flow(source: str, store_url: str, options: IngestOptions | None = None) -> dict:
    """Ingest ``source`` into the store at ``store_url`` and rebuild its LSH index: one commit."""
    options = options or IngestOptions()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    check_settings("ingest", INDEX, options)  # (a deployment's options: the command checked)
    check_recall_options(options.n_hashes, options.n_tables, options.bucket_width, options.recall,
                         options.max_radius)  # fmt: skip
    # A folder that is not a store fails before the source is read; a new store is created only
    # once the source has been planned, so a bad source leaves nothing behind.
    store = FairpipeStore.open_existing(store_url)  # raises for a folder that is not a store
    if store is not None and options.new_store:
        raise StoreBusyError(CREATED_MEANWHILE.format(url=store_url))
    # Planned here, not on the cluster: an append small enough for the flow to do itself
    # then never starts one (the embedded LocalCluster costs about 2 s to start).
    plan = plan_source_task(source, options)
    timings["plan"] = time.perf_counter() - t_start
    if store is not None:
        return _ingest_into(store, plan, source, options, timings, t_start)
    # A new store's scaling and parameters are chosen before it is made (their errors leave
    # nothing).
    t0 = time.perf_counter()
    chosen = choose_parameters(plan, options)
    timings["choose_parameters"] = time.perf_counter() - t0
    # A new store: made under its writer lock, held until the ingest commits; if anything fails
    # before, what this run made (and only that) is removed.
    with FairpipeStore.creating(store_url, options.lock_timeout) as store:
        return _ingest_into(store, plan, source, options, timings, t_start, chosen)


def choose_parameters(plan, options: IngestOptions) -> dict:
    """A new store's scaling (``plan``: the source's plan with its scaler; ``scaling``:
    :class:`fairpipe.flows.parameters.Scaling`) and E2LSH parameters, chosen on the scaled rows
    (:func:`fairpipe.flows.parameters.new_store_parameters`)."""
    seed = options.get("seed")
    sampled = None in (options.n_hashes, options.n_tables, options.bucket_width)
    plan, scaling = scaled_plan(plan, plan.ids, seed, options.get("scale"), sampled)
    chosen = new_store_parameters(
        plan, plan.ids, seed, n_hashes=options.n_hashes, n_tables=options.n_tables,
        bucket_width=options.bucket_width, radius=options.radius, recall=options.recall,
        max_radius=options.max_radius,
    )  # fmt: skip
    return {**chosen, "plan": plan, "scaling": scaling}


def _ingest_into(store, plan, source: str, options: IngestOptions, timings: dict, t_start: float,
                 chosen: dict | None = None):  # fmt: skip
    with store.transaction(f"ingest {source}", lock_timeout=options.lock_timeout) as txn:
        attrs = store.attrs(txn.session)
        appending = "n" in attrs
        base = int(attrs.get("n", 0))
        if appending:
            check_append(plan, options, attrs, txn.session, store.url)
            plan = replace(plan, scaler=scaler_of(attrs))  # the store's, never refitted
            blocks = RowBlocks.of(attrs)
            lsh = load_lsh(txn.session, attrs)
            seed = int(attrs["seed"])
        else:
            blocks = RowBlocks.new(plan.d, options.chunk_rows)
            seed = options.get("seed")
        if not (appending and append_here(plan.n, plan.d)) or (
            appending and index_by_jobs(attrs, base, base + plan.n, plan.n)
        ):  # the embedded cluster starts while the flow checks, plans and writes the rows
            start_cluster_early()
        ids = plan.ids if plan.ids is not None else np.arange(base, base + plan.n, dtype=np.int64)
        stored_names = list(attrs.get("group_names", []))
        codes, group_names = remap_groups(plan, stored_names)
        new_groups = group_names[len(stored_names) :] if appending else []

        if not appending:
            if chosen is None:  # a store that exists but holds no data yet
                t0 = time.perf_counter()
                chosen = choose_parameters(plan, options)
                timings["choose_parameters"] = time.perf_counter() - t0
            tuning = {name: chosen[name] for name in TUNING}
            radius_hint = chosen["radius"]
            plan, scaling = chosen["plan"], chosen["scaling"]
            lsh = E2LSH(n_hashes=chosen["n_hashes"], n_tables=chosen["n_tables"],
                        bucket_width=chosen["bucket_width"], seed=seed,
                        scales=tuple(map(tuple, chosen["scales"] or ()))).fit(plan.d)  # fmt: skip
            create_layout(txn.root, plan.d, lsh, blocks)
        else:
            tuning = {name: attrs["lsh"][name] for name in TUNING if name in attrs["lsh"]}
        if appending:
            attrs = upgrade_format1(txn.session, txn.root, attrs)
        n_total = base + plan.n
        L = lsh.n_tables
        grow(txn.root, n_total)

        blocks = blocks.grown(n_total)
        chunks = blocks.since(base)
        staging = Staging(store.spec, base, n_total, store.url)
        try:
            t0 = time.perf_counter()
            # Ids and groups (13 bytes a row) are written here; the jobs get their rows' share
            # of the source only (no n-sized array in the task graph).
            plans = [chunk_plan(plan, a, b) for a, b in chunks]
            sketch = sketch_arrays(txn.root.attrs)
            if appending and append_here(plan.n, plan.d):
                # Here, on every core: the ids and groups written on a thread while the rows
                # are hashed on FLOW_THREADS and written on another.
                with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairpipe-write") as io:
                    new_rows = io.submit(write_new_rows, txn.session, base, ids, codes)
                    for p, (a, b) in zip(plans, chunks):
                        raise_bad_input([ingest_chunk(txn.session, p, lsh, a, b, base, staging,
                                                      sketch, FLOW_THREADS)])  # fmt: skip
                    new_rows.result()
            else:
                write_new_rows(txn.session, base, ids, codes)
                # (the plan without its ids and groups: a task's inputs hold no one's id)
                results = write_rows_task(txn.fork(), chunk_plan(plan, 0, plan.n), lsh, chunks,
                                          base, staging, sketch)  # fmt: skip
                raise_bad_input(results)
                txn.merge([fork for fork, _ in results])
            timings["hash_and_write"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            n_alive = int(attrs.get("n_alive", 0)) + plan.n
            layout, written = index_new_rows(txn, staging, L, n_alive, attrs if appending else None)
            timings["bucket_index"] = time.perf_counter() - t0
        finally:
            staging.remove()
        swept = staging.swept

        updated: dict = {}
        if appending:  # the model and summary take the new rows in (their leaves and ancestors)
            t0 = time.perf_counter()
            updated = update_after_append(txn, base, blocks)
            if updated:
                timings["models"] = time.perf_counter() - t0
        # Live rows per group: the kept counts plus the new rows' (an append reads no old row),
        # or counted from every row where the store keeps none.
        kept = counts_of(attrs) if appending else np.zeros(0, np.int64)
        if kept is None:
            per_group = live_group_counts(txn.session, len(group_names))
        else:
            counted = np.bincount(codes, minlength=max(len(group_names), 1))
            counted[: kept.size] += kept
            per_group = counted.tolist()
        buckets = buckets_per_table(txn.session, layer_bits({"lsh": layout}))
        if appending:  # the radius suggested for the first rows stays
            radius_hint = attrs.get("suggested_radius", lsh.bucket_width / WIDTH_PER_RADIUS)
        meta = write_dataset_attrs(
            txn.root, attrs, blocks=blocks, per_group=per_group, d=plan.d, seed=seed,
            group_names=group_names, lsh=lsh, layout=layout, suggested_radius=radius_hint,
            source=source, tuning=tuning, scale=None if appending else scaling.attrs(),
            feature_names=None if appending else plan.feature_columns,
        )  # fmt: skip
        settings = options_record(options, source=source)
        if source != "gaussian":  # the generator's settings only for the data it generates
            settings = {k: v for k, v in settings.items() if not k.startswith("gaussian_")}
        counts = {"added": plan.n, "n": n_total, "n_alive": int(sum(per_group)), "d": plan.d}
        record(txn, "append" if appending else "ingest", settings, rows=counts)
    timings["total"] = time.perf_counter() - t_start
    rows_s = plan.n / timings["hash_and_write"] if timings["hash_and_write"] > 0 else math.inf
    return {
        "store": store.url,
        "n": n_total,
        "added": plan.n,
        "d": plan.d,
        "groups": dict(zip(group_names or ["all"], per_group)),
        "commit": txn.commit_id,
        "lsh": meta["lsh"],
        "suggested_radius": meta["suggested_radius"],
        "chunks": len(chunks),
        "buckets_per_table": buckets,
        "segments_written": written,
        "new_groups": new_groups,
        "stale_staging_removed": swept,  # folders of killed ingests of this store, removed
        # the store's scaling (an append's rows scaled by it), and the warnings to show
        "scale": scale_method(attrs) if appending else scaling.method,
        "warnings": [] if appending or scaling.warning is None else [scaling.warning],
        **updated,
        "rows_per_second": rows_s,
        "timings": timings,
    }


def run_ingest(source: str, store_url: str, options: IngestOptions | None = None,
               dask_address: str | None = None, n_workers: int = 2,
               processes: bool = True, dask_cluster: str | None = None) -> dict:  # fmt: skip
    """Run the ingest flow on an embedded LocalCluster (or ``dask_address``); a command line
    with its own Prefect server loads the compiled kernels while the server starts."""
    return run_flow(ingest_flow, source, str(store_url), options or IngestOptions(),
                    dask_address=dask_address, n_workers=n_workers, processes=processes, dask_cluster=dask_cluster,
                    warm_kernels=True)  # fmt: skip


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run_ingest(sys.argv[1], sys.argv[2]), indent=2, default=str))
