"""Ingest flow: source -> validated row chunks -> points, ids, groups, LSH keys -> bucket index.

Prefect tasks are coarse (about 0.1 s each on Dask); the fine-grained work (one job per row chunk,
one per block of tables) is mapped on the Dask cluster from inside them. Everything is written
inside one store transaction, published as one commit at the end: an error anywhere leaves the
store as it was.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from dataclasses import dataclass, field

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.bucket_index import build_table, remove_rows
from fairpipe.errors import FairpipeInputError, check_positive_float, check_positive_int
from fairpipe.hashing import stable_hash
from fairpipe.lsh import E2LSH, ROW_BLOCK
from fairpipe.sources import SourcePlan, plan_groups, plan_source, read_rows
from storage.store import (
    FORMAT,
    FairpipeStore,
    read_array,
    write_rows,
    write_table_rows,
)
from storage.urls import parse_store_url

TARGET_CHUNK_BYTES = 16 << 20
WIDTH_SAMPLE = 2000
WIDTH_PER_RADIUS = 3.2  # the paper tuned w to 3.1-3.3 times r
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
    lsh_k: int = 15
    lsh_tables: int = 100
    lsh_width: float | None = None
    chunk_rows: int | None = None
    gaussian: dict = field(default_factory=dict)
    lock_timeout: float = 0.0


def choose_chunk_rows(d: int) -> int:
    rows = TARGET_CHUNK_BYTES // max(4 * d, 1)
    return int(min(max(rows // ROW_BLOCK * ROW_BLOCK, ROW_BLOCK), 65536))


def estimate_width(plan: SourcePlan, ids: np.ndarray, seed: int) -> tuple[float, float]:
    """(suggested radius, width): the median nearest-neighbour distance within a sample chosen
    by hash of (seed, id), so it does not depend on file order; w = 3.2 r as in the paper."""
    h = stable_hash(seed, ids, salt=0x5A)
    take = np.sort(np.argsort(h, kind="stable")[:WIDTH_SAMPLE])
    step = 65536
    parts = []
    for a in range(0, plan.n, step):
        rows = take[(take >= a) & (take < a + step)]
        if rows.size:
            parts.append(read_rows(plan, a, min(a + step, plan.n))[rows - a])
    S = np.concatenate(parts).astype(np.float64)
    if S.shape[0] < 2:
        return 1.0, WIDTH_PER_RADIUS
    sq = (S * S).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2 * S @ S.T
    np.fill_diagonal(d2, np.inf)
    nn = np.sqrt(np.maximum(d2.min(1), 0.0))
    positive = nn[nn > 0]
    r = float(np.median(positive)) if positive.size else 1.0
    return r, WIDTH_PER_RADIUS * r


# -- Dask jobs (plain functions: no Prefect overhead per chunk) ---------------------------------
def _ingest_chunk(fork, plan: SourcePlan, lsh: E2LSH, a: int, b: int, base: int, ids, codes):
    t0 = time.perf_counter()
    X = read_rows(plan, a, b)
    keys = lsh._hash(X)
    write_rows(fork, "points", base + a, X)
    write_rows(fork, "ids", base + a, ids)
    write_rows(fork, "groups", base + a, codes)
    write_rows(fork, "alive", base + a, np.ones(b - a, dtype=bool))
    write_rows(fork, "lsh/keys", base + a, keys)
    return fork, {"rows": b - a, "seconds": time.perf_counter() - t0}


def _index_tables(fork, t0: int, t1: int):
    """Index tables [t0, t1): one read of their key columns, one write per index array."""
    alive = read_array(fork, "alive")
    keys = read_array(fork, "lsh/keys", (slice(None), slice(t0, t1)))
    n = alive.shape[0]
    bkeys = np.full((t1 - t0, n), np.iinfo(np.uint64).max, dtype=np.uint64)
    bstarts = np.zeros((t1 - t0, n + 1), dtype=np.int64)
    members = np.full((t1 - t0, n), -1, dtype=np.int64)
    counts = {}
    for j in range(t1 - t0):
        k, s, m = build_table(keys[:, j], alive)
        bkeys[j, : k.shape[0]] = k
        bstarts[j, : s.shape[0]] = s
        members[j, : m.shape[0]] = m
        counts[t0 + j] = k.shape[0]
    write_table_rows(fork, "lsh/bucket_keys", t0, bkeys)
    write_table_rows(fork, "lsh/bucket_starts", t0, bstarts)
    write_table_rows(fork, "lsh/members", t0, members)
    return fork, counts


@contextlib.contextmanager
def dask_client():
    """A Dask client usable from inside a Prefect task running on a Dask worker.

    ``prefect_dask.get_dask_client`` does not secede from the worker's thread pool, so with one
    worker thread the jobs a task submits would wait forever for the thread their parent holds.
    ``distributed.worker_client`` secedes while it waits and rejoins afterwards.
    """
    from distributed import get_worker, worker_client

    try:
        get_worker()
    except ValueError:  # not on a worker (a flow run in this process): use the runner's client
        from prefect_dask import get_dask_client

        with get_dask_client() as client:
            yield client
        return
    with worker_client() as client:
        yield client


def _dask_map(fn, *iterables):
    """Map ``fn`` over the cluster from inside a Prefect task and gather the results."""
    with dask_client() as client:
        return client.gather(client.map(fn, *iterables, pure=False))


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
    return _dask_map(
        _ingest_chunk,
        [fork] * len(chunks),
        [plan] * len(chunks),
        [lsh] * len(chunks),
        [a for a, _ in chunks],
        [b for _, b in chunks],
        [base] * len(chunks),
        [ids[a:b] for a, b in chunks],
        [codes[a:b] for a, b in chunks],
    )


@task(name="build-bucket-index", cache_policy=NO_CACHE)
def build_index_task(fork, n_tables: int, n_rows: int):
    # Blocks of tables small enough that a job holds about 256 MB of index at most.
    per_job = int(max(1, min(n_tables, (256 << 20) // max(40 * n_rows, 1), -(-n_tables // 8))))
    starts = list(range(0, n_tables, per_job))
    stops = [min(t + per_job, n_tables) for t in starts]
    return _dask_map(_index_tables, [fork] * len(starts), starts, stops)


def rebuild_index(txn, n_tables: int, n_rows: int) -> np.ndarray:
    """Rebuild every table's bucket index from the keys of the alive rows (Dask jobs over blocks
    of tables, merged into ``txn``); returns the bucket count of each table."""
    index_results = build_index_task.submit(txn.fork(), n_tables, n_rows).result()
    txn.merge([fork for fork, _ in index_results])
    counts = np.zeros(n_tables, dtype=np.int64)
    for _, c in index_results:
        for t, v in c.items():
            counts[t] = v
    if "lsh/bucket_counts" in txn.root:
        del txn.root["lsh/bucket_counts"]
    txn.root.create_array("lsh/bucket_counts", shape=(n_tables,), dtype="int64")[:] = counts
    return counts


def remove_from_index(txn, rows: np.ndarray, n_tables: int, n_rows: int, n_indexed: int):
    """Drop ``rows`` from every table's buckets in place, in blocks of tables of bounded memory:
    one pass over each table and no sort (:func:`fairpipe.bucket_index.remove_rows`), giving the
    arrays :func:`rebuild_index` would. ``n_indexed`` rows are in each table now (the live rows
    before the deletion). Returns the new bucket count of each table."""
    dead = np.zeros(n_rows, dtype=bool)
    dead[rows] = True
    counts = read_array(txn.session, "lsh/bucket_counts").astype(np.int64)
    per_block = int(max(1, min(n_tables, (256 << 20) // max(24 * n_rows, 1))))
    empty_key = np.iinfo(np.uint64).max
    for t0 in range(0, n_tables, per_block):
        t1 = min(t0 + per_block, n_tables)
        block = (slice(t0, t1), slice(None))
        K = read_array(txn.session, "lsh/bucket_keys", block)
        S = read_array(txn.session, "lsh/bucket_starts", block)
        M = read_array(txn.session, "lsh/members", block)
        for j in range(t1 - t0):
            c = int(counts[t0 + j])
            k, st, m = remove_rows(K[j, :c], S[j, : c + 1], M[j, :n_indexed], dead)
            K[j], S[j], M[j] = empty_key, 0, -1
            K[j, : k.shape[0]], S[j, : st.shape[0]], M[j, : m.shape[0]] = k, st, m
            counts[t0 + j] = k.shape[0]
        write_table_rows(txn.session, "lsh/bucket_keys", t0, K)
        write_table_rows(txn.session, "lsh/bucket_starts", t0, S)
        write_table_rows(txn.session, "lsh/members", t0, M)
    txn.root["lsh/bucket_counts"][:] = counts
    return counts


# -- the flow -------------------------------------------------------------------------------------
def _remap_groups(plan: SourcePlan, existing: list[str]) -> tuple[np.ndarray, list[str]]:
    names = list(existing)
    lookup = {nm: i for i, nm in enumerate(names)}
    for nm in plan.group_names:
        if nm not in lookup:
            lookup[nm] = len(names)
            names.append(nm)
    remap = np.array([lookup[nm] for nm in plan.group_names] or [0], dtype=np.int32)
    codes = remap[plan_groups(plan, 0, plan.n)] if plan.group_names else np.zeros(plan.n, np.int32)
    return codes.astype(np.int32), names


def _default_task_runner():
    """Deployments run the flow as is: Dask at ``FAIRPIPE_DASK_ADDRESS``, else a LocalCluster."""
    from flows.runtime import task_runner

    return task_runner(os.environ.get("FAIRPIPE_DASK_ADDRESS") or None)


@flow(name="fairpipe-ingest", log_prints=False, task_runner=_default_task_runner())
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
            lsh = store.load_lsh(txn.session)
            seed = int(attrs["seed"])
        else:
            chunk_rows = options.chunk_rows or choose_chunk_rows(plan.d)
            seed = options.seed
        ids = plan.ids if plan.ids is not None else np.arange(base, base + plan.n, dtype=np.int64)
        if appending:
            old_ids = read_array(txn.session, "ids")
            clash = np.intersect1d(old_ids, ids)
            if clash.size:
                raise FairpipeInputError(
                    ID_CLASH.format(id=int(clash[0]), where=plan.where, url=store.url)
                )
        codes, group_names = _remap_groups(plan, attrs.get("group_names", []))

        if not appending:
            t0 = time.perf_counter()
            if options.lsh_width is None:
                radius_hint, width = estimate_width(plan, ids, seed)
            else:
                width = float(options.lsh_width)
                radius_hint = width / WIDTH_PER_RADIUS
            timings["estimate_width"] = time.perf_counter() - t0
            lsh = E2LSH(k=options.lsh_k, n_tables=options.lsh_tables, width=width, seed=seed).fit(
                plan.d
            )
            _create_layout(txn.root, plan.d, lsh, chunk_rows)
        n_total = base + plan.n
        root = txn.root
        for name in ("points", "ids", "groups", "alive", "lsh/keys"):
            arr = root[name]
            arr.resize((n_total, *arr.shape[1:]))
        L = lsh.n_tables
        index_chunk = min(max(n_total, 1), 1 << 22)
        for name, extra, fill, dtype in (
            ("lsh/members", 0, -1, "int64"),
            ("lsh/bucket_keys", 0, np.iinfo(np.uint64).max, "uint64"),
            ("lsh/bucket_starts", 1, 0, "int64"),
        ):
            if name in root:
                del root[name]
            root.create_array(
                name,
                shape=(L, n_total + extra),
                chunks=(1, index_chunk + extra),
                dtype=dtype,
                fill_value=fill,
            )

        # Chunks aligned to the store's row chunks, so no two jobs write the same Zarr chunk.
        edges = list(range(base, n_total, chunk_rows))
        if base % chunk_rows:
            edges = [base] + [
                e for e in range((base // chunk_rows + 1) * chunk_rows, n_total, chunk_rows)
            ]
        edges.append(n_total)
        chunks = [(a - base, b - base) for a, b in zip(edges[:-1], edges[1:])]
        t0 = time.perf_counter()
        results = write_rows_task.submit(txn.fork(), plan, lsh, chunks, base, ids, codes).result()
        txn.merge([fork for fork, _ in results])
        timings["hash_and_write"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        counts = rebuild_index(txn, L, n_total)
        timings["bucket_index"] = time.perf_counter() - t0

        # Live rows per group (a forgotten row's group is erased to -1).
        groups_all = read_array(txn.session, "groups")[read_array(txn.session, "alive")]
        per_group = np.bincount(groups_all, minlength=max(len(group_names), 1)).tolist()
        meta = {
            "fairpipe_format": FORMAT,
            "n": n_total,
            "n_alive": int(read_array(txn.session, "alive").sum()),
            "d": plan.d,
            "seed": seed,
            "chunk_rows": chunk_rows,
            "group_names": group_names,
            "lsh": {"k": lsh.k, "n_tables": L, "width": lsh.width, "seed": lsh.seed},
            "suggested_radius": attrs.get("suggested_radius", lsh.width / WIDTH_PER_RADIUS)
            if appending
            else radius_hint,
            "sources": [*attrs.get("sources", []), source],
        }
        txn.root.attrs.update(meta)
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


def _create_layout(root, d: int, lsh: E2LSH, chunk_rows: int) -> None:
    L = lsh.n_tables
    root.create_array("points", shape=(0, d), chunks=(chunk_rows, d), dtype="float32")
    root.create_array("ids", shape=(0,), chunks=(chunk_rows,), dtype="int64")
    root.create_array("groups", shape=(0,), chunks=(chunk_rows,), dtype="int32")
    root.create_array("alive", shape=(0,), chunks=(chunk_rows,), dtype="bool")
    root.create_group("lsh")
    root.create_array("lsh/keys", shape=(0, L), chunks=(chunk_rows, L), dtype="uint64")
    for name, arr in lsh.params_arrays().items():
        root.create_array(f"lsh/{name}", shape=arr.shape, dtype=arr.dtype)[...] = arr


def run_ingest(
    source: str,
    store_url: str,
    options: IngestOptions | None = None,
    dask_address: str | None = None,
    n_workers: int = 2,
    processes: bool = True,
) -> dict:
    """Run the ingest flow on an embedded LocalCluster (or ``dask_address``)."""
    from flows.runtime import prefect_api, task_runner

    options = options or IngestOptions()
    with prefect_api():
        runner = task_runner(dask_address, n_workers=n_workers, processes=processes)
        return ingest_flow.with_options(task_runner=runner)(source, str(store_url), options)


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run_ingest(sys.argv[1], sys.argv[2]), indent=2, default=str))
