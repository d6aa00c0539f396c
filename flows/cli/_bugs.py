"""A bug's report: one line on stderr naming the exception, and a file holding the traceback, the
command line and the versions (``FAIRPIPE_DEBUG=1`` or ``--verbose``: the traceback on stderr).

A bug report holds no person's ids and no reason for forgetting them: the values of
:data:`PRIVATE_PARAMETERS` are left out of its command line and parameters, and the numbers in
its exception messages are replaced by ``<n>``; only its owner can read it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shlex
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.text import Text

from fairpipe.flows.cli._output import escape_controls, print_line

DEBUG_VARIABLE = "FAIRPIPE_DEBUG"
# The versions a bug report names, besides Python's.
REPORTED_PACKAGES = ("fairpipe", "numpy", "dask", "distributed", "prefect", "zarr", "icechunk")
# Parameters whose values identify people (ids) or say why they asked to be forgotten: a bug
# report leaves them out (its command line and its parameters).
PRIVATE_PARAMETERS = ("ids", "reason", "query_id")
REDACTED = "REDACTED"


def _debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def is_panic(exc: BaseException) -> bool:
    """A Rust panic raised through PyO3 (``pyo3_runtime.PanicException``, a BaseException)."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"


def report_bug(name: str, exc: BaseException, parameters: Mapping[str, Any]) -> None:
    print_line(Text(escape_controls(f"fairpipe {name} failed with an internal error: "
                                     f"{describe(exc)}")))  # fmt: skip
    if _debugging() or parameters.get("verbose"):
        sys.stderr.write("".join(traceback.format_exception(exc)))
        return
    try:
        path = write_bug_report(name, exc, parameters)
    except OSError as why:  # no writable cache folder: the traceback must still be somewhere
        print_line(Text(f"the traceback could not be written to a file ({why}):"))
        sys.stderr.write("".join(traceback.format_exception(exc)))
        return
    print_line(Text(f"the traceback is in {path}"))


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
