"""Options that several commands share, each defined once (``store: Store``), and the reading of
their values. A command gives the default in its own signature (``seed: Seed = 0``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fairpipe.errors import FairpipeInputError
from fairpipe.validation import load_npy

Store = Annotated[
    str,
    typer.Option(
        "--store", help="The store: a folder, or an s3://, gs:// or az:// URL.", show_default=False
    ),
]
AsJson = Annotated[
    bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")
]
Seed = Annotated[int, typer.Option("--seed", help="Random seed: the same seed, the same result.")]
DaskAddress = Annotated[
    str | None,
    typer.Option(
        "--dask-address",
        help="An existing Dask scheduler (default: a local cluster).",
        show_default=False,
    ),
]
Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose",
        help="Also show the logs and warnings of Prefect, Dask and Icechunk, and an internal "
        "error's traceback, on stderr.",
    ),
]
Workers = Annotated[int, typer.Option("--workers", help="Worker processes of the local cluster.")]
LockTimeout = Annotated[
    float,
    typer.Option("--lock-timeout", help="Seconds to wait for another writer of the store."),
]
Ids = Annotated[str | None, typer.Option("--ids", help="Comma-separated ids.", show_default=False)]
IdsFile = Annotated[
    str | None,
    typer.Option("--ids-file", help="A .npy, or text with one id per line.", show_default=False),
]
QueryRow = Annotated[
    int | None,
    typer.Option("--query-row", help="Row number of a stored point.", show_default=False),
]
QueryFile = Annotated[
    Path | None,
    typer.Option("--query-file", help="A .npy of query points (one per row).", show_default=False),
]

MISSING_QUERY_FILE = "Query file {path!r} does not exist."
BAD_QUERY_FILE = "Query file {path!r} is not a .npy array (save the queries with numpy.save)."


def read_query_file(path: Path | None):
    """The points of a ``--query-file``, or None without one."""
    if path is None:
        return None
    if not path.exists():
        raise FairpipeInputError(MISSING_QUERY_FILE.format(path=str(path)))
    return load_npy(path, BAD_QUERY_FILE.format(path=str(path)))
