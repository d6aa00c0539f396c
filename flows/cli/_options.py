"""Options that several commands share, each defined once (``store: Store``), and the reading of
their values. A command gives the default in its own signature (``seed: Seed = 0``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fairpipe.errors import (
    FairpipeInputError,
    check_fraction,
    check_int_range,
    check_non_negative_float,
    check_non_negative_int,
    check_positive_float,
    check_positive_int,
    check_seed,
)
from fairpipe.validation import load_npy

Store = Annotated[
    str,
    typer.Option(
        "--store", help="The store: a folder, or an s3://, gs:// or az:// URL.", show_default=False
    ),
]
AsJson = Annotated[
    bool,
    typer.Option(
        "--json", help="Print the result as one JSON object on stdout.", show_default="off"
    ),
]
Seed = Annotated[int, typer.Option("--seed", help="Random seed: the same seed, the same result.")]
DaskAddress = Annotated[
    str | None,
    typer.Option(
        "--dask-address",
        help="The address of a running Dask scheduler to use.",
        show_default="a local cluster of --workers processes",
    ),
]
DaskCluster = Annotated[
    str | None,
    typer.Option(
        "--dask-cluster",
        help="A Python callable, as module:name, that returns a Dask cluster or client (Coiled, "
        "dask-jobqueue, dask-kubernetes; see deploy/README.md). Excludes --dask-address.",
        show_default="none: --dask-address or a local cluster",
    ),
]
Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose",
        help="Also show the logs and warnings of Prefect, Dask and Icechunk, and an internal "
        "error's traceback, on stderr.",
        show_default="off",
    ),
]
Workers = Annotated[int, typer.Option("--workers", help="Worker processes of the local cluster.")]
LockTimeout = Annotated[
    float,
    typer.Option(
        "--lock-timeout", help="Seconds to wait for another writer of the store (inf: no limit)."
    ),
]
Ids = Annotated[
    str | None,
    typer.Option(
        "--ids", help="Comma-separated ids (--ids or --ids-file, not both).", show_default="none"
    ),
]
IdsFile = Annotated[
    str | None,
    typer.Option(
        "--ids-file",
        help="A .npy, or text with one id per line (--ids or --ids-file, not both).",
        show_default="none",
    ),
]
QueryId = Annotated[
    int | None,
    typer.Option(
        "--query-id",
        help="Id of a stored point (one --query-* option only).",
        show_default="none",
    ),
]
QueryRow = Annotated[
    int | None,
    typer.Option(
        "--query-row",
        help="Row number of a stored point (one --query-* option only).",
        show_default="none",
    ),
]
QueryFile = Annotated[
    Path | None,
    typer.Option(
        "--query-file",
        help="A .npy of query points, one per row (one --query-* option only).",
        show_default="none",
    ),
]


def choice(*values: str) -> dict:
    """The keywords of a ``typer.Option`` taking one of ``values``: the help lists them. The
    library checks the value (its one-line error names the parameter and the choices, before
    anything starts), not click, whose usage error would take several lines."""
    return {"metavar": "[" + "|".join(values) + "]"}


MISSING_QUERY_FILE = "Query file {path!r} does not exist."
BAD_QUERY_FILE = "Query file {path!r} is not a .npy array (save the queries with numpy.save)."


def read_query_file(path: Path | None):
    """The points of a ``--query-file``, or None without one."""
    if path is None:
        return None
    if not path.exists():
        raise FairpipeInputError(MISSING_QUERY_FILE.format(path=str(path)))
    return load_npy(path, BAD_QUERY_FILE.format(path=str(path)))


# -- checks of option values, made before a command starts anything ------------------------------
# Each worker of the local cluster is a Python process of a few hundred MB.
MAX_WORKERS = 64
EMPTY_STORE = "The --store option of {owner} must name a folder or a URL. Got an empty string."


def owner_of(command: str) -> str:
    """How messages name a command: ``fairpipe request-deletion``."""
    return "fairpipe " + command.replace("_", "-")


def check_store(store: str, owner: str) -> str:
    """A store given: not an empty string (which would be the current folder)."""
    if not str(store).strip():
        raise FairpipeInputError(EMPTY_STORE.format(owner=owner))
    return store


def check_workers(workers: int, owner: str) -> int:
    return check_int_range(workers, "--workers", owner, 1, MAX_WORKERS)


def check_lock_timeout(seconds: float, owner: str) -> float:
    return check_non_negative_float(seconds, "--lock-timeout", owner, allow_inf=True)


def check_options(owner: str, **rules: tuple) -> None:
    """Check option values by rule, named by their flag: ``check_options("fairpipe fit",
    fanout=("fanout", 8))`` checks ``--fanout``. Rules: ``"positive"`` (an integer >= 1),
    ``"count"`` (an integer >= 0), ``"fanout"`` (an integer >= 2), ``"positive_float"``
    (finite, > 0), ``"non_negative_float"`` (finite, >= 0), ``"fraction"`` (from 0 to 1),
    ``"seed"``; a value of None (an option not given) is not checked."""
    checks = {
        "positive": lambda v, flag: check_positive_int(v, flag, owner),
        "count": lambda v, flag: check_non_negative_int(v, flag, owner),
        "fanout": lambda v, flag: check_int_range(v, flag, owner, 2),
        "positive_float": lambda v, flag: check_positive_float(v, flag, owner),
        "non_negative_float": lambda v, flag: check_non_negative_float(v, flag, owner),
        "fraction": lambda v, flag: check_fraction(v, flag, owner),
        "seed": lambda v, flag: check_seed(v, flag, owner),
    }
    for name, (rule, value) in rules.items():
        if value is not None:
            checks[rule](value, "--" + name.replace("_", "-"))


def check_ids_given(ids: str | None, ids_file: str | None, one_source: str, required: bool) -> None:
    """The ids of ``--ids`` or ``--ids-file``, read and checked (``one_source``: the error for
    both, or for neither where ``required``). The command reads them again: a list of people to
    forget is small, and its errors then come before anything starts."""
    from fairpipe.datasets import read_ids

    given = (ids is not None) + (ids_file is not None)
    if given > 1 or (required and given == 0):
        raise FairpipeInputError(one_source)
    if given:
        read_ids(text=ids, path=ids_file)
