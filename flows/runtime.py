"""What every flow shares: the Prefect API, the Dask task runner, one way to run a flow, and the
Dask adapters (mapping jobs from inside a task, the shuffle of rows by leaf).

With no ``PREFECT_API_URL``, every Dask worker *process* would start its own ephemeral Prefect
server (3 servers for 2 workers, and 5-15 times slower flows). So :func:`prefect_api` starts one
server here, points this process and the worker processes (through the environment, before the
cluster starts) at it, and flushes logs before stopping it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Sequence

import numpy as np

from fairpipe.cluster import LEAF_BATCH_POINTS
from fairpipe.tree import leaf_of
from flows import DEFAULT_ENV  # noqa: F401  (applied on import of the package)
from flows._server import LocalServer, adopt_early
from flows.private import CALLER_REPORTS, RedactedError, conceal
from storage.index import n_features, read_live_rows


@contextlib.contextmanager
def prefect_api(warm_kernels: bool = False):
    """Use ``PREFECT_API_URL`` if set; otherwise run one local server for this process tree
    (the one a command line launched early, :func:`flows._server.launch_early`, if any), and
    meanwhile import what a flow imports (and load the index build's compiled kernels if
    ``warm_kernels``: :func:`import_ahead`)."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    import prefect.settings

    server = adopt_early() or LocalServer()
    if server.process is None:
        server.launch(prefect_settings=True)
    try:
        import_ahead(warm_kernels)  # while the server boots (a command waits about 2 s for it)
        server.wait()
        os.environ["PREFECT_API_URL"] = server.api_url
        with prefect.settings.temporary_settings(
            updates={prefect.settings.PREFECT_API_URL: server.api_url}
        ):
            try:
                yield server.api_url
            finally:
                _drain_logs()  # also after a failure: the server must outlive its last logs
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


def import_ahead(warm_kernels: bool = False) -> None:
    """Import what a flow run imports on first use: the store's libraries, Prefect's parameter
    encoder and its Dask task runner (about 0.8 s in all, which a one-id forget at 1M used to
    spend inside its flow and before it). Done while a local Prefect server boots, these
    imports overlap its start (on this 2-core machine, 0.1-0.7 s less wall time per command).
    ``warm_kernels``: also load the index build's compiled kernels (about 0.5 s), so that the
    flow folds and packs even a small append with them (:func:`fairpipe.neighbors._pack.warm`;
    an ingest asks for it)."""
    import icechunk  # noqa: F401
    import zarr  # noqa: F401

    with contextlib.suppress(ImportError):
        import fastapi.encoders  # noqa: F401
        import prefect_dask  # noqa: F401
    if warm_kernels:
        from fairpipe.neighbors._pack import warm

        warm()


def _drain_logs() -> None:
    from prefect.logging.handlers import APILogWorker

    with contextlib.suppress(Exception):
        APILogWorker.drain_all(timeout=5)


def keep_malloc_defaults() -> None:
    """Spawn local Dask workers without distributed's ``MALLOC_TRIM_THRESHOLD_=65536``.

    Setting that variable turns off glibc's adaptive mmap threshold, so every numpy temporary over
    128 KiB is a fresh mmap (page faults, high system time): the ADF search ran 3x slower in the
    workers than in this process (11.9 s against 3.9 s for 1,000 Adult seeds, one thread). The
    BLAS thread limits of the default are kept. External clusters keep their own settings.
    """
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    dask.config.set({"distributed.nanny.pre-spawn-environ": environ})


_EARLY_RUNNER: type | None = None


def __getattr__(name: str):
    # The task runner's class is made on first use (importing prefect_dask costs about a second,
    # which this module's other users do not pay), and found here by pickle.
    if name == "EarlyDaskTaskRunner":
        return _runner_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _runner_class() -> type:
    """prefect_dask's DaskTaskRunner whose client (and embedded cluster, made on first use) can
    be started ahead, in a thread, while the flow does other work (:func:`start_cluster_early`):
    a lock makes every first use wait for one creation instead of racing it."""
    global _EARLY_RUNNER
    if _EARLY_RUNNER is not None:
        return _EARLY_RUNNER
    import threading

    from prefect_dask import DaskTaskRunner

    class EarlyDaskTaskRunner(DaskTaskRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._client_lock = threading.Lock()

        def __getstate__(self):  # the flow (and its runner) travels with tasks sent to Dask
            state = self.__dict__.copy()
            state.pop("_client_lock", None)
            state.pop("_warming", None)
            return state

        def __setstate__(self, state):
            self.__dict__.update(state)
            self._client_lock = threading.Lock()

        @property
        def client(self):
            with self._client_lock:
                return DaskTaskRunner.client.fget(self)  # type: ignore[attr-defined]

        def start_early(self) -> None:
            if self._client is None and self._started and self.__dict__.get("_warming") is None:
                self._warming = threading.Thread(target=self._warm, name="fairpipe-cluster",
                                                 daemon=True)  # fmt: skip
                self._warming.start()

        def __exit__(self, *args) -> None:
            # A cluster still starting is entered in the exit stack when it is up: wait for it,
            # so the flow run's end (an error included) closes it too.
            warming = self.__dict__.pop("_warming", None)
            if warming is not None:
                warming.join()
            super().__exit__(*args)

        def _warm(self) -> None:
            # A failure here is raised again by the first real use (which retries).
            with contextlib.suppress(Exception):
                _ = self.client

    EarlyDaskTaskRunner.__module__ = __name__
    EarlyDaskTaskRunner.__qualname__ = "EarlyDaskTaskRunner"
    _EARLY_RUNNER = EarlyDaskTaskRunner
    return EarlyDaskTaskRunner


def task_runner(dask_address: str | None = None, n_workers: int = 2, processes: bool = True):
    """A DaskTaskRunner on an existing scheduler, or on an embedded LocalCluster."""
    runner_class = _runner_class()
    if dask_address:
        return runner_class(address=dask_address)
    keep_malloc_defaults()
    return runner_class(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs=local_cluster_kwargs(n_workers, processes),
    )


def start_cluster_early() -> None:
    """Start the flow run's Dask client (an embedded cluster: its two worker processes, about
    1 s) in a thread, so that it overlaps the flow's own work before its first Dask job (a
    drain's erasing of rows, an ingest's planning and width estimate). Nothing for a flow run
    whose cluster is up, or that runs on no Dask task runner."""
    runner = _flow_task_runner()
    if runner is not None and hasattr(runner, "start_early"):
        runner.start_early()


def local_cluster_kwargs(n_workers: int = 2, processes: bool = True) -> dict:
    """Settings of the embedded LocalCluster: one thread per worker, no dashboard.

    A scheduler serves its health and metrics routes over HTTP even without a dashboard, on
    port 8787 unless told otherwise; a second fairpipe command running at the same time would
    then warn that the port is taken. A free port is taken instead.
    """
    return {
        "n_workers": n_workers,
        "threads_per_worker": 1,
        "processes": processes,
        "dashboard_address": None,
        "scheduler_kwargs": {"dashboard_address": ":0"},
    }


def default_task_runner():
    """The task runner a flow is declared with (deployments run the flow as is): Dask at
    ``FAIRPIPE_DASK_ADDRESS``, else a LocalCluster started inside the flow run."""
    return task_runner(os.environ.get("FAIRPIPE_DASK_ADDRESS") or None)


def run_flow(flow, *args, dask_address: str | None = None, n_workers: int = 2,
             processes: bool = True, warm_kernels: bool = False, **kwargs):  # fmt: skip
    """Run ``flow(*args, **kwargs)`` with one Prefect API and a Dask task runner: the cluster at
    ``dask_address``, or an embedded LocalCluster of ``n_workers`` (processes or threads),
    started at the flow's first task. (Starting it while the Prefect server starts was
    measured: on 2 cores the two compete, and a command took as long.) ``warm_kernels``: see
    :func:`prefect_api`.

    Prefect records no person's ids: the arguments the flow declares private are given to it
    concealed, and its error is recorded as a reference (:mod:`flows.private`); the error itself
    is raised here."""
    args, kwargs = _concealed(flow, args, kwargs)
    token = CALLER_REPORTS.set(True)
    try:
        with prefect_api(warm_kernels), no_exit_heartbeat_wait():
            runner = task_runner(dask_address, n_workers=n_workers, processes=processes)
            return flow.with_options(task_runner=runner)(*args, **kwargs)
    except RedactedError as redacted:
        original = redacted.original  # Prefect recorded a reference; the caller gets the error
        if original is None:
            raise
    finally:
        CALLER_REPORTS.reset(token)
    raise original


def _concealed(flow, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of ``flow`` with those Prefect must not record wrapped in
    :class:`~flows.private.Private`: the parameters it declares private, and the private fields
    of options dataclasses (:mod:`flows.private`)."""
    import inspect

    private = getattr(flow.fn, "private_parameters", ())
    bound = inspect.signature(flow.fn).bind_partial(*args, **kwargs)
    for name, value in bound.arguments.items():
        if name in private or dataclasses.is_dataclass(value):
            bound.arguments[name] = conceal(value)
    return bound.args, bound.kwargs


HEARTBEAT_VARIABLES = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")


@contextlib.contextmanager
def no_exit_heartbeat_wait():
    """Run a command's flow without Prefect's flow-run heartbeats, unless the user set
    ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``.

    Prefect 3.8 sends them from a thread that sleeps in 1-second steps, and a flow run's end
    joins that thread: every flow run waited up to a second after its work was done (a trivial
    flow took 1.18 s instead of 0.21 s; a one-id forget at 1M, 1.18 s instead of 0.54 s, 0.28 s of
    it the flow's work: benchmarks/bench_flow_overhead.py).
    Heartbeats only serve automations that declare a run crashed when they stop; a flow run by
    a deployment's worker (not through here) keeps them.
    """
    if any(name in os.environ for name in HEARTBEAT_VARIABLES):
        yield
        return
    import prefect.settings

    with prefect.settings.temporary_settings(
        updates={prefect.settings.PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    ):
        yield


def cluster_running() -> bool:
    """Whether the flow run's Dask cluster costs nothing more to use: an external one (an
    address), or an embedded one already started. False for an embedded LocalCluster not yet
    started (the task runner starts it at its first task), and outside a flow run."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    runner = getattr(context, "task_runner", None)
    return bool(getattr(runner, "_client", None) or getattr(runner, "address", None))


@contextlib.contextmanager
def dask_client():
    """A Dask client usable from inside a Prefect task, wherever it runs.

    In the flow's process (the fan-out tasks are called there, docs/architecture.md): the flow
    run's Dask task runner's own client, which starts an embedded cluster on first use. On a Dask
    worker: ``prefect_dask.get_dask_client`` does not secede from the worker's thread pool, so
    with one worker thread the jobs a task submits would wait forever for the thread their
    parent holds; ``distributed.worker_client`` secedes while it waits and rejoins afterwards.
    """
    from distributed import get_worker, worker_client

    try:
        get_worker()
        on_worker = True
    except ValueError:  # not on a worker (a flow run in this process)
        on_worker = False
    # (branched outside the except: a job's error is then not shown as raised while handling
    # "No worker found")
    if on_worker:
        with worker_client() as client:
            yield client
        return
    runner = _flow_task_runner()
    if runner is not None:  # the runner's client, made on first use (an embedded cluster)
        yield runner.client
        return
    from prefect_dask import get_dask_client

    with get_dask_client() as client:
        yield client


def _flow_task_runner():
    """The Dask task runner of the flow run in this process, if any."""
    from prefect.context import FlowRunContext
    from prefect_dask import DaskTaskRunner

    runner = getattr(FlowRunContext.get(), "task_runner", None)
    return runner if isinstance(runner, DaskTaskRunner) else None


def dask_map(fn, *iterables, scatter: tuple[int, ...] = ()) -> list:
    """Map ``fn`` over the cluster from inside a Prefect task and gather the results.
    ``scatter``: positions of the iterables whose items are large (arrays): each distinct item
    is sent to the cluster once, ahead of the jobs, so the task graph holds references to it
    (a deletion batch of 50,000 rows put 38 MB of bucket keys in the graph, and Dask warned)."""
    with dask_client() as client:
        args = [list(items) for items in iterables]
        for i in scatter:
            distinct = {id(item): item for item in args[i]}
            sent = dict(zip(distinct, client.scatter(list(distinct.values()), hash=False)))
            args[i] = [sent[id(item)] for item in args[i]]
        return gather(client, client.map(fn, *args, pure=False))


# Seconds an interrupted or failed fan-out waits for its jobs still running (see gather).
JOBS_GRACE_SECONDS = 30.0


def gather(client, futures: list, also: Sequence = ()) -> list:
    """The results of ``futures`` (``also``: jobs they depend on, not gathered). If this fails or is interrupted (a job's error, Ctrl-C, the
    SIGTERM the command line turns into one), the jobs still running are let end first, up to
    JOBS_GRACE_SECONDS: they write into the store's storage, and the caller is about to remove
    what was written (a failed transaction's objects, a new store that is not to be); a job
    writing after that would leave objects behind. A second interrupt stops the wait."""
    try:
        return client.gather(futures)
    except BaseException:
        import time

        running = [*also, *futures]
        deadline = time.monotonic() + JOBS_GRACE_SECONDS
        for future in running:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(Exception):  # its own error, a time-out, a lost worker
                future.exception(timeout=left)  # returns once the job has ended
        with contextlib.suppress(Exception):
            client.cancel(running)
        raise


# -- the shuffle of rows by leaf (DC-k-means and the fair summary) --------------------------------
def leaf_groups(n_leaves: int, n_alive: int) -> np.ndarray:
    """Edges of runs of consecutive leaves with about LEAF_BATCH_POINTS points each (>= 8 runs
    where there are that many leaves, so the work spreads over the workers)."""
    per_leaf = max(n_alive / max(n_leaves, 1), 1.0)
    size = max(1, min(int(LEAF_BATCH_POINTS // per_leaf), math.ceil(n_leaves / 8)))
    return np.append(np.arange(0, n_leaves, size), n_leaves)


def split_by_leaf_group(session, a: int, b: int, seed: int, n_leaves: int, edges: np.ndarray,
                        rows=None) -> dict:  # fmt: skip
    """Live rows of [a, b) (or only ``rows`` of it) split by leaf group:
    {group: (X, ids, leaf, groups)}."""
    X, ids, groups = read_live_rows(session, a, b, rows)
    if ids.size == 0:
        return {}
    leaf = leaf_of(ids, seed, n_leaves)
    group = np.searchsorted(edges, leaf, side="right") - 1
    return {
        int(g): (X[group == g], ids[group == g], leaf[group == g], groups[group == g])
        for g in np.unique(group)
    }


def gather_parts(d: int, given) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One leaf group's parts from every chunk job, concatenated: (X, ids, leaf, groups)."""
    parts = [p for p in given if p is not None]
    if not parts:
        z = np.zeros(0, np.int64)
        return np.zeros((0, d), np.float32), z, z, z.astype(np.int32)
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(4))  # type: ignore[return-value]


def reached_leaves(all_ids, alive_after, rows, seed: int, n_leaves: int):
    """(the leaves holding the deleted ``rows`` (sorted), the live rows left in them): what a
    deletion batch makes a tree recompute."""
    leaf_all = leaf_of(all_ids, seed, n_leaves)
    leaves = np.unique(leaf_all[rows])
    return leaves, np.flatnonzero(alive_after & np.isin(leaf_all, leaves))


def read_leaf_rows(session, rows: np.ndarray, chunk_rows: int, n_rows: int, seed: int,
                   n_leaves: int, d: int):  # fmt: skip
    """(X, ids, leaf, groups) of the stored ``rows`` read in this process, chunk by chunk: the
    local twin of the shuffle, for a few leaves."""
    parts = [
        split_by_leaf_group(session, int(a), min(int(a) + chunk_rows, n_rows), seed, n_leaves,
                            np.zeros(1, np.int64), rows).get(0)
        for a in np.unique(rows // chunk_rows) * chunk_rows
    ]  # fmt: skip
    return gather_parts(d, parts)


def _pick(parts: dict, g: int):
    return parts.get(g)


def shuffle_by_leaf(session, n_rows, chunk_rows, seed, n_leaves, leaves_wanted, solve, args,
                    rows=None) -> list:  # fmt: skip
    """Run ``solve(leaves, *args, d, *parts)`` on Dask for every leaf group of ``leaves_wanted``
    (sorted): one job per row chunk splits its live rows (or only ``rows``) by leaf group, one job
    per leaf group gathers its parts (a shuffle: each worker holds only what passes through it).
    Returns the jobs' results, in group order."""
    d = n_features(session)
    edges = leaf_groups(n_leaves, n_rows)
    group_of = np.searchsorted(edges, leaves_wanted, side="right") - 1
    chunks = [(a, min(a + chunk_rows, n_rows)) for a in range(0, n_rows, chunk_rows)]
    if rows is not None:  # only the chunks holding rows of interest
        chunks = [(a, b) for a, b in chunks if ((rows >= a) & (rows < b)).any()]
    with dask_client() as client:
        split = [
            client.submit(split_by_leaf_group, session, a, b, seed, n_leaves, edges, rows,
                          pure=False)
            for a, b in chunks
        ]  # fmt: skip
        jobs = []
        for g in np.unique(group_of):
            parts = [client.submit(_pick, s, int(g), pure=False) for s in split]
            leaves = leaves_wanted[group_of == g]
            jobs.append(client.submit(solve, leaves, *args, d, *parts, pure=False))
        return gather(client, jobs, also=split)
