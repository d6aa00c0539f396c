"""Fixtures of the command-line tests: one Dask cluster the commands share (``--dask-address``),
so that each command does not start its own."""

import pytest


@pytest.fixture(scope="session")
def dask_address(prefect_server):
    """A one-worker LocalCluster, started after the Prefect server so the worker finds its API."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        yield cluster.scheduler_address
