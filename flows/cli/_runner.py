"""What every command shares: where its output goes, and the one exception handler.

Results go to stdout (``--json``: one object), diagnostics and errors to stderr. The exit code
says what went wrong:

- 2: bad input (:class:`~fairpipe.errors.FairpipeInputError`), one line ``error: <message>``;
  typer's own usage errors exit 2 as well; so does a read-only filesystem, a full disk or a
  refused permission (the line names the path and what to do);
- 3: the store is busy (:class:`~fairpipe.storage.lock.StoreBusyError`), one line ``error: <message>``;
- 4: the store is damaged (:class:`~fairpipe.storage.damage.DamagedStoreError`: a chunk whose bytes fail
  their checksum, a snapshot or manifest Icechunk cannot read or that is not what its commit
  recorded), one line ``error: <message>`` naming the store and what is damaged (the array and
  chunk, the snapshot);
- 130: interrupted;
- 141: the reader of stdout is gone (``fairpipe history | head -n1``), quietly, as a command
  ended by SIGPIPE; a stdout that refuses the result (full) is bad input naming stdout;
- 1: anything else, which is a bug (a Rust panic in Icechunk included): one line naming the
  exception, and a second naming the file holding the traceback (``FAIRPIPE_DEBUG=1`` or
  ``--verbose``: the traceback itself, on stderr).

Its output (:mod:`fairpipe.flows.cli._output`) and a bug's report (:mod:`fairpipe.flows.cli._bugs`) have modules of
their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import inspect
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import typer
from rich.text import Text

from fairpipe.errors import FairpipeInputError, outcomes, wrapped
from fairpipe.flows.cli._bugs import is_panic, report_bug
from fairpipe.flows.cli._options import (
    check_file_kinds,
    check_store,
    owner_of,
    setting_option,
    typed_numbers,
)
from fairpipe.flows.cli._output import (
    OutputClosed,
    emit,
    escape_controls,
    output_closed,
    print_error,
    print_line,
)
from fairpipe.flows.cli._quiet import loud_libraries
from fairpipe.flows.prefect_server import deliver_records, launch_early, stop_early
from fairpipe.old_names import OLD_FLAGS
from fairpipe.settings import (
    AS_JSON,
    DASK_ADDRESS,
    DASK_CLUSTER,
    LOCK_TIMEOUT,
    REQUIRED,
    VERBOSE,
    WORKERS,
    Setting,
    check_settings,
)

BAD_INPUT, BUG, STORE_BUSY, INTERRUPTED = 2, 1, 3, 130
CORRUPT_STORE = 4

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Program:
    """Whether the command runs as the ``fairpipe`` program (:func:`fairpipe.flows.cli.main`) rather than
    called in a process that goes on (a test's CLI runner)."""

    running: bool = False
    # Set by the program's signal handlers: whatever error an interrupt turns into on its way
    # out (a library wrapping the KeyboardInterrupt it met), the command was interrupted.
    interrupted: bool = False


PROGRAM = _Program()


def end_now(code: int = 0) -> None:
    """Exit ``code`` once stdout and stderr are flushed and Prefect's events and logs are
    delivered to its server, without the interpreter's teardown of every module and thread.

    - A command whose result is out does not need the teardown: it is 0.08-0.12 s of a cold
      ``fairpipe sample`` of 0.8 s at 1M rows, and 0.8 s of a one-id forget with a kept server
      (Prefect's and zarr's threads joined, their exit hooks run).
    - The teardown can abort the process: a thread of Icechunk's runtime hands each read's
      result to zarr's event loop, then waits for the interpreter; one still waiting when the
      teardown begins (a command ending a few milliseconds after reading its store, as an error
      found then or a full disk ends it) is ended by Python inside Icechunk's Rust code, and
      the process aborts (SIGABRT) after printing its last line."""
    import logging

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, gone or full: the code tells
            stream.flush()
    deliver_records()
    logging.shutdown()
    os._exit(code)


# -- the options every command of a kind shares --------------------------------------------------
@dataclass(frozen=True)
class Shared:
    """The options a command shares with others of its kind: where its flows run, how long it
    waits for another writer, whether it answers in JSON, and whether libraries' logs and
    tracebacks are shown (every command has ``--verbose``)."""

    as_json: bool = AS_JSON.default
    dask_address: str | None = DASK_ADDRESS.default
    dask_cluster: str | None = DASK_CLUSTER.default
    workers: int = WORKERS.default
    lock_timeout: float = LOCK_TIMEOUT.default
    verbose: bool = VERBOSE.default
    # Whether the --store given named no store's folder when the command started (before it
    # waited for anything): a store there later was made by another command meanwhile.
    store_absent: bool = False

    @property
    def cluster(self) -> dict[str, Any]:
        """The keyword arguments of a ``run_*`` flow entry point that pick its Dask cluster."""
        return {
            "dask_address": self.dask_address,
            "dask_cluster": self.dask_cluster,
            "n_workers": self.workers,
        }


# Each shared option's annotation (flag and help) and default, from its declaration.
SHARED_OPTIONS: dict[str, tuple[Any, Any]] = {
    s.name: (setting_option(s), s.default)
    for s in (DASK_ADDRESS, DASK_CLUSTER, WORKERS, LOCK_TIMEOUT, AS_JSON, VERBOSE)
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
            settings: Sequence[Setting] = ()) -> Callable[[F], F]:  # fmt: skip
    """A command: run under the one exception handler (see the module's docstring), with the
    ``shared`` options (and ``--verbose``) added after its own and given to it as
    ``shared: Shared``; the dict it returns is printed as one JSON object (``--json``) or by
    ``render``.

    A ``read_only`` command (one that writes nothing and runs no flow), and a command that runs
    a flow (once its flow's records are delivered), end the ``fairpipe`` program as soon as their
    result is out (:func:`end_now`).

    ``parameter_flags`` maps a library parameter that a bad-input message may name (``'fanout'``)
    to the flag of this command that sets it (``--tree-width``); the message then names the flag.

    ``settings`` (:mod:`fairpipe.settings`) are the command's flags, each from its one
    declaration (flag, type, default, help) and checked by its rule before anything starts; the
    command receives them as keyword arguments (``**settings``, or by name after ``*``).

    ``check`` is called with the command's own options before anything starts (the early Prefect
    server, a cluster, a flow), as the shared options are checked (:func:`check_shared`).

    ``name``: how messages name the command (``server start``; default: the function's name).

    The command's old flags (``fairpipe.old_names.OLD_FLAGS``: ``--k`` -> ``n_clusters``)
    still work for one release, hidden from ``--help``; one given together with its new flag is
    bad input (:func:`merge_renamed`).
    """
    flags = {**{s.name: s.flag for s in settings}, **(parameter_flags or {})}
    shared = (*shared, "verbose")
    declared = [inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY,
                                  annotation=setting_option(s),
                                  default=inspect.Parameter.empty if s.default is REQUIRED
                                  else s.default)
                for s in settings]  # fmt: skip

    def decorate(fn: F) -> F:
        # (a setting may be named in the command's signature, keyword-only, for its body)
        named = {s.name for s in settings}
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.name != "shared" and p.name not in named
               and p.kind is not inspect.Parameter.VAR_KEYWORD]  # fmt: skip
        owner = owner_of(name or fn.__name__)
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                              default=default)
            for name, (annotation, default) in SHARED_OPTIONS.items() if name in shared
        ]  # fmt: skip
        by_name = {p.name: p for p in own + declared}
        old_flags = OLD_FLAGS.get(name or fn.__name__, {})
        hidden = [_old_flag_parameter(flag, by_name[new]) for flag, new in old_flags.items()]
        if hidden:  # typer hands the command its context: which options the command line gave
            hidden.append(inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY,
                                            annotation=typer.Context))  # fmt: skip

        @functools.wraps(fn)
        def run(**kwargs: Any) -> None:
            context = kwargs.pop(CONTEXT, None)
            if kwargs["verbose"]:
                loud_libraries()
            try:
                with errors_reported((name or fn.__name__).replace("_", "-"), flags, dict(kwargs)):
                    options = Shared(**{name: kwargs.pop(name) for name in shared})
                    merge_renamed(kwargs, old_flags, context)
                    options = check_shared(options, name or fn.__name__, kwargs,
                                           writes=set(WRITES_STORES) <= set(shared))  # fmt: skip
                    check_settings(owner, settings, kwargs, by_flag=True)
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
                end_now()  # its result is out, and so are its flow's records

        every = own + declared + added + hidden
        every = [p.replace(annotation=typed_numbers(p.annotation, owner)) for p in every]
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


def check_shared(
    options: Shared, name: str, own: Mapping[str, Any], writes: bool = False
) -> Shared:
    """The shared options' values, and a ``--store`` given, checked before anything starts;
    ``options`` with :attr:`Shared.store_absent` noted. A command that ``writes`` a local store
    takes its writer lock for a moment: a store it cannot write, or (waiting for no other
    writer: ``--lock-timeout 0``) one another writer holds, is refused now."""
    owner = owner_of(name)
    check_settings(owner, (WORKERS, LOCK_TIMEOUT), options, by_flag=True)
    check_file_kinds(own)
    if isinstance(own.get("store"), str):
        folder = check_store(own["store"], owner)
        if writes and folder is not None:
            from fairpipe.storage.lock import (
                check_lock,  # (start-up time: storage loads on first use)
            )

            # A forget told to keep its request (--unapplied keep) files it on a busy store too.
            wait = options.lock_timeout > 0 or own.get("unapplied") == "keep"
            check_lock(folder, own["store"], wait=wait)
        if folder is not None and not folder.exists():
            return dataclasses.replace(options, store_absent=True)
    return options


def _interruption(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised while handling, a stop asked for: a Ctrl-C, or
    Prefect's ``TerminationSignal`` (its SIGTERM handler, installed while a flow runs). A
    signal landing inside a compiled kernel surfaces as the kernel's ``SystemError`` with the
    interrupt as its context."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt) or type(current).__name__ == "TerminationSignal":
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def errors_reported(
    name: str, parameter_flags: Mapping[str, str], parameters: Mapping[str, Any]
) -> Iterator[None]:
    """Turn any exception of the command ``name`` into its exit code and one line on stderr."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise  # an exit already decided on
    except OutputClosed:
        output_closed()
    except KeyboardInterrupt as exc:
        print_line(Text(escape_controls(_told(f"fairpipe {name}: interrupted", exc))))
        raise typer.Exit(INTERRUPTED) from None
    except BaseException as exc:
        if PROGRAM.interrupted or _interruption(exc):
            print_line(Text(escape_controls(_told(f"fairpipe {name}: interrupted", exc))))
            raise typer.Exit(INTERRUPTED) from None
        if not isinstance(exc, Exception) and not is_panic(exc):
            raise  # SystemExit and the like: not an error of the command
        corrupt = _damaged_store(exc)
        if corrupt is not None:  # damaged storage: neither bad input nor a bug
            print_error(_told(str(corrupt.with_store(parameters.get("store"))), exc))
            raise typer.Exit(CORRUPT_STORE) from None
        bad = input_error(exc)
        if bad is not None:
            one_line = " ".join(str(bad).split("\n"))
            message, code = _with_flags(one_line, parameter_flags), _exit_code_of(bad)
            if code == STORE_BUSY and "lock_timeout" in parameters and "lock timeout" in message:
                # it says "pass a lock timeout to wait."
                message = message.removesuffix(".") + " (option --lock-timeout)."
            print_error(_told(message, exc))
            raise typer.Exit(code) from None
        environment = environment_error(exc, parameters)
        if environment is not None:
            print_error(_told(environment, exc))
            raise typer.Exit(BAD_INPUT) from None
        report_bug(name, exc, parameters)
        if outcomes_of(exc):
            print_line(Text(escape_controls(_told("", exc).strip())))
        raise typer.Exit(BUG) from None


def outcomes_of(exc: BaseException) -> list[str]:
    """What became of the work ``exc`` stopped (:func:`fairpipe.errors.note_outcome`), as told
    by it or the errors it wraps."""
    return [text for error in wrapped(exc) for text in outcomes(error)]


def _told(message: str, exc: BaseException) -> str:
    """``message``, then each outcome of ``exc`` as a sentence of its own, on the same line."""
    told = outcomes_of(exc)
    if not told:
        return message
    if message and not message.endswith("."):
        message += "."
    return message + "".join(f" {text[:1].upper()}{text[1:]}." for text in told)


def input_error(exc: BaseException) -> FairpipeInputError | None:
    """The bad-input error behind ``exc``, or None when ``exc`` is a bug.

    Wrappers (Prefect's, Dask's) name the error they wrap explicitly: ``raise ... from error``, or
    a group of one exception. An error merely *during the handling* of bad input (its
    ``__context__``) is a bug of its own, and is reported as one.
    """
    return next((e for e in wrapped(exc) if isinstance(e, FairpipeInputError)), None)


def _damaged_store(exc: BaseException):
    """The :class:`fairpipe.storage.damage.DamagedStoreError` behind ``exc``, or the damage an Icechunk
    error behind it reports (:func:`fairpipe.storage.damage.damaged_store_error`, the one place that
    tells them apart), if any (none where no store was read: storage was never imported)."""
    damage = sys.modules.get("fairpipe.storage.damage")
    if damage is None:
        return None
    return next((d for d in map(damage.damaged_store_error, wrapped(exc)) if d is not None), None)


def _exit_code_of(error: FairpipeInputError) -> int:
    from fairpipe.storage.lock import StoreBusyError  # storage imports zarr: only when it is needed

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
    for error in wrapped(exc):
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

    from fairpipe.storage.lock import (
        nearest_existing,  # (start-up time: storage loads on first use)
    )

    try:
        free = shutil.disk_usage(nearest_existing(Path(path))).free
    except OSError:
        return "unknown"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if free >= size:
            return f"{free / size:.1f} {unit}"
    return f"{free} bytes"
