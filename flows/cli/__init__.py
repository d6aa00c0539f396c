"""The ``fairpipe`` command line: one module per command, one exception handler for all of them
(:mod:`flows.cli._runner`), options shared by several commands defined once
(:mod:`flows.cli._options`).

Results go to stdout (``--json``: one object), diagnostics and progress to stderr. Exit codes: 0
done, 1 a bug (the traceback is written to a file), 2 bad input, 3 the store is busy, 4 a chunk
of the store is damaged (it fails its checksum: ``fairpipe verify`` lists them all), 130
interrupted.
"""

import contextlib
import os
import sys

from flows import DEFAULT_ENV  # environment defaults, before Prefect is imported

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
}
_LOUD: dict[str, str | None] = {}  # the variables as they were, for --verbose
for _name, _value in QUIET_ENV.items():
    _given = os.environ.get(_name)
    if _given in (None, DEFAULT_ENV.get(_name)) or _name == "RUST_BACKTRACE":
        _LOUD[_name] = _given
        os.environ[_name] = _value
if "DASK_LOGGING" in _LOUD and "DASK_LOGGING__DISTRIBUTED" in os.environ:  # within DASK_LOGGING
    _LOUD["DASK_LOGGING__DISTRIBUTED"] = os.environ.pop("DASK_LOGGING__DISTRIBUTED")


def loud_libraries() -> None:
    """Show the libraries' logs, warnings and tracebacks again (``--verbose``): the environment,
    warning filters and root log level as they were before the command line quieted them, for a
    command that has not imported the libraries yet."""
    import logging
    import warnings

    for name, value in _LOUD.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if _SAVED_WARNING_FILTERS:
        warnings.filters[:] = _SAVED_WARNING_FILTERS  # type: ignore[index]
    logging.getLogger().setLevel(logging.WARNING)


_SAVED_WARNING_FILTERS: list = []


import typer  # noqa: E402
import typer.core  # noqa: E402

from flows.cli import (  # noqa: E402
    audit,
    backfill,
    demo,
    fit,
    forget,
    history,
    info,
    ingest,
    predict,
    requests,
    rerank,
    sample,
    server,
    show,
    summarize,
    verify,
)

__all__ = ["app", "main"]

# The commands as a user meets them: try, load, look, query, model, summarize, rank, audit,
# forget, look after the store. A command not listed comes last.
WORKFLOW_ORDER = ("demo", "ingest", "info", "show", "sample", "fit", "predict", "summarize",
                  "history", "rerank", "audit", "request-deletion", "forget", "backfill",
                  "status", "receipts", "configure", "verify", "server")  # fmt: skip


class _WorkflowOrder(typer.core.TyperGroup):
    """The program's commands listed in :data:`WORKFLOW_ORDER` (``fairpipe --help``)."""

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(WORKFLOW_ORDER)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))


app = typer.Typer(
    cls=_WorkflowOrder,
    # Help text is plain text, never read as markup: '[lower, upper]' is shown as written.
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},  # a wide terminal wraps fewer option texts
    add_completion=False,
    no_args_is_help=True,
    help="Fair and forgettable pipelines for large tables of people.",
)


def _print_version(value: bool) -> None:
    if value:
        import importlib.metadata

        print(f"fairpipe {importlib.metadata.version('fairpipe')}")
        raise typer.Exit()


@app.callback()
def _program(
    version: bool = typer.Option(
        False,
        "--version",
        help="Print fairpipe's version and exit.",
        callback=_print_version,
        is_eager=True,
    ),  # fmt: skip
) -> None:
    """Fair and forgettable pipelines for large tables of people."""


for _command in (
    ingest.ingest,
    show.show,
    sample.sample,
    fit.fit,
    rerank.rerank,
    audit.audit,
    forget.forget,
    requests.request_deletion,
    requests.receipts,
    requests.status,
    requests.configure,
    backfill.backfill,
    summarize.summarize,
    predict.predict,
    info.info,
    history.history,
    verify.verify,
    demo.demo,
):
    app.command()(_command)
app.add_typer(server.app, name="server")


def main() -> None:
    """The ``fairpipe`` program (its console script and ``python -m flows.cli``)."""
    import logging
    import signal
    import threading
    import warnings

    from flows.cli._runner import PROGRAM

    PROGRAM.running = True
    # A SIGTERM (a scheduler stopping the job, ``kill``) unwinds the command as a Ctrl-C does
    # (both noted, so that an interrupt a library wraps in an error of its own is still one):
    # a transaction in progress is dropped with what it wrote, a store being created is
    # removed, the local cluster and Prefect server are stopped; then exit 130.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    sys.unraisablehook = _unraisable
    # A Ctrl-C reaches every process of the terminal's process group: the local cluster's worker
    # processes too, which printed tracebacks of their own while the command stopped them. Every
    # thread but the main one blocks SIGINT, and so do the processes they start (a blocked
    # signal stays blocked across exec): only the command sees a Ctrl-C, and it stops them.
    threading.settrace(_block_sigint_in_thread)
    # Python's warnings and logs too (Icechunk's, Dask's, a library logging before Prefect sets
    # up logging), here and in the processes the command starts: by the program only, so that
    # tests running commands keep their own warning filters.
    if "PYTHONWARNINGS" not in os.environ and not sys.warnoptions:
        _LOUD["PYTHONWARNINGS"] = None
        _SAVED_WARNING_FILTERS[:] = warnings.filters
        os.environ["PYTHONWARNINGS"] = "ignore"
        warnings.simplefilter("ignore")
    logging.getLogger().setLevel(logging.CRITICAL)
    try:
        app(prog_name="fairpipe")
    except SystemExit as end:
        if PROGRAM.interrupted or end.code == 130:
            _end_interrupted()
        raise


def _end_interrupted() -> None:
    """Exit 130 at once, the command's own clean-up done (its transaction dropped, its cluster
    and server asked to stop): any process it started that still runs (a Dask worker caught
    starting when the interrupt came) is terminated, then the program ends without the
    interpreter's exit handlers, which would retry closing such a cluster and print its
    errors (distributed's ``close_clusters``)."""
    import psutil  # distributed's dependency

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, left = psutil.wait_procs(children, timeout=3)
    for child in left:
        with contextlib.suppress(psutil.Error):
            child.kill()
    os._exit(130)


def _block_sigint_in_thread(frame, event, arg) -> None:
    """Run once at the start of every thread (threading.settrace), then removed: block SIGINT."""
    import signal

    sys.settrace(None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _unraisable(info) -> None:
    """An interrupt raised inside a callback from C (numba's compiler cache, a finalizer) cannot
    propagate there: instead of Python printing it, it is raised again in the main thread at
    its next step (so the command still stops). Anything else: Python's own report."""
    if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
        import _thread
        import threading

        # Tripped from another thread, a moment later: tripped here, the handler would raise
        # at once, inside this hook, whose exception Python only prints.
        timer = threading.Timer(0.05, _thread.interrupt_main)
        timer.daemon = True
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C now: the timer's trips
            timer.start()
        return
    sys.__unraisablehook__(info)


def _interrupt(signum, frame) -> None:
    from flows.cli._runner import PROGRAM

    PROGRAM.interrupted = True
    raise KeyboardInterrupt
