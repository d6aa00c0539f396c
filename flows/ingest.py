"""Ingest flow: source -> validated row chunks -> points, ids, groups, LSH keys -> bucket index.

Prefect tasks are coarse (about 0.1 s each on Dask); the fine-grained work (one job per row chunk,
one per block of tables) is mapped on the Dask cluster from inside them. Everything is written
inside one store transaction, published as one commit at the end: an error anywhere leaves the
store as it was.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, field

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.datasets import (
    SourcePlan,
    plan_source,
    read_source_rows,
    read_source_sample,
    remap_groups,
)
from fairpipe.errors import FairpipeInputError, check_positive_float, check_positive_int
from fairpipe.neighbors import (
    E2LSH,
    WIDTH_PER_RADIUS,
    estimate_bucket_width,
    width_sample_rows,
)
from flows.runtime import dask_map, default_task_runner, run_flow
from storage.index import (
    choose_chunk_rows,
    create_layout,
    grow,
    index_tables,
    live_group_counts,
    load_lsh,
    row_chunks,
    table_blocks,
    write_bucket_counts,
    write_dataset_attrs,
    write_new_rows,
)
from storage.store import FairpipeStore, read_array
from storage.urls import parse_store_url

DIM_MISMATCH = (
    "{where} holds {got}-dimensional points; the store {url} holds {d}-dimensional points."
)
ID_CLASH = "Id {id} of {where} is already in the store {url}; ids must be unique."


@dataclass
class IngestOptions:
    seed: int = 0
    group_column: str | None = None
    id_column: str | None = None
    groups_file: str | None = None
    ids_file: str | None = None
    lsh_k: int = 15  # hash functions per table (E2LSH's n_hashes)
    lsh_tables: int = 100
    lsh_width: float | None = None  # the bucket width; None: estimated from the data
    chunk_rows: int | None = None
    gaussian: dict = field(default_factory=dict)
    lock_timeout: float = 0.0


# -- Dask jobs (plain functions: no Prefect overhead per chunk) ---------------------------------
def _ingest_chunk(fork, plan: SourcePlan, lsh: E2LSH, a: int, b: int, base: int, ids, codes):
    t0 = time.perf_counter()
    X = read_source_rows(plan, a, b)
    write_new_rows(fork, base + a, X, ids, codes, lsh.hash_validated(X))
    return fork, {"rows": b - a, "seconds": time.perf_counter() - t0}


def _index_job(fork, t0: int, t1: int):
    return fork, index_tables(fork, t0, t1)


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
        seed=options.seed,
    )


@task(name="hash-and-write-rows", cache_policy=NO_CACHE)
def write_rows_task(fork, plan, lsh, chunks, base, ids, codes):
    n = len(chunks)
    return dask_map(
        _ingest_chunk, [fork] * n, [plan] * n, [lsh] * n, [a for a, _ in chunks],
        [b for _, b in chunks], [base] * n, [ids[a:b] for a, b in chunks],
        [codes[a:b] for a, b in chunks],
    )  # fmt: skip


@task(name="build-bucket-index", cache_policy=NO_CACHE)
def build_index_task(fork, n_tables: int, n_rows: int):
    blocks = table_blocks(n_tables, n_rows)
    n = len(blocks)
    return dask_map(_index_job, [fork] * n, [a for a, _ in blocks], [b for _, b in blocks])


def rebuild_index(txn, n_tables: int, n_rows: int) -> np.ndarray:
    """Rebuild every table's bucket index from the keys of the live rows (Dask jobs over blocks
    of tables, merged into ``txn``); returns the bucket count of each table."""
    index_results = build_index_task.submit(txn.fork(), n_tables, n_rows).result()
    txn.merge([fork for fork, _ in index_results])
    counts = np.zeros(n_tables, dtype=np.int64)
    for _, c in index_results:
        for t, v in c.items():
            counts[t] = v
    write_bucket_counts(txn.root, counts)
    return counts


# -- the flow -------------------------------------------------------------------------------------
@flow(name="fairpipe-ingest", log_prints=False, task_runner=default_task_runner())
def ingest_flow(source: str, store_url: str, options: IngestOptions | None = None) -> dict:
    """Ingest ``source`` into the store at ``store_url`` and rebuild its LSH index: one commit."""
    options = options or IngestOptions()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    check_positive_int(options.lsh_k, "lsh_k", "ingest")
    check_positive_int(options.lsh_tables, "lsh_tables", "ingest")
    if options.lsh_width is not None:
        check_positive_float(options.lsh_width, "lsh_width", "ingest")
    if options.chunk_rows is not None:
        check_positive_int(options.chunk_rows, "chunk_rows", "ingest")
    # A folder that is not a store fails before the source is read; a new store is created only
    # once the source has been planned, so a bad source leaves nothing behind.
    local = parse_store_url(store_url).local_dir
    folder_existed = local is not None and local.exists()
    store = None
    created = False
    try:
        store = FairpipeStore.open_existing(store_url)  # raises for a folder that is not a store
        plan = plan_source_task.submit(source, options).result()
        if store is None:
            store, created = FairpipeStore.open(store_url, create=True), True
        timings["plan"] = time.perf_counter() - t_start
        return _ingest_into(store, plan, source, options, timings, t_start)
    except BaseException:
        # Remove what this run made and nothing else: a folder it created, or a store it created
        # that holds nothing but its marker. A store that was there before is never touched.
        ours = not folder_existed or created
        if ours and local is not None and local.exists() and (store is None or store.is_empty()):
            for entry in local.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            if not folder_existed:
                local.rmdir()
        raise


def _ingest_into(store, plan, source: str, options: IngestOptions, timings: dict, t_start: float):
    with store.transaction(f"ingest {source}", lock_timeout=options.lock_timeout) as txn:
        attrs = store.attrs(txn.session)
        appending = "n" in attrs
        base = int(attrs.get("n", 0))
        if appending:
            if plan.d != attrs["d"]:
                raise FairpipeInputError(
                    DIM_MISMATCH.format(where=plan.where, got=plan.d, url=store.url, d=attrs["d"])
                )
            chunk_rows = int(attrs["chunk_rows"])
            lsh = load_lsh(txn.session, attrs)
            seed = int(attrs["seed"])
        else:
            chunk_rows = options.chunk_rows or choose_chunk_rows(plan.d)
            seed = options.seed
        ids = plan.ids if plan.ids is not None else np.arange(base, base + plan.n, dtype=np.int64)
        if appending:
            clash = np.intersect1d(read_array(txn.session, "ids"), ids)
            if clash.size:
                raise FairpipeInputError(
                    ID_CLASH.format(id=int(clash[0]), where=plan.where, url=store.url)
                )
        codes, group_names = remap_groups(plan, attrs.get("group_names", []))

        if not appending:
            t0 = time.perf_counter()
            if options.lsh_width is None:
                sample = read_source_sample(plan, width_sample_rows(ids, seed))
                radius_hint, width = estimate_bucket_width(sample)
            else:
                width = float(options.lsh_width)
                radius_hint = width / WIDTH_PER_RADIUS
            timings["estimate_width"] = time.perf_counter() - t0
            lsh = E2LSH(n_hashes=options.lsh_k, n_tables=options.lsh_tables, bucket_width=width,
                        seed=seed).fit(plan.d)  # fmt: skip
            create_layout(txn.root, plan.d, lsh, chunk_rows)
        n_total = base + plan.n
        L = lsh.n_tables
        grow(txn.root, n_total, L)

        chunks = row_chunks(base, n_total, chunk_rows)
        t0 = time.perf_counter()
        results = write_rows_task.submit(txn.fork(), plan, lsh, chunks, base, ids, codes).result()
        txn.merge([fork for fork, _ in results])
        timings["hash_and_write"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        counts = rebuild_index(txn, L, n_total)
        timings["bucket_index"] = time.perf_counter() - t0

        per_group = live_group_counts(txn.session, len(group_names))  # every live row has a group
        if appending:  # the radius suggested for the first rows stays
            radius_hint = attrs.get("suggested_radius", lsh.bucket_width / WIDTH_PER_RADIUS)
        meta = write_dataset_attrs(
            txn.root, attrs, n=n_total, n_alive=sum(per_group), d=plan.d, seed=seed,
            chunk_rows=chunk_rows,
            group_names=group_names, lsh=lsh, suggested_radius=radius_hint, source=source,
        )  # fmt: skip
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
        "buckets_per_table": float(counts.mean()),
        "rows_per_second": rows_s,
        "timings": timings,
    }


def run_ingest(source: str, store_url: str, options: IngestOptions | None = None,
               dask_address: str | None = None, n_workers: int = 2,
               processes: bool = True) -> dict:  # fmt: skip
    """Run the ingest flow on an embedded LocalCluster (or ``dask_address``)."""
    return run_flow(ingest_flow, source, str(store_url), options or IngestOptions(),
                    dask_address=dask_address, n_workers=n_workers, processes=processes)  # fmt: skip


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run_ingest(sys.argv[1], sys.argv[2]), indent=2, default=str))
