"""The Dask cluster a flow's work runs on: a scheduler address checked before anything is tried,
the scheduler probed and its workers checked (fairpipe's version, the store's folder or endpoint
within their reach), a cluster the user's own callable makes (``--dask-cluster module:name``), an
embedded LocalCluster's settings, and the client opened and closed. Each problem is a one-line
:class:`~fairpipe.errors.FairpipeInputError`.

The one module that reaches into distributed's internals (``distributed.comm.addressing``,
``distributed.core.rpc``): an address is parsed as Dask parses it, and the scheduler is asked
for its identity over a bare connection rather than through a Client, so that a refused
connection is reported at once (a Client retries it until its time-out) and a server that is not
a Dask scheduler is named as such (rather than a Client's errors reading what it sends). A
distributed upgrade that moves them changes this module only.
"""

from __future__ import annotations

import contextlib
import os

from fairpipe.errors import FairpipeInputError
from fairpipe.flows import DEFAULT_ENV  # noqa: F401  (applied on import of the package)

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
    from fairpipe.storage.urls import parse_store_url

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
    from fairpipe.storage.urls import s3_endpoint

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


# -- an embedded LocalCluster, and the client of the flow run's cluster -------------------------
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
