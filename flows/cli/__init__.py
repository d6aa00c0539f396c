"""The ``fairpipe`` command line: one module per command, one exception handler for all of them
(:mod:`flows.cli._runner`), options shared by several commands defined once
(:mod:`flows.cli._options`).

Results go to stdout (``--json``: one object), diagnostics and progress to stderr. Exit codes: 0
done, 1 a bug (the traceback is written to a file), 2 bad input, 3 the store is busy, 4 a chunk
of the store is damaged (it fails its checksum: ``fairpipe verify`` lists them all), 130
interrupted.
"""

import os

from flows import DEFAULT_ENV  # environment defaults, before Prefect is imported

# The command line reports a failed flow itself, in one line; Prefect's own error log (a traceback
# of the engine) would bury it. Set PREFECT_LOGGING_LEVEL=ERROR to see Prefect's logs again.
if os.environ.get("PREFECT_LOGGING_LEVEL") in (None, DEFAULT_ENV["PREFECT_LOGGING_LEVEL"]):
    os.environ["PREFECT_LOGGING_LEVEL"] = "CRITICAL"

import typer  # noqa: E402

from flows.cli import (  # noqa: E402
    audit,
    backfill,
    demo,
    fit,
    forget,
    info,
    ingest,
    predict,
    requests,
    rerank,
    sample,
    summarize,
    verify,
)

__all__ = ["app", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Fair and forgettable pipelines for large tables of people.",
)
for _command in (
    ingest.ingest,
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
    verify.verify,
    demo.demo,
):
    app.command()(_command)


def main() -> None:
    """The ``fairpipe`` program (its console script and ``python -m flows.cli``)."""
    import signal

    from flows.cli._runner import PROGRAM

    PROGRAM.running = True
    # A SIGTERM (a scheduler stopping the job, ``kill``) unwinds the command as a Ctrl-C does:
    # a transaction in progress is dropped with what it wrote, a store being created is
    # removed, the local cluster and Prefect server are stopped; then exit 130.
    signal.signal(signal.SIGTERM, _interrupt)
    app(prog_name="fairpipe")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
