"""Prefect flows over Dask, and the ``fairpipe`` command line."""

import os

# Set before Prefect or Dask is imported anywhere below this package.
DEFAULT_ENV = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_LOG_PRINTS": "false",
    "DASK_LOGGING__DISTRIBUTED": "error",
    "DASK_DISTRIBUTED__WORKER__DAEMON": "false",
    "ICECHUNK_LOG": "error",
    "OMP_NUM_THREADS": "1",
}
for _k, _v in DEFAULT_ENV.items():
    if _k.startswith("DASK_LOGGING__") and "DASK_LOGGING" in os.environ:
        continue  # the whole of Dask's logging is set (the command line's, fairpipe.flows.cli)
    os.environ.setdefault(_k, _v)
