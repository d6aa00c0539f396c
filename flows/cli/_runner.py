"""What every command shares: where its output goes, and the one exception handler.

Results go to stdout (``--json``: one object), diagnostics and errors to stderr. The exit code
says what went wrong:

- 2: bad input (:class:`~fairpipe.errors.FairpipeInputError`), one line ``error: <message>``;
  typer's own usage errors exit 2 as well; so does a read-only filesystem, a full disk or a
  refused permission (the line names the path and what to do);
- 3: the store is busy (:class:`~storage.lock.StoreBusyError`), one line ``error: <message>``;
- 4: a chunk of the store is damaged (:class:`~storage.store.CorruptChunkError`: its bytes fail
  their checksum), one line ``error: <message>`` naming the array, the chunk and the store;
- 130: interrupted;
- 1: anything else, which is a bug (a Rust panic in Icechunk included): one line naming the
  exception, and a second naming the file holding the traceback (``FAIRPIPE_DEBUG=1`` or
  ``--verbose``: the traceback itself, on stderr).

A bug report holds no person's ids and no reason for forgetting them: the values of
:data:`PRIVATE_PARAMETERS` are left out of its command line and parameters, and the numbers in
its exception messages are replaced by ``<n>``; only its owner can read it.

Text that comes from data or from other producers (reasons, file, group and column names, request
ids) is printed with its control characters escaped (:func:`printable`), and never read as rich
markup.
"""

from __future__ import annotations

import errno
import functools
import importlib.metadata
import inspect
import json
import os
import platform
import re
import shlex
import sys
import time
import traceback
import typing
import unicodedata
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
    DaskCluster,
    LockTimeout,
    Verbose,
    Workers,
    check_lock_timeout,
    check_store,
    check_workers,
    owner_of,
)

BAD_INPUT, BUG, STORE_BUSY, INTERRUPTED = 2, 1, 3, 130
CORRUPT_STORE = 4
DEBUG_VARIABLE = "FAIRPIPE_DEBUG"
# The versions a bug report names, besides Python's.
REPORTED_PACKAGES = ("fairpipe", "numpy", "dask", "distributed", "prefect", "zarr", "icechunk")
# Parameters whose values identify people (ids) or say why they asked to be forgotten: a bug
# report leaves them out (its command line and its parameters).
PRIVATE_PARAMETERS = ("ids", "reason", "query_id")
REDACTED = "REDACTED"

F = TypeVar("F", bound=Callable[..., Any])


# -- output ----------------------------------------------------------------------------------------
def result_console() -> Console:
    """A console on stdout for a command's human-readable result. It reads no markup and no
    emoji codes: text from data ('[bold]', ':smile:') is printed as it is (build styled text
    with :class:`rich.text.Text`)."""
    return Console(soft_wrap=True, markup=False, emoji=False)


def diagnostics_console() -> Console:
    """A console on stderr for progress and errors (soft wrap: an error stays on one line for grep
    and logs); like :func:`result_console`, it reads no markup."""
    return Console(stderr=True, soft_wrap=True, markup=False, emoji=False)


# Characters that move the cursor, clear the screen, end a line or reorder the text shown:
# C0 and C1 controls and DEL, and Unicode's format characters (bidi overrides and isolates,
# zero-width characters), line and paragraph separators, surrogates and private or unassigned
# code points.
_ASCII_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """``text`` with every character that could act on a terminal shown as a visible escape:
    ``\\n``, ``\\x1b``, ``\\u202e``. Printable text (any script) is left as it is."""
    if text.isascii() and not _ASCII_CONTROLS.search(text):
        return text
    return "".join(
        _escape(ch) if ord(ch) < 0x20 or unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch
        for ch in text
    )


def _escape(ch: str) -> str:
    if ch in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(value: Any) -> Any:
    """``value`` (a command's result) with every string in it, keys included, passed through
    :func:`escape_controls`: what every command's text rendering receives."""
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(printable(v) for v in value)
    return value


def emit(result: dict, as_json: bool, render: Callable[[dict], None]) -> None:
    """The result on stdout: one JSON object (every non-ASCII and control character escaped by
    the encoder: ``\\u001b``, ``\\u202e``), or ``render``'s text for people, given the result
    with its text made :func:`printable`."""
    if as_json:
        sys.stdout.write(json.dumps(result, default=str, ensure_ascii=True) + "\n")
    else:
        render(printable(result))


@dataclass
class _Program:
    """Whether the command runs as the ``fairpipe`` program (:func:`flows.cli.main`) rather than
    called in a process that goes on (a test's CLI runner)."""

    running: bool = False
    # Set by the program's signal handlers: whatever error an interrupt turns into on its way
    # out (a library wrapping the KeyboardInterrupt it met), the command was interrupted.
    interrupted: bool = False


PROGRAM = _Program()


def quick_exit() -> None:
    """End the program now, with exit code 0, once stdout and stderr are flushed and Prefect's
    events and logs are delivered to its server: without the interpreter's teardown of every
    module and thread, which a command whose result is out does not need (0.08-0.12 s of a cold
    ``fairpipe sample`` of 0.8 s at 1M rows; 0.8 s of a one-id forget with a kept server, which
    joined Prefect's and zarr's threads and ran their exit hooks)."""
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    _deliver_prefect_records()
    logging.shutdown()
    os._exit(0)


def _deliver_prefect_records() -> None:
    """Send what Prefect still holds of the command's flow run (its events, from which the server
    records task runs, and its logs) to its server: what Prefect's exit hooks would do."""
    if "prefect" not in sys.modules:
        return
    import contextlib

    with contextlib.suppress(Exception):
        from prefect.events.worker import EventsWorker

        EventsWorker.drain_all(timeout=5)
    with contextlib.suppress(Exception):
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)


# -- the options every command of a kind shares --------------------------------------------------
@dataclass(frozen=True)
class Shared:
    """The options a command shares with others of its kind: where its flows run, how long it
    waits for another writer, whether it answers in JSON, and whether libraries' logs and
    tracebacks are shown (every command has ``--verbose``)."""

    as_json: bool = False
    dask_address: str | None = None
    dask_cluster: str | None = None
    workers: int = 2
    lock_timeout: float = 0.0
    verbose: bool = False

    @property
    def cluster(self) -> dict[str, Any]:
        """The keyword arguments of a ``run_*`` flow entry point that pick its Dask cluster."""
        return {
            "dask_address": self.dask_address,
            "dask_cluster": self.dask_cluster,
            "n_workers": self.workers,
        }


# Each shared option once: its annotation (flag and help) and its default.
SHARED_OPTIONS: dict[str, tuple[Any, Any]] = {
    "dask_address": (DaskAddress, None),
    "dask_cluster": (DaskCluster, None),
    "workers": (Workers, 2),
    "lock_timeout": (LockTimeout, 0.0),
    "as_json": (AsJson, False),
    "verbose": (Verbose, False),
}
RUNS_FLOWS = ("dask_address", "dask_cluster", "workers", "as_json")
WRITES_STORES = ("dask_address", "dask_cluster", "workers", "lock_timeout", "as_json")


# -- errors ----------------------------------------------------------------------------------------
def command(parameter_flags: Mapping[str, str] | None = None, *,
            shared: tuple[str, ...] = ("as_json",),
            render: Callable[[dict], None] | None = None,
            read_only: bool = False,
            check: Callable[..., None] | None = None,
            name: str | None = None,
            renamed: Mapping[str, str] | None = None) -> Callable[[F], F]:  # fmt: skip
    """A command: run under the one exception handler (see the module's docstring), with the
    ``shared`` options (and ``--verbose``) added after its own and given to it as
    ``shared: Shared``; the dict it returns is printed as one JSON object (``--json``) or by
    ``render``.

    A ``read_only`` command (one that writes nothing and runs no flow), and a command that runs
    a flow (once its flow's records are delivered), end the ``fairpipe`` program as soon as their
    result is out (:func:`quick_exit`).

    ``parameter_flags`` maps a library parameter that a bad-input message may name (``'fanout'``)
    to the flag of this command that sets it (``--tree-width``); the message then names the flag.

    ``check`` is called with the command's own options before anything starts (the early Prefect
    server, a cluster, a flow), as the shared options are checked (:func:`check_shared`).

    ``name``: how messages name the command (``server start``; default: the function's name).

    ``renamed`` maps an old flag (``--k``) to the parameter that replaced it (``n_clusters``):
    the old flag still works for one release, hidden from ``--help``; given together with the
    new one, it is bad input (:func:`merge_renamed`).
    """
    flags = dict(parameter_flags or {})
    shared = (*shared, "verbose")
    old_flags = dict(renamed or {})

    def decorate(fn: F) -> F:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.name != "shared"]  # fmt: skip
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                              default=default)
            for name, (annotation, default) in SHARED_OPTIONS.items() if name in shared
        ]  # fmt: skip
        by_name = {p.name: p for p in own}
        hidden = [_old_flag_parameter(flag, by_name[new]) for flag, new in old_flags.items()]
        if hidden:  # typer hands the command its context: which options the command line gave
            hidden.append(inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY,
                                            annotation=typer.Context))  # fmt: skip

        @functools.wraps(fn)
        def run(**kwargs: Any) -> None:
            context = kwargs.pop(CONTEXT, None)
            if kwargs["verbose"]:
                from flows.cli import loud_libraries

                loud_libraries()
            try:
                with errors_reported(name or fn.__name__, flags, dict(kwargs)):
                    options = Shared(**{name: kwargs.pop(name) for name in shared})
                    merge_renamed(kwargs, old_flags, context)
                    check_shared(options, name or fn.__name__, kwargs)
                    if check is not None:
                        check(**kwargs)
                    if "dask_address" in shared:  # runs a flow: its Prefect server starts now,
                        launch_early()  # while the command imports its flow (about 2 s each)
                    result = fn(**kwargs, shared=options)
                    if render is not None:
                        emit(result, options.as_json, render)
            finally:
                stop_early()
            if PROGRAM.running and (read_only or "dask_address" in shared):
                quick_exit()  # its result is out, and so are its flow's records

        every = own + added + hidden
        run.__signature__ = inspect.Signature(every)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in every}
        return cast(F, run)

    return decorate


# -- old flags, kept as hidden aliases for one release ----------------------------------------------
BOTH_NAMES = "Give {new} or its old name {old}, not both."
CONTEXT = "old__context"


def _old_name(flag: str) -> str:
    """The parameter an old flag fills: ``--tree-width`` -> ``old__tree_width``."""
    return "old__" + flag.lstrip("-").replace("-", "_")


def _old_flag_parameter(flag: str, new: inspect.Parameter) -> inspect.Parameter:
    """A hidden option ``flag`` of the new parameter's type, None when not given."""
    base = typing.get_args(new.annotation)[0] if typing.get_origin(new.annotation) is (
        typing.Annotated) else new.annotation  # fmt: skip
    option = typer.Option(flag, hidden=True, show_default=False)
    return inspect.Parameter(_old_name(flag), inspect.Parameter.KEYWORD_ONLY,
                             annotation=typing.Annotated[base | None, option], default=None)  # fmt: skip


def merge_renamed(kwargs: dict[str, Any], old_flags: Mapping[str, str],
                  context: typer.Context | None) -> None:  # fmt: skip
    """Move the values of old flags given to their new parameters (in place); an old flag given
    with its new one (on the command line: ``context``) is bad input."""
    for flag, new in old_flags.items():
        value = kwargs.pop(_old_name(flag), None)
        if value is None:
            continue
        source = context.get_parameter_source(new) if context is not None else None
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            raise FairpipeInputError(BOTH_NAMES.format(new=_flag(new), old=flag))
        kwargs[new] = value


def _flag(parameter: str) -> str:
    return "--" + parameter.replace("_", "-")


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
    except BaseException as exc:
        if PROGRAM.interrupted or type(exc).__name__ == "TerminationSignal":  # Prefect's SIGTERM
            _print_line(Text(f"fairpipe {name}: interrupted"))
            raise typer.Exit(INTERRUPTED) from None
        if not isinstance(exc, Exception) and not _is_panic(exc):
            raise  # SystemExit and the like: not an error of the command
        corrupt = _corrupt_chunk(exc)
        if corrupt is not None:  # damaged storage: neither bad input nor a bug
            _print_error(str(corrupt.with_store(parameters.get("store"))))
            raise typer.Exit(CORRUPT_STORE) from None
        bad = input_error(exc)
        if bad is not None:
            one_line = " ".join(str(bad).split("\n"))
            message, code = _with_flags(one_line, parameter_flags), _exit_code_of(bad)
            if code == STORE_BUSY and "lock_timeout" in parameters:
                message += " (option --lock-timeout)"  # it says "pass a lock timeout to wait"
            _print_error(message)
            raise typer.Exit(code) from None
        environment = environment_error(exc, parameters)
        if environment is not None:
            _print_error(environment)
            raise typer.Exit(BAD_INPUT) from None
        _report_bug(name, exc, parameters)
        raise typer.Exit(BUG) from None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it wraps: its explicit cause (``raise ... from``), the one error
    of a group of one, and a redacted flow error's original (:mod:`flows.private`)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup) and len(current.exceptions) == 1:
            current = current.exceptions[0]
        elif getattr(current, "original", None) is not None and type(current).__name__ == (
            "RedactedError"
        ):
            current = current.original  # type: ignore[attr-defined]
        else:
            current = current.__cause__


def input_error(exc: BaseException) -> FairpipeInputError | None:
    """The bad-input error behind ``exc``, or None when ``exc`` is a bug.

    Wrappers (Prefect's, Dask's) name the error they wrap explicitly: ``raise ... from error``, or
    a group of one exception. An error merely *during the handling* of bad input (its
    ``__context__``) is a bug of its own, and is reported as one.
    """
    return next((e for e in _causes(exc) if isinstance(e, FairpipeInputError)), None)


def _corrupt_chunk(exc: BaseException):
    """The :class:`storage.store.CorruptChunkError` behind ``exc``, if any (none where no chunk
    was read: storage.store was never imported)."""
    store = sys.modules.get("storage.store")
    if store is None:
        return None
    return next((e for e in _causes(exc) if isinstance(e, store.CorruptChunkError)), None)


def _exit_code_of(error: FairpipeInputError) -> int:
    from storage.lock import StoreBusyError  # storage imports zarr: only when it is needed

    return STORE_BUSY if isinstance(error, StoreBusyError) else BAD_INPUT


def _with_flags(message: str, parameter_flags: Mapping[str, str]) -> str:
    """``message`` with the flags of the library parameters it names (``'fanout'``) appended."""
    named = [flag for parameter, flag in parameter_flags.items() if f"'{parameter}'" in message]
    if not named:
        return message
    return f"{message} (option{'s' if len(named) > 1 else ''} {', '.join(named)})"


# -- the filesystem refusing: read-only, full, not ours ------------------------------------------
READ_ONLY = "{path} is on a read-only filesystem; {need}."
NO_SPACE = "No space left on device writing {path} ({free} free there now); free space or {need}."
NOT_PERMITTED = "Permission denied: {path}; {need}."
# The options naming a path a command writes, and what a message asks of them.
PATH_OPTIONS = {"store": "--store", "out": "--out", "plot": "--plot"}
# The errno of an OSError, or the "(os error N)" of a Rust library's error message (Icechunk's
# errors and panics, object_store's), that the filesystem refused with.
_OS_ERROR = re.compile(r"\(os error (\d+)\)")
ENVIRONMENT_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM}


def environment_error(exc: BaseException, parameters: Mapping[str, Any]) -> str | None:
    """The one-line message of a filesystem that refused to be written (read-only, full,
    not permitted) behind ``exc``, wherever it was raised (a Dask worker's error, Icechunk's,
    a Rust panic); None for any other error."""
    for error in _causes(exc):
        code, path = None, None
        if isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS:
            if error.errno in (errno.EACCES, errno.EPERM) and error.filename is None:
                continue  # a refused signal or socket, not a file: a bug
            code, path = error.errno, error.filename
        elif (found := _OS_ERROR.search(str(error))) and int(found.group(1)) in ENVIRONMENT_ERRNOS:
            code = int(found.group(1))  # Icechunk does not say which file: the store's
        if code is None:
            continue
        shown, flag = _path_option(str(path) if path is not None else None, parameters)
        if code == errno.EROFS:
            need = f"give a writable {flag}" if flag else "write to a writable filesystem"
            return READ_ONLY.format(path=shown, need=need)
        if code in (errno.ENOSPC, errno.EDQUOT):
            need = f"give {flag} another folder" if flag else "use another folder"
            return NO_SPACE.format(path=shown, free=_free_space(shown), need=need)
        need = f"give {flag} a folder you may read and write" if flag else "use another folder"
        return NOT_PERMITTED.format(path=shown, need=need)
    return None


def _path_option(path: str | None, parameters: Mapping[str, Any]) -> tuple[str, str | None]:
    """The path to name in the message and the option that gave it: the path an option gave
    that holds ``path`` (a store's folder rather than a file deep in it), or ``path``; for an
    error that names no file, the first path option given."""
    for name, flag in PATH_OPTIONS.items():
        given = parameters.get(name)
        if not given or "://" in str(given):
            continue
        if path is None or _inside(path, str(given)):
            return str(given), flag
    return (path or "a file"), None


def _inside(path: str, folder: str) -> bool:
    try:
        Path(path).resolve().relative_to(Path(folder).resolve())
        return True
    except (ValueError, OSError):
        return False


def _free_space(path: str) -> str:
    """The space left on ``path``'s filesystem (of its nearest existing folder)."""
    import shutil

    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return "unknown"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if free >= size:
            return f"{free / size:.1f} {unit}"
    return f"{free} bytes"


# -- bugs ------------------------------------------------------------------------------------------
def _print_error(message: str) -> None:
    # A Text, not a string: rich would read "[lower, upper]" in a message as markup.
    _print_line(Text.assemble(("error:", "bold red"), " ", escape_controls(message)))


def _print_line(line: Text) -> None:
    diagnostics_console().print(line)


def _debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def _is_panic(exc: BaseException) -> bool:
    """A Rust panic raised through PyO3 (``pyo3_runtime.PanicException``, a BaseException)."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"


def _report_bug(name: str, exc: BaseException, parameters: Mapping[str, Any]) -> None:
    _print_line(Text(escape_controls(f"fairpipe {name} failed with an internal error: "
                                     f"{describe(exc)}")))  # fmt: skip
    if _debugging() or parameters.get("verbose"):
        sys.stderr.write("".join(traceback.format_exception(exc)))
        return
    try:
        path = write_bug_report(name, exc, parameters)
    except OSError as why:  # no writable cache folder: the traceback must still be somewhere
        _print_line(Text(f"the traceback could not be written to a file ({why}):"))
        sys.stderr.write("".join(traceback.format_exception(exc)))
        return
    _print_line(Text(f"the traceback is in {path}"))


def describe(exc: BaseException) -> str:
    """``KeyError: 'x'``: the exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{_kind(exc)}: {lines[0]}" if lines else _kind(exc)


def _kind(exc: BaseException) -> str:
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def errors_folder() -> Path:
    """Where bug reports go: ``$XDG_CACHE_HOME/fairpipe/errors`` (default ``~/.cache``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fairpipe" / "errors"


def write_bug_report(name: str, exc: BaseException, parameters: Mapping[str, Any]) -> Path:
    """Write the traceback, the command line and the versions to a new file only its owner can
    read (in a folder only they can open); return its path. Nothing identifying a person goes
    in (see the module)."""
    folder = errors_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)  # also a folder made before bug reports were private
    stem = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    report = "\n".join(
        [
            f"fairpipe {name} failed with an internal error: {redact_numbers(describe(exc))}",
            f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}",
            f"command line: {shlex.join(redacted_argv(sys.argv))}",
            f"parameters: {redacted_parameters(parameters)!r}",
            f"python: {sys.version.split()[0]} ({platform.platform()})",
            "versions: " + ", ".join(f"{p} {_version(p)}" for p in REPORTED_PACKAGES),
            "",
            redacted_traceback(exc),
        ]
    )
    reason = parameters.get("reason")
    if isinstance(reason, str) and reason.strip():
        report = report.replace(reason, REDACTED)  # in a message that quoted it
    for attempt in range(1, 1000):  # the same command failing twice in a second, in one process
        path = folder / (f"{stem}.txt" if attempt == 1 else f"{stem}-{attempt}.txt")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(report)
        return path
    raise FileExistsError(f"{folder / stem}*.txt")


def redacted_argv(argv: list[str]) -> list[str]:
    """``argv`` with the values of :data:`PRIVATE_PARAMETERS`' flags (``--ids 1,2``,
    ``--ids=1,2``) replaced by ``REDACTED``."""
    flags = {"--" + name.replace("_", "-") for name in PRIVATE_PARAMETERS}
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        flag, equals, _ = arg.partition("=")
        if hide_next:
            shown.append(REDACTED)
            hide_next = False
        elif flag in flags and equals:
            shown.append(f"{flag}={REDACTED}")
        else:
            shown.append(arg)
            hide_next = arg in flags
    return shown


def redacted_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: REDACTED if k in PRIVATE_PARAMETERS and v not in (None, "") else v
        for k, v in parameters.items()
    }


_NUMBER = re.compile(r"\b\d+\b")


def redact_numbers(message: str) -> str:
    """``message`` with its numbers (any of which could be a person's id) replaced by ``<n>``."""
    return _NUMBER.sub("<n>", message)


def redacted_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` and of the errors it was raised from or during, as Python prints
    it, with the numbers in their messages and notes redacted (:func:`redact_numbers`): the
    frames (files, lines, code) are kept, the data in messages is not."""
    return "".join(_redacted_lines(exc, set()))


def _redacted_lines(exc: BaseException, seen: set[int]) -> list[str]:
    seen.add(id(exc))
    lines: list[str] = []
    if exc.__cause__ is not None and id(exc.__cause__) not in seen:
        lines += _redacted_lines(exc.__cause__, seen)
        lines.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif (exc.__context__ is not None and not exc.__suppress_context__
          and id(exc.__context__) not in seen):  # fmt: skip
        lines += _redacted_lines(exc.__context__, seen)
        lines.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    if exc.__traceback__ is not None:
        lines.append("Traceback (most recent call last):\n")
        lines += traceback.format_tb(exc.__traceback__)
    message = redact_numbers(str(exc))
    lines.append(f"{_kind(exc)}: {message}\n" if message else f"{_kind(exc)}\n")
    lines += [redact_numbers(str(note)) + "\n" for note in getattr(exc, "__notes__", ())]
    if isinstance(exc, BaseExceptionGroup):
        for i, member in enumerate(exc.exceptions, 1):
            lines.append(f"+---- {i} ----\n")
            lines += [
                "    " + line for line in "".join(_redacted_lines(member, seen)).splitlines(True)
            ]
    return lines


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
