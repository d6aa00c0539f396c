"""What every command shares: where its output goes, and the one exception handler.

Results go to stdout (``--json``: one object), diagnostics and errors to stderr. The exit code
says what went wrong:

- 2: bad input (:class:`~fairpipe.errors.FairpipeInputError`), one line ``error: <message>``;
  typer's own usage errors exit 2 as well;
- 3: the store is busy (:class:`~storage.lock.StoreBusyError`), one line ``error: <message>``;
- 130: interrupted;
- 1: anything else, which is a bug: one line naming the exception, and a second naming the file
  holding the traceback (``FAIRPIPE_DEBUG=1``: the traceback itself, on stderr).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import json
import os
import platform
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import typer
from rich.console import Console
from rich.text import Text

from fairpipe.errors import FairpipeInputError
from flows._server import launch_early, stop_early
from flows.cli._options import (
    AsJson,
    DaskAddress,
    LockTimeout,
    Workers,
    check_lock_timeout,
    check_store,
    check_workers,
    owner_of,
)

BAD_INPUT, BUG, STORE_BUSY, INTERRUPTED = 2, 1, 3, 130
DEBUG_VARIABLE = "FAIRPIPE_DEBUG"
# The versions a bug report names, besides Python's.
REPORTED_PACKAGES = ("fairpipe", "numpy", "dask", "distributed", "prefect", "zarr", "icechunk")

F = TypeVar("F", bound=Callable[..., Any])


# -- output ----------------------------------------------------------------------------------------
def result_console() -> Console:
    """A console on stdout for a command's human-readable result."""
    return Console(soft_wrap=True)


def diagnostics_console() -> Console:
    """A console on stderr for progress and errors (soft wrap: an error stays on one line for grep
    and logs)."""
    return Console(stderr=True, soft_wrap=True)


def emit(result: dict, as_json: bool, render: Callable[[dict], None]) -> None:
    """The result on stdout: one JSON object, or ``render``'s text for people."""
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        render(result)


@dataclass
class _Program:
    """Whether the command runs as the ``fairpipe`` program (:func:`flows.cli.main`) rather than
    called in a process that goes on (a test's CLI runner)."""

    running: bool = False


PROGRAM = _Program()


def quick_exit() -> None:
    """End the program now, with exit code 0, once stdout and stderr are flushed: without the
    interpreter's teardown of every module and thread, which a query that has written nothing
    does not need (0.08-0.12 s of a cold ``fairpipe sample`` of 0.8 s, measured at 1M rows)."""
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)


# -- the options every command of a kind shares --------------------------------------------------
@dataclass(frozen=True)
class Shared:
    """The options a command shares with others of its kind: where its flows run, how long it
    waits for another writer, and whether it answers in JSON."""

    as_json: bool = False
    dask_address: str | None = None
    workers: int = 2
    lock_timeout: float = 0.0

    @property
    def cluster(self) -> dict[str, Any]:
        """The keyword arguments of a ``run_*`` flow entry point that pick its Dask cluster."""
        return {"dask_address": self.dask_address, "n_workers": self.workers}


# Each shared option once: its annotation (flag and help) and its default.
SHARED_OPTIONS: dict[str, tuple[Any, Any]] = {
    "dask_address": (DaskAddress, None),
    "workers": (Workers, 2),
    "lock_timeout": (LockTimeout, 0.0),
    "as_json": (AsJson, False),
}
RUNS_FLOWS = ("dask_address", "workers", "as_json")
WRITES_STORES = ("dask_address", "workers", "lock_timeout", "as_json")


# -- errors ----------------------------------------------------------------------------------------
def command(parameter_flags: Mapping[str, str] | None = None, *,
            shared: tuple[str, ...] = ("as_json",),
            render: Callable[[dict], None] | None = None,
            read_only: bool = False,
            check: Callable[..., None] | None = None) -> Callable[[F], F]:  # fmt: skip
    """A command: run under the one exception handler (see the module's docstring), with the
    ``shared`` options added after its own and given to it as ``shared: Shared``; the dict it
    returns is printed as one JSON object (``--json``) or by ``render``.

    A ``read_only`` command (one that writes nothing and runs no flow) ends the ``fairpipe``
    program as soon as its result is out (:func:`quick_exit`).

    ``parameter_flags`` maps a library parameter that a bad-input message may name (``'fanout'``)
    to the flag of this command that sets it (``--tree-width``); the message then names the flag.

    ``check`` is called with the command's own options before anything starts (the early Prefect
    server, a cluster, a flow), as the shared options are checked (:func:`check_shared`).
    """
    flags = dict(parameter_flags or {})

    def decorate(fn: F) -> F:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.name != "shared"]  # fmt: skip
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                              default=default)
            for name, (annotation, default) in SHARED_OPTIONS.items() if name in shared
        ]  # fmt: skip

        @functools.wraps(fn)
        def run(**kwargs: Any) -> None:
            try:
                with errors_reported(fn.__name__, flags, dict(kwargs)):
                    options = Shared(**{name: kwargs.pop(name) for name in shared})
                    check_shared(options, fn.__name__, kwargs)
                    if check is not None:
                        check(**kwargs)
                    if "dask_address" in shared:  # runs a flow: its Prefect server starts now,
                        launch_early()  # while the command imports its flow (about 2 s each)
                    result = fn(**kwargs, shared=options)
                    if render is not None:
                        emit(result, options.as_json, render)
            finally:
                stop_early()
            if read_only and PROGRAM.running:
                quick_exit()

        run.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in own + added}
        return cast(F, run)

    return decorate


def check_shared(options: Shared, name: str, own: Mapping[str, Any]) -> None:
    """The shared options' values, and a ``--store`` given, checked before anything starts."""
    owner = owner_of(name)
    check_workers(options.workers, owner)
    check_lock_timeout(options.lock_timeout, owner)
    if isinstance(own.get("store"), str):
        check_store(own["store"], owner)


@contextmanager
def errors_reported(
    name: str, parameter_flags: Mapping[str, str], parameters: Mapping[str, Any]
) -> Iterator[None]:
    """Turn any exception of the command ``name`` into its exit code and one line on stderr."""
    try:
        yield
    except (typer.Exit, typer.Abort, BrokenPipeError):
        raise  # an exit already decided on, or stdout closed early (typer handles both)
    except KeyboardInterrupt:
        _print_line(Text(f"fairpipe {name}: interrupted"))
        raise typer.Exit(INTERRUPTED) from None
    except Exception as exc:
        bad = input_error(exc)
        if bad is not None:
            one_line = " ".join(str(bad).split("\n"))
            message, code = _with_flags(one_line, parameter_flags), _exit_code_of(bad)
            if code == STORE_BUSY and "lock_timeout" in parameters:
                message += " (option --lock-timeout)"  # it says "pass a lock timeout to wait"
            _print_error(message)
            raise typer.Exit(code) from None
        _report_bug(name, exc, parameters)
        raise typer.Exit(BUG) from None


def input_error(exc: BaseException) -> FairpipeInputError | None:
    """The bad-input error behind ``exc``, or None when ``exc`` is a bug.

    Wrappers (Prefect's, Dask's) name the error they wrap explicitly: ``raise ... from error``, or
    a group of one exception. An error merely *during the handling* of bad input (its
    ``__context__``) is a bug of its own, and is reported as one.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, FairpipeInputError):
            return current
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup) and len(current.exceptions) == 1:
            current = current.exceptions[0]
        else:
            current = current.__cause__
    return None


def _exit_code_of(error: FairpipeInputError) -> int:
    from storage.lock import StoreBusyError  # storage imports zarr: only when it is needed

    return STORE_BUSY if isinstance(error, StoreBusyError) else BAD_INPUT


def _with_flags(message: str, parameter_flags: Mapping[str, str]) -> str:
    """``message`` with the flags of the library parameters it names (``'fanout'``) appended."""
    named = [flag for parameter, flag in parameter_flags.items() if f"'{parameter}'" in message]
    if not named:
        return message
    return f"{message} (option{'s' if len(named) > 1 else ''} {', '.join(named)})"


def _print_error(message: str) -> None:
    # A Text, not a string: rich would read "[lower, upper]" in a message as markup.
    _print_line(Text.assemble(("error:", "bold red"), " ", message))


def _print_line(line: Text) -> None:
    diagnostics_console().print(line)


def _debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def _report_bug(name: str, exc: BaseException, parameters: Mapping[str, Any]) -> None:
    _print_line(Text(f"fairpipe {name} failed with an internal error: {describe(exc)}"))
    tb = "".join(traceback.format_exception(exc))
    if _debugging():
        sys.stderr.write(tb)
        return
    try:
        path = write_bug_report(name, exc, parameters, tb)
    except OSError as why:  # no writable cache folder: the traceback must still be somewhere
        _print_line(Text(f"the traceback could not be written to a file ({why}):"))
        sys.stderr.write(tb)
        return
    _print_line(Text(f"the traceback is in {path}"))


def describe(exc: BaseException) -> str:
    """``KeyError: 'x'``: the exception's type and the first line of its message."""
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    lines = str(exc).strip().splitlines()
    return f"{name}: {lines[0]}" if lines else name


def errors_folder() -> Path:
    """Where bug reports go: ``$XDG_CACHE_HOME/fairpipe/errors`` (default ``~/.cache``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fairpipe" / "errors"


def write_bug_report(name: str, exc: BaseException, parameters: Mapping[str, Any], tb: str) -> Path:
    """Write the traceback, the command line and the versions to a new file; return its path."""
    folder = errors_folder()
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    report = "\n".join(
        [
            f"fairpipe {name} failed with an internal error: {describe(exc)}",
            f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}",
            f"command line: {shlex.join(sys.argv)}",
            f"parameters: {dict(parameters)!r}",
            f"python: {sys.version.split()[0]} ({platform.platform()})",
            "versions: " + ", ".join(f"{p} {_version(p)}" for p in REPORTED_PACKAGES),
            "",
            tb,
        ]
    )
    for attempt in range(1, 1000):  # the same command failing twice in a second, in one process
        path = folder / (f"{stem}.txt" if attempt == 1 else f"{stem}-{attempt}.txt")
        try:
            with open(path, "x", encoding="utf-8") as fh:
                fh.write(report)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder / stem}*.txt")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
