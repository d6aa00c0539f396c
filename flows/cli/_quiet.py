"""The libraries quieted for a command (set on import, before Prefect or Dask is imported), and
shown again for ``--verbose``."""

import os
import sys

from fairpipe.flows import DEFAULT_ENV  # environment defaults, before Prefect is imported

# A command's stderr is its own: its progress, and one line per error. The libraries' logs,
# warnings and tracebacks would bury them: Prefect's engine (a failed flow's traceback) and its
# services ("EventsWorker - Still processing items"), Dask's workers ("Compute Failed") and comms
# (CommClosedError at shutdown), a Rust panic's backtrace (RUST_BACKTRACE). Set for this process
# and the ones it starts (Prefect's server, Dask's workers) before Prefect or Dask is imported,
# unless the user set the variable; ``--verbose`` (:func:`loud_libraries`) shows them again.
QUIET_DASK_LOGGERS = ("distributed", "distributed.client", "distributed.gc", "tornado",
                      "tornado.application", "asyncio")  # fmt: skip
QUIET_ENV = {
    "PREFECT_LOGGING_LEVEL": "CRITICAL",
    "PREFECT_LOGGING_ROOT_LEVEL": "CRITICAL",  # other libraries' loggers, through Prefect's root
    "DASK_LOGGING": repr({name: "critical" for name in QUIET_DASK_LOGGERS}),
    "RUST_BACKTRACE": "0",  # a panic's 200 lines of backtrace (often set for Rust development)
    "ICECHUNK_LOG": "off",  # Icechunk logs to stdout, which holds the command's result
}
LOUD: dict[str, str | None] = {}  # the variables as they were, for --verbose
for _name, _value in QUIET_ENV.items():
    _given = os.environ.get(_name)
    if _given in (None, DEFAULT_ENV.get(_name)) or _name == "RUST_BACKTRACE":
        LOUD[_name] = _given
        os.environ[_name] = _value
if "DASK_LOGGING" in LOUD and "DASK_LOGGING__DISTRIBUTED" in os.environ:  # within DASK_LOGGING
    LOUD["DASK_LOGGING__DISTRIBUTED"] = os.environ.pop("DASK_LOGGING__DISTRIBUTED")


def loud_libraries() -> None:
    """Show the libraries' logs, warnings and tracebacks again (``--verbose``): the environment,
    warning filters and root log level as they were before the command line quieted them, for a
    command that has not imported the libraries yet."""
    import logging
    import warnings

    for name, value in LOUD.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if SAVED_WARNING_FILTERS:
        warnings.filters[:] = SAVED_WARNING_FILTERS  # type: ignore[index]
    logging.getLogger().setLevel(logging.WARNING)


SAVED_WARNING_FILTERS: list = []


def quiet_warnings() -> None:
    """Python's warnings ignored here and in the processes the command starts (the program
    only, so that tests running commands keep their own warning filters), unless the user asked
    for them."""
    import warnings

    if "PYTHONWARNINGS" not in os.environ and not sys.warnoptions:
        LOUD["PYTHONWARNINGS"] = None
        SAVED_WARNING_FILTERS[:] = warnings.filters
        os.environ["PYTHONWARNINGS"] = "ignore"
        warnings.simplefilter("ignore")
