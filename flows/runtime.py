"""Start-up of the embedded runtime: one Prefect API server and a Dask task runner.

With no ``PREFECT_API_URL``, every Dask worker *process* would start its own ephemeral Prefect
server (see ../shared/STACK.md). So we start one server here, point this process and the worker
processes (through the environment, before the cluster starts) at it, and flush logs before
stopping it.
"""

from __future__ import annotations

import contextlib
import os

from flows import DEFAULT_ENV  # noqa: F401  (applied on import of the package)


@contextlib.contextmanager
def prefect_api():
    """Use ``PREFECT_API_URL`` if set; otherwise run one local server for this process tree."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    import prefect.settings
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    prior = SubprocessASGIServer._instances.get(None)
    SubprocessASGIServer._instances[None] = server
    server.start(timeout=int(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]))
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
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
        if prior is not None:
            SubprocessASGIServer._instances[None] = prior
        else:
            SubprocessASGIServer._instances.pop(None, None)


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


def task_runner(dask_address: str | None = None, n_workers: int = 2, processes: bool = True):
    """A DaskTaskRunner on an existing scheduler, or on an embedded LocalCluster."""
    from prefect_dask import DaskTaskRunner

    if dask_address:
        return DaskTaskRunner(address=dask_address)
    keep_malloc_defaults()
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs=local_cluster_kwargs(n_workers, processes),
    )


def local_cluster_kwargs(n_workers: int = 2, processes: bool = True) -> dict:
    """Settings of the embedded LocalCluster: one thread per worker, no dashboard."""
    return {
        "n_workers": n_workers,
        "threads_per_worker": 1,
        "processes": processes,
        "dashboard_address": None,
    }
