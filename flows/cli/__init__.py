"""The ``fairpipe`` command line: one module per command, one exception handler for all of them
(:mod:`fairpipe.flows.cli._runner`), options shared by several commands defined once
(:mod:`fairpipe.flows.cli._options`).

Results go to stdout (``--json``: one object), diagnostics and progress to stderr. Exit codes: 0
done, 1 a bug (the traceback is written to a file), 2 bad input, 3 the store is busy, 4 the
store is damaged (a chunk fails its checksum, a snapshot or manifest cannot be read or is not
what its commit recorded: ``fairpipe verify`` lists them all), 130
interrupted, 141 the reader of stdout is gone (``| head``).
"""

import contextlib
import os
import sys
from typing import Any

from fairpipe.flows.cli._quiet import (
    quiet_warnings,  # first: the libraries quieted before Prefect loads
)

# isort: split
import typer
import typer.core

from fairpipe.flows.cli import (
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


# The classes of click's errors, as typer (which carries its own click) raises them.
_CLICK_ERROR: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_USAGE_ERROR: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
USAGE_HINT = "see '{command} --help'"


class _WorkflowOrder(typer.core.TyperGroup):
    """The program's commands listed in :data:`WORKFLOW_ORDER` (``fairpipe --help``); a usage
    error (an unknown or missing option, a value of the wrong type) is one line, ``error: ...``,
    exit 2, as every bad input is."""

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(WORKFLOW_ORDER)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             windows_expand_args=True, **extra):  # fmt: skip
        call = dict(args=args, prog_name=prog_name, complete_var=complete_var,
                    windows_expand_args=windows_expand_args, **extra)  # fmt: skip
        if not standalone_mode:
            return super().main(standalone_mode=False, **call)
        try:
            code = super().main(standalone_mode=False, **call)
        except _CLICK_ERROR as error:
            if type(error).__name__ == "NoArgsIsHelpError":  # 'fairpipe' alone: its help
                error.show()
                sys.exit(error.exit_code)
            from fairpipe.flows.cli._options import OptionValueError
            from fairpipe.flows.cli._output import print_error

            message = error.format_message()
            context = getattr(error, "ctx", None)
            if (
                isinstance(error, _USAGE_ERROR)
                and context is not None
                and not isinstance(error, OptionValueError)
            ):
                message += f" ({USAGE_HINT.format(command=context.command_path)})"
            print_error(message)
            sys.exit(error.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


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
    """The ``fairpipe`` program (its console script and ``python -m fairpipe.flows.cli``)."""
    import logging
    import signal
    import threading

    from fairpipe.flows.cli._output import standard_streams
    from fairpipe.flows.cli._runner import PROGRAM

    standard_streams()
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
    quiet_warnings()
    logging.getLogger().setLevel(logging.CRITICAL)
    try:
        app(prog_name="fairpipe")
    except SystemExit as end:
        if PROGRAM.interrupted or end.code == 130:
            _end_interrupted()
        if end.code is None or isinstance(end.code, int):
            from fairpipe.flows.cli._runner import end_now

            end_now(end.code or 0)
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
    from fairpipe.flows.cli._runner import PROGRAM

    PROGRAM.interrupted = True
    raise KeyboardInterrupt
