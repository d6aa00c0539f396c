"""The flows' task runner and the one way a command runs a flow.

:func:`task_runner` is Prefect's thread-pool task runner holding the flow run's Dask client:
Prefect tasks run on threads of the flow's process (the only one that talks to the Prefect API)
and send their heavy work to Dask as plain functions with explicit inputs (no Dask worker needs
the Prefect API, which a real cluster's workers cannot reach). :func:`run_flow` runs a flow with
one Prefect API, its cluster checked first, and what Prefect must not record concealed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cluster import (
    BOTH_CLUSTERS,
    close_client,
    connect,
    connect_cluster,
    open_client,
)
from fairpipe.flows.prefect_api import no_exit_heartbeat_wait, prefect_api
from fairpipe.flows.private import CALLER_REPORTS, RedactedError, conceal

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
    (:func:`~fairpipe.flows.dask_map.dask_client`, :func:`~fairpipe.flows.dask_map.on_cluster`), which no worker
    needs Prefect for.

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
    :func:`~fairpipe.flows.cluster.connect`), on the cluster the callable ``dask_cluster`` makes
    (:func:`~fairpipe.flows.cluster.connect_cluster`), or an embedded LocalCluster of ``n_workers`` (processes or threads),
    started at the flow's first Dask job. (Starting it while the Prefect server starts was
    measured: on 2 cores the two compete, and a command took as long.) ``warm_kernels``: see
    :func:`~fairpipe.flows.prefect_api.prefect_api`.

    Prefect records no person's ids: the arguments the flow declares private are given to it
    concealed, and its error is recorded as a reference (:mod:`fairpipe.flows.private`); the error itself
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
    :class:`~fairpipe.flows.private.Private`: the parameters it declares private, and the private fields
    of options dataclasses (:mod:`fairpipe.flows.private`)."""
    import inspect

    private = getattr(flow.fn, "private_parameters", ())
    bound = inspect.signature(flow.fn).bind_partial(*args, **kwargs)
    for name, value in bound.arguments.items():
        if name in private or dataclasses.is_dataclass(value):
            bound.arguments[name] = conceal(value)
    return bound.args, bound.kwargs


def _flow_task_runner():
    """The task runner of the flow run in this process, if it is fairpipe's."""
    from prefect.context import FlowRunContext

    runner = getattr(FlowRunContext.get(), "task_runner", None)
    return runner if hasattr(runner, "dask_client") else None
