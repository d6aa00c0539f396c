"""Dask work sent from inside a Prefect task: the flow run's Dask client, one job
(:func:`on_cluster`), a map over the cluster (:func:`dask_map`), and the gathering of results
that lets running jobs end before an error goes on (:func:`gather`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from fairpipe.flows.cluster import close_client, open_client
from fairpipe.flows.task_runner import _flow_task_runner


def cluster_running() -> bool:
    """Whether the flow run's Dask cluster costs nothing more to use: an external one (an
    address), or an embedded one already started. False for an embedded LocalCluster not yet
    started (it starts at the first Dask job), and outside a flow run."""
    runner = _flow_task_runner()
    return bool(runner is not None and runner.cluster_running)


@contextlib.contextmanager
def dask_client():
    """The Dask client of the flow run in this process (its Prefect tasks run here, on threads:
    docs/design/flows.md), which starts an embedded cluster on first use. Outside a flow run
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
