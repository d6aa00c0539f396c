"""The Prefect API a command's flow talks to, and the settings its flow runs with.

Only the flow's own process talks to Prefect. With no ``PREFECT_API_URL``, :func:`prefect_api`
starts one local server for this process (meanwhile importing what a flow imports) and delivers
the last logs before stopping it; :func:`no_exit_heartbeat_wait` runs a command's flow without
Prefect's flow-run heartbeats.
"""

from __future__ import annotations

import contextlib
import os

from fairpipe.flows import DEFAULT_ENV  # noqa: F401  (applied on import of the package)
from fairpipe.flows.prefect_server import LocalServer, adopt_early, deliver_records


@contextlib.contextmanager
def prefect_api(warm_kernels: bool = False):
    """Use ``PREFECT_API_URL`` if set; otherwise run one local server for this process tree
    (the one a command line launched early, :func:`fairpipe.flows.prefect_server.launch_early`, if any), and
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
