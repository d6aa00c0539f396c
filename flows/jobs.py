"""The Dask jobs the flows map from inside their tasks: plain functions (no Prefect overhead per
chunk) in a module that imports neither Prefect nor a flow.

A job is pickled by reference, so a worker imports the module that defines it before running
it. A worker that runs only jobs (while the other runs the Prefect task mapping them) then never
loads Prefect and the flows: importing this module takes about 0.12 s, ``fairpipe.flows.ingest`` about
1.3 s, which a worker importing the flows would sit idle at the start of a 1M-row ingest.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fairpipe.datasets import SourcePlan, is_url, read_source_rows
from fairpipe.errors import FairpipeInputError
from fairpipe.neighbors import E2LSH
from fairpipe.storage.rows import write_points
from fairpipe.storage.segments import index_tables, remove_from_tables
from fairpipe.storage.staging import Staging


def ingest_chunk(fork, plan: SourcePlan, lsh: E2LSH, a: int, b: int, base: int,
                 staging: Staging, sketch: list[str], threads: int = 1):  # fmt: skip
    """Rows [a, b) of the source (``plan``: their share of it) read, written at ``base + a``
    (with the sketch arrays ``sketch`` names) and hashed; their keys staged for the index jobs.
    ``threads`` > 1 (the flow's own append, both cores its own): the rows are written on a
    thread of their own while that many hash them."""
    t0 = time.perf_counter()
    try:
        X = read_source_rows(plan, a, b)
    except FairpipeInputError as bad:
        # Returned, not raised: a worker logs a job's error with its traceback on the user's
        # terminal (distributed's "Compute Failed"); the flow raises it (raise_bad_input).
        return None, BadInput(bad)
    except OSError as why:  # a URL the client read but this worker cannot (network, rights)
        if not is_url(plan.path or ""):
            raise
        first = (str(why).strip().splitlines() or [type(why).__name__])[0]
        message = UNREADABLE_HERE.format(url=plan.path, worker=worker_name(), why=first)
        return None, BadInput(FairpipeInputError(message))
    if threads > 1:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairpipe-write") as io:
            written = io.submit(write_points, fork, base + a, X, sketch)
            staging.write(base + a, lsh.hash_validated(X, by_table=True, threads=threads))
            written.result()
    else:
        write_points(fork, base + a, X, sketch)
        staging.write(base + a, lsh.hash_validated(X, by_table=True))
    return fork, {"rows": b - a, "seconds": time.perf_counter() - t0}


UNREADABLE_HERE = (
    "Source {url} cannot be read on the worker {worker} ({why}); the workers read a URL "
    "source themselves, with the credentials in their own environment."
)


def worker_name() -> str:
    """The address of the Dask worker running this (or "of this process")."""
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return "of this process"


class BadInput:
    """A job's bad-input error, returned to the flow rather than raised on the worker."""

    def __init__(self, error: FairpipeInputError):
        self.message = str(error)


def raise_bad_input(results: list) -> None:
    """Raise the bad-input error of the first job (in row order) that returned one."""
    for _, outcome in results:
        if isinstance(outcome, BadInput):
            raise FairpipeInputError(outcome.message)


def index_job(fork, staging: Staging, t0: int, t1: int, bits: int, sources: tuple, target: str):
    """Tables [t0, t1) of index layer ``target`` built from the staged keys and the layers
    ``sources`` (:func:`index_tables`)."""
    return fork, index_tables(fork, staging, t0, t1, bits, sources, target)


def remove_job(fork, attrs: dict, rows: np.ndarray, keys: np.ndarray, t0: int, t1: int):
    """A deletion batch's rows removed from tables [t0, t1) (:func:`remove_from_tables`)."""
    return fork, remove_from_tables(fork, attrs, rows, keys, t0, t1)
