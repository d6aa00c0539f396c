"""What every flow shares: the Prefect API, the task runner (Prefect tasks in the flow's process,
holding its Dask client), the cluster's checks, one way to run a flow, and the Dask adapters
(mapping jobs from inside a task, the shuffle of rows by leaf).

Only the flow's own process talks to Prefect: its Prefect tasks run there, on threads, and send
their heavy work to Dask as plain functions with explicit inputs (no Dask worker needs the Prefect
API, which a real cluster's workers cannot reach). With no ``PREFECT_API_URL``,
:func:`prefect_api` starts one local server for this process and flushes logs before stopping it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Sequence

import numpy as np

from fairpipe.cluster import LEAF_BATCH_POINTS
from fairpipe.errors import FairpipeInputError
from fairpipe.tree import leaf_of
from flows import DEFAULT_ENV  # noqa: F401  (applied on import of the package)
from flows.prefect_server import LocalServer, adopt_early, deliver_records
from flows.private import CALLER_REPORTS, RedactedError, conceal
from storage.index import n_features, read_live_rows


@contextlib.contextmanager
def prefect_api(warm_kernels: bool = False):
    """Use ``PREFECT_API_URL`` if set; otherwise run one local server for this process tree
    (the one a command line launched early, :func:`flows.prefect_server.launch_early`, if any), and
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
                deliver_records(
                    logs_only=True
                )  # also after a failure: the server must outlive its last logs
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


def import_ahead(warm_kernels: bool = False) -> None:
    """Import what a flow run imports on first use: the store's libraries, Prefect's parameter
    encoder and Dask's client (about 0.8 s in all, which a one-id forget at 1M used to
    spend inside its flow and before it). Done while a local Prefect server boots, these
    imports overlap its start (on this 2-core machine, 0.1-0.7 s less wall time per command).
    ``warm_kernels``: also load the index build's compiled kernels (about 0.5 s), so that the
    flow folds and packs even a small append with them (:func:`fairpipe.neighbors.warm_index_kernels`;
    an ingest asks for it)."""
    import icechunk  # noqa: F401
    import zarr  # noqa: F401

    with contextlib.suppress(ImportError):
        import distributed  # noqa: F401
        import fastapi.encoders  # noqa: F401
    if warm_kernels:
        from fairpipe.neighbors import warm_index_kernels

        warm_index_kernels()


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


# -- the cluster: its address checked, reached, and its workers checked ---------------------------
CONNECT_SECONDS = 5.0  # a scheduler that does not answer is reported within 10 s of the start
DASK_SCHEMES = ("tcp", "tls", "ws", "wss", "inproc", "ucx")
BAD_ADDRESS = (
    "The '--dask-address' option must be a Dask scheduler address such as "
    "tcp://10.0.0.5:8786. Got {address!r} instead."
)
UNREACHABLE_SCHEDULER = (
    "No Dask scheduler answers at {address} within {seconds:.0f} s ({why}). Check the address "
    "and that the scheduler is running and reachable from this machine."
)
NOT_DASK = (
    "The server at {address} does not answer as a Dask scheduler. Give the scheduler's address "
    "(its log says 'Scheduler at: tcp://...')."
)
NO_TLS_CREDENTIALS = (
    "The scheduler at {address} takes TLS, and Dask's configuration names no certificates. "
    "Set distributed.comm.tls.ca-file, .client.cert and .client.key (or "
    "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, __CLIENT__CERT, __CLIENT__KEY), or give "
    "'--dask-cluster' a callable that returns the cluster with its credentials."
)
NOT_A_SCHEDULER = (
    "The server at {address} is a Dask {kind}, not a scheduler. Give the scheduler's address "
    "(its log says 'Scheduler at: tcp://...')."
)
VERSION_MISMATCH = (
    "The Dask workers run fairpipe {theirs}, this command fairpipe {ours}: worker {worker}. "
    "Install fairpipe {ours} on every worker (a mixed cluster computes wrong results)."
)
NO_FAIRPIPE = (
    "The Dask worker {worker} cannot import fairpipe ({why}). Install fairpipe {ours} on every "
    "worker."
)
WORKER_CANNOT_REACH = (
    "The Dask worker {worker} cannot reach the store's endpoint {endpoint} ({why}), which this "
    "machine reaches. Make the endpoint reachable from the workers, or give one both reach "
    "(AWS_ENDPOINT_URL)."
)
WORKER_CANNOT_SEE = (
    "The Dask worker {worker} cannot see the store's folder {folder}, which is on this "
    "machine's disk. Give a folder every worker shares with this machine (a network "
    "filesystem), or an object-store URL (s3://...)."
)
NO_WORKERS = (
    "The Dask scheduler at {address} has no workers (waited {seconds:.0f} s). Start workers "
    "for it, or leave out '--dask-address' to run on this machine."
)


def check_dask_address(address: str) -> str:
    """``address`` if it reads as a Dask scheduler address (``[scheme://]host:port``), else a
    :class:`FairpipeInputError`, before anything is tried."""
    from distributed.comm.addressing import parse_address, parse_host_port

    bad = FairpipeInputError(BAD_ADDRESS.format(address=address))
    if not address or any(c.isspace() for c in address):
        raise bad
    try:
        scheme, location = parse_address(address)
    except (ValueError, TypeError):
        raise bad from None
    if scheme not in DASK_SCHEMES:
        raise bad
    if scheme == "inproc":
        return address
    try:
        host, port = parse_host_port(location)
    except (ValueError, TypeError):
        raise bad from None
    if not host or not port:
        raise bad
    return address


def connect(address: str, store_url: str | None = None):
    """A Dask client of the scheduler at ``address``, its workers checked before any work: the
    same fairpipe version as this process, and able to reach the store. Each problem is a
    one-line :class:`FairpipeInputError`."""
    from distributed import Client

    check_dask_address(address)
    probe_scheduler(address)
    try:
        client = Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
    except (OSError, TimeoutError) as why:
        raise _unreachable(address, why) from None
    try:
        check_workers(client, address, store_url)
    except BaseException:
        client.close()
        raise
    return client


def probe_scheduler(address: str) -> None:
    """Raise a one-line :class:`FairpipeInputError` unless a Dask scheduler answers at
    ``address`` within CONNECT_SECONDS: a refused connection at once (a Dask client would retry
    it until its time-out), a server that is not a Dask scheduler (a worker's address, another
    service) without the errors of a client reading what it sends."""
    import asyncio

    from distributed.core import rpc
    from distributed.security import Security

    # A tls:// scheduler is asked with the credentials Dask's configuration names
    # (distributed.comm.tls.*), as a Client of it would be.
    connection_args = Security().get_connection_args("client")
    if address.startswith("tls://") and connection_args.get("ssl_context") is None:
        raise FairpipeInputError(NO_TLS_CREDENTIALS.format(address=address))

    async def ask() -> dict:
        async with rpc(address, timeout=CONNECT_SECONDS,
                       connection_args=connection_args) as scheduler:  # fmt: skip
            return await scheduler.identity()

    scheme, _, location = address.rpartition("://")
    if scheme in ("", "tcp", "tls"):
        import socket

        from distributed.comm.addressing import parse_host_port

        try:
            socket.create_connection(parse_host_port(location), timeout=CONNECT_SECONDS).close()
        except OSError as why:
            raise _unreachable(address, why) from None
    try:
        identity = asyncio.run(asyncio.wait_for(ask(), CONNECT_SECONDS))
    except (OSError, TimeoutError) as why:
        raise _unreachable(address, why) from None
    except Exception:  # whatever the other end sent (an HTTP server's answer read as a frame)
        raise FairpipeInputError(NOT_DASK.format(address=address)) from None
    if not isinstance(identity, dict) or identity.get("type") != "Scheduler":
        kind = identity.get("type") if isinstance(identity, dict) else type(identity).__name__
        raise FairpipeInputError(NOT_A_SCHEDULER.format(address=address, kind=kind))


def _unreachable(address: str, why: BaseException) -> FairpipeInputError:
    reason = getattr(why, "strerror", None) or type(why).__name__
    return FairpipeInputError(
        UNREACHABLE_SCHEDULER.format(address=address, seconds=CONNECT_SECONDS, why=reason)
    )


WORKERS_WAIT_SECONDS = 10.0


def check_workers(client, address: str, store_url: str | None = None) -> None:
    """Raise a one-line :class:`FairpipeInputError` if a worker of ``client`` runs another
    fairpipe version than this process, or cannot reach the store's S3 endpoint."""
    import fairpipe

    try:
        client.wait_for_workers(1, timeout=WORKERS_WAIT_SECONDS)
    except (TimeoutError, OSError):
        raise FairpipeInputError(
            NO_WORKERS.format(address=address, seconds=WORKERS_WAIT_SECONDS)
        ) from None
    # A builtin runs on the workers (never this module, which a worker of another version may
    # lack): what they import as fairpipe.
    versions = client.run(eval, "__import__('fairpipe').__version__", on_error="return")
    for worker, theirs in sorted(versions.items()):
        if isinstance(theirs, BaseException):
            why = f"{type(theirs).__name__}: {theirs}"
            raise FairpipeInputError(
                NO_FAIRPIPE.format(worker=worker, why=why, ours=fairpipe.__version__)
            )
        if theirs != fairpipe.__version__:
            raise FairpipeInputError(
                VERSION_MISMATCH.format(worker=worker, theirs=theirs, ours=fairpipe.__version__)
            )
    folder = store_folder(store_url)
    if folder is not None:
        seen = client.run(os.path.isdir, folder, on_error="return")
        for worker, there in sorted(seen.items()):
            if there is not True:
                raise FairpipeInputError(WORKER_CANNOT_SEE.format(worker=worker, folder=folder))
    endpoint = store_endpoint(store_url)
    if endpoint is None:
        return
    host, port = endpoint_host_port(endpoint)
    reached = client.run(reach, host, port, on_error="return")
    for worker, why in sorted(reached.items()):
        if why is not None:
            raise FairpipeInputError(
                WORKER_CANNOT_REACH.format(worker=worker, endpoint=endpoint, why=why)
            )


def store_folder(store_url: str | None) -> str | None:
    """The folder of a store on this machine's disk that exists (the workers must see it too),
    or None (an object store; a new store, which its command makes)."""
    if not store_url:
        return None
    from storage.urls import parse_store_url

    try:
        local = parse_store_url(store_url).local_dir
    except FairpipeInputError:
        return None  # reported by the command's own checks
    return str(local) if local is not None and local.is_dir() else None


def store_endpoint(store_url: str | None) -> str | None:
    """The S3-compatible endpoint the store at ``store_url`` is reached at (the workers use
    this process's: it travels in the sessions they are given), or None."""
    if not store_url or not store_url.startswith("s3://"):
        return None
    from storage.urls import s3_endpoint

    return s3_endpoint()


def endpoint_host_port(endpoint: str) -> tuple[str, int]:
    from urllib.parse import urlparse

    parts = urlparse(endpoint)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def reach(host: str, port: int, timeout: float = 5.0) -> str | None:
    """(Run on a worker.) Why a TCP connection to ``host:port`` fails, or None."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


# -- a cluster made by the user's own code (Coiled, dask-jobqueue, dask-kubernetes, ...) ----------
BAD_CLUSTER_SPEC = (
    "The '--dask-cluster' option must name a Python callable as 'module:name' (for example "
    "mycluster:make_cluster, with mycluster.py in the current folder). Got {spec!r} instead."
)
CLUSTER_NOT_IMPORTED = "The '--dask-cluster' callable {spec!r} cannot be imported: {why}."
CLUSTER_FAILED = "The '--dask-cluster' callable {spec!r} failed: {why}."
CLUSTER_NOT_A_CLUSTER = (
    "The '--dask-cluster' callable {spec!r} returned {kind}, not a Dask cluster or client."
)
BOTH_CLUSTERS = "Give '--dask-address' or '--dask-cluster', not both."


def cluster_factory(spec: str):
    """The callable ``spec`` names (``module:name``, ``name`` may be dotted), imported with the
    current folder on the module path, as ``python -m`` would."""
    import importlib
    import re
    import sys

    ident = r"[A-Za-z_][A-Za-z0-9_]*"
    if not re.fullmatch(rf"{ident}(\.{ident})*:{ident}(\.{ident})*", spec or ""):
        raise FairpipeInputError(BAD_CLUSTER_SPEC.format(spec=spec))
    module_name, _, attribute = spec.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as why:
        raise FairpipeInputError(
            CLUSTER_NOT_IMPORTED.format(spec=spec, why=f"{type(why).__name__}: {why}")
        ) from None
    if not callable(found):
        raise FairpipeInputError(
            CLUSTER_NOT_A_CLUSTER.format(spec=spec, kind=type(found).__name__)
        )  # fmt: skip
    return found


def connect_cluster(spec: str, store_url: str | None = None):
    """(client, cluster): a client of the cluster the user's callable ``spec`` makes, its
    workers checked as :func:`connect` checks them. The callable returns a Dask ``Client``
    (fairpipe closes that client at the end, the cluster stays up: a Coiled cluster by name, a
    scheduler the user keeps) or a cluster object (``LocalCluster``, ``SLURMCluster``,
    ``KubeCluster``, ``coiled.Cluster``: fairpipe closes it at the end, a cluster per command as
    prefect-dask's ``cluster_class``). A cluster object brings its own credentials (a TLS
    scheduler's certificates), which a bare address cannot."""
    from distributed import Client

    factory = cluster_factory(spec)
    try:
        made = factory()
    except Exception as why:
        raise FairpipeInputError(
            CLUSTER_FAILED.format(spec=spec, why=f"{type(why).__name__}: {why}")
        ) from None
    if isinstance(made, Client):
        client, cluster = made, None
    elif hasattr(made, "scheduler_address"):
        cluster = made
        try:
            client = Client(cluster, timeout=CONNECT_SECONDS, set_as_default=False)
        except BaseException:
            with contextlib.suppress(Exception):
                cluster.close()
            raise
    else:
        raise FairpipeInputError(
            CLUSTER_NOT_A_CLUSTER.format(spec=spec, kind=type(made).__name__)
        )  # fmt: skip
    try:
        check_workers(client, str(getattr(client.scheduler, "address", None) or spec), store_url)
    except BaseException:
        close_client(client, cluster)
        raise
    return client, cluster


def close_client(client, cluster) -> None:
    """Close ``client`` and then ``cluster`` (if any), whatever fails."""
    with contextlib.suppress(Exception):
        client.close()
    if cluster is not None:
        with contextlib.suppress(Exception):
            cluster.close()


def open_client(address: str | None, n_workers: int = 2, processes: bool = True,
                store_url: str | None = None, cluster_spec: str | None = None):  # fmt: skip
    """(client, cluster): a client of the scheduler at ``address`` (checked, :func:`connect`;
    cluster None), of the cluster the callable ``cluster_spec`` makes
    (:func:`connect_cluster`), or of an embedded LocalCluster of ``n_workers``."""
    from distributed import Client, LocalCluster

    if address:
        return connect(address, store_url), None
    if cluster_spec:
        return connect_cluster(cluster_spec, store_url)
    keep_malloc_defaults()
    cluster = LocalCluster(**local_cluster_kwargs(n_workers, processes))
    try:
        return Client(cluster, set_as_default=False), cluster
    except BaseException:
        cluster.close()
        raise


# -- the flows' task runner -------------------------------------------------------------------------
_RUNNER_CLASS: type | None = None


def __getattr__(name: str):
    # The task runner's class is made on first use (it imports Prefect's task runners, which
    # this module's other users, the Dask workers among them, do not pay for).
    if name == "ClusterTaskRunner":
        return _runner_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _runner_class() -> type:
    """Prefect's :class:`~prefect.task_runners.ThreadPoolTaskRunner` (a flow's Prefect tasks run
    on threads of the flow's own process, the only one that talks to the Prefect API) holding
    the flow run's Dask client: the cluster at an address, or an embedded LocalCluster made on
    first use (or ahead, in a thread: :func:`start_cluster_early`) and closed at the flow run's
    end. The tasks send their heavy work to the cluster as plain functions with explicit inputs
    (:func:`dask_client`, :func:`on_cluster`), which no worker needs Prefect for.

    Only the public task-runner interface is used: ``duplicate`` (the flow engine enters a
    copy) and the context manager."""
    global _RUNNER_CLASS
    if _RUNNER_CLASS is not None:
        return _RUNNER_CLASS
    import threading

    from prefect.task_runners import ThreadPoolTaskRunner

    class ClusterTaskRunner(ThreadPoolTaskRunner):
        def __init__(self, address: str | None = None, n_workers: int = 2,
                     processes: bool = True, client=None, store_url: str | None = None,
                     cluster_spec: str | None = None):  # fmt: skip
            super().__init__()
            self.address, self.n_workers, self.processes = address, n_workers, processes
            self.cluster_spec = cluster_spec
            self.store_url = store_url
            self._given = client  # a client its caller opened and closes (run_flow)
            self._dask = client
            self._cluster = None
            self._dask_lock = threading.Lock()
            self._warming: threading.Thread | None = None

        def duplicate(self):
            return type(self)(self.address, self.n_workers, self.processes, self._given,
                              self.store_url, self.cluster_spec)  # fmt: skip

        @property
        def dask_client(self):
            """The flow run's Dask client, made on first use."""
            with self._dask_lock:
                if self._dask is None:
                    self._dask, self._cluster = open_client(
                        self.address, self.n_workers, self.processes,
                        self.store_url or _run_store_url(), self.cluster_spec,
                    )  # fmt: skip
                return self._dask

        @property
        def cluster_running(self) -> bool:
            return self._dask is not None or bool(self.address or self.cluster_spec)

        def start_early(self) -> None:
            if self._dask is None and self._warming is None:
                self._warming = threading.Thread(target=self._warm, name="fairpipe-cluster",
                                                 daemon=True)  # fmt: skip
                self._warming.start()

        def _warm(self) -> None:
            # A failure here is raised again by the first real use (which retries).
            with contextlib.suppress(Exception):
                _ = self.dask_client

        def __exit__(self, *args) -> None:
            try:
                super().__exit__(*args)  # the tasks end first
            finally:
                # A cluster still starting is waited for, so that the run's end closes it too.
                if self._warming is not None:
                    self._warming.join()
                    self._warming = None
                if self._dask is not None and self._dask is not self._given:
                    with contextlib.suppress(Exception):
                        self._dask.close()
                if self._cluster is not None:
                    with contextlib.suppress(Exception):
                        self._cluster.close()
                self._dask = self._given
                self._cluster = None

    ClusterTaskRunner.__module__ = __name__
    ClusterTaskRunner.__qualname__ = "ClusterTaskRunner"
    _RUNNER_CLASS = ClusterTaskRunner
    return ClusterTaskRunner


def task_runner(dask_address: str | None = None, n_workers: int = 2, processes: bool = True,
                client=None, store_url: str | None = None,
                cluster_spec: str | None = None):  # fmt: skip
    """The flows' task runner: Prefect tasks on threads of the flow's process, heavy work on
    the Dask cluster at ``dask_address`` (or ``client``'s, or the one the callable
    ``cluster_spec`` makes), or on an embedded LocalCluster."""
    return _runner_class()(dask_address, n_workers, processes, client, store_url, cluster_spec)


def start_cluster_early() -> None:
    """Start the flow run's Dask client (an embedded cluster: its two worker processes, about
    1 s) in a thread, so that it overlaps the flow's own work before its first Dask job (a
    drain's erasing of rows, an ingest's planning and width estimate). Nothing for a flow run
    whose cluster is up, or that runs outside a flow run."""
    runner = _flow_task_runner()
    if runner is not None:
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
    ``FAIRPIPE_DASK_ADDRESS``, or on the cluster the callable ``FAIRPIPE_DASK_CLUSTER`` names
    makes, else a LocalCluster started inside the flow run."""
    return task_runner(os.environ.get("FAIRPIPE_DASK_ADDRESS") or None,
                       cluster_spec=os.environ.get("FAIRPIPE_DASK_CLUSTER") or None)  # fmt: skip


def run_flow(flow, *args, dask_address: str | None = None, n_workers: int = 2,
             processes: bool = True, warm_kernels: bool = False,
             dask_cluster: str | None = None, **kwargs):  # fmt: skip
    """Run ``flow(*args, **kwargs)`` with one Prefect API, its Prefect tasks in this process and
    its heavy work on Dask: the cluster at ``dask_address`` (reached, and its workers checked
    against the store the flow's ``store_url`` names, before Prefect starts:
    :func:`connect`), on the cluster the callable ``dask_cluster`` makes
    (:func:`connect_cluster`), or an embedded LocalCluster of ``n_workers`` (processes or threads),
    started at the flow's first Dask job. (Starting it while the Prefect server starts was
    measured: on 2 cores the two compete, and a command took as long.) ``warm_kernels``: see
    :func:`prefect_api`.

    Prefect records no person's ids: the arguments the flow declares private are given to it
    concealed, and its error is recorded as a reference (:mod:`flows.private`); the error itself
    is raised here."""
    if dask_address and dask_cluster:
        raise FairpipeInputError(BOTH_CLUSTERS)
    store_url = _store_url(flow, args, kwargs)
    args, kwargs = _concealed(flow, args, kwargs)
    client, made = None, None
    if dask_address:
        client = connect(dask_address, store_url)
    elif dask_cluster:
        client, made = connect_cluster(dask_cluster, store_url)
    token = CALLER_REPORTS.set(True)
    try:
        with prefect_api(warm_kernels), no_exit_heartbeat_wait():
            runner = task_runner(dask_address, n_workers=n_workers, processes=processes,
                                 client=client, store_url=store_url)  # fmt: skip
            return flow.with_options(task_runner=runner)(*args, **kwargs)
    except RedactedError as redacted:
        original = redacted.original  # Prefect recorded a reference; the caller gets the error
        if original is None:
            raise
    finally:
        CALLER_REPORTS.reset(token)
        if client is not None:
            close_client(client, made)
    raise original


def _run_store_url() -> str | None:
    """The ``store_url`` parameter of the flow run in this process (a deployment's run, whose
    cluster is checked against its store as a command's is), or None."""
    from prefect.context import FlowRunContext

    url = (getattr(FlowRunContext.get(), "parameters", None) or {}).get("store_url")
    return url if isinstance(url, str) else None


def _store_url(flow, args: tuple, kwargs: dict) -> str | None:
    import inspect

    bound = inspect.signature(flow.fn).bind_partial(*args, **kwargs)
    url = bound.arguments.get("store_url")
    return str(url) if url is not None else None


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
    started (it starts at the first Dask job), and outside a flow run."""
    runner = _flow_task_runner()
    return bool(runner is not None and runner.cluster_running)


@contextlib.contextmanager
def dask_client():
    """The Dask client of the flow run in this process (its Prefect tasks run here, on threads:
    docs/architecture.md), which starts an embedded cluster on first use. Outside a flow run
    (a task's function called by itself): the default client if there is one, else one of its
    own on an embedded cluster, for the call."""
    runner = _flow_task_runner()
    if runner is not None:
        yield runner.dask_client
        return
    from distributed import default_client

    try:
        client = default_client()
    except ValueError:  # no default client
        client = None
    if client is not None:
        yield client
        return
    client, cluster = open_client(os.environ.get("FAIRPIPE_DASK_ADDRESS") or None,
                                  cluster_spec=os.environ.get("FAIRPIPE_DASK_CLUSTER") or None)  # fmt: skip
    try:
        yield client
    finally:
        close_client(client, cluster)


def _flow_task_runner():
    """The task runner of the flow run in this process, if it is fairpipe's."""
    from prefect.context import FlowRunContext

    runner = getattr(FlowRunContext.get(), "task_runner", None)
    return runner if hasattr(runner, "dask_client") else None


def on_cluster(fn, *args):
    """``fn(*args)``, a plain function with explicit inputs, run as one job on the flow run's
    Dask cluster (from a Prefect task: the task run is recorded here, the work done there)."""
    with dask_client() as client:
        return gather(client, [client.submit(fn, *args, pure=False)])[0]


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
