"""What a command writes: its result on stdout (``--json``: one object), its progress and its
lines of error on stderr, and what it does when those streams are closed, gone or full.

Text that comes from data or from other producers (reasons, file, group and column names, request
ids) is printed with its control characters escaped (:func:`printable`), and never read as rich
markup.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import unicodedata
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from fairpipe.errors import FairpipeInputError


class _Console(Console):
    """rich's console, but a reader gone from stdout is :class:`OutputClosed` (rich would exit
    1 at once), and one gone from stderr silences the console (the exit code still tells)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        if not self.stderr:
            raise OutputClosed()


def result_console() -> Console:
    """A console on stdout for a command's human-readable result. It reads no markup and no
    emoji codes: text from data ('[bold]', ':smile:') is printed as it is (build styled text
    with :class:`rich.text.Text`)."""
    return _Console(soft_wrap=True, markup=False, emoji=False)


def diagnostics_console() -> Console:
    """A console on stderr for progress and errors (soft wrap: an error stays on one line for grep
    and logs); like :func:`result_console`, it reads no markup."""
    return _Console(stderr=True, soft_wrap=True, markup=False, emoji=False)


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
    with its text made :func:`printable`. Written whole before the command ends: an output
    that cannot take it is named (:class:`OutputError`), a reader gone is :class:`OutputClosed`."""
    try:
        if as_json:
            sys.stdout.write(json.dumps(result, default=str, ensure_ascii=True) + "\n")
        else:
            render(printable(result))
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed() from None
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise OutputClosed() from None
        raise OutputError(OUTPUT_FAILED.format(why=exc.strerror or exc)) from None


# -- standard output that is closed, gone or full --------------------------------------------------
OUTPUT_CLOSED = 141  # as a shell reports a command ended by SIGPIPE: ``fairpipe history | head``
OUTPUT_FAILED = "Cannot write the result to standard output: {why}."


class OutputClosed(Exception):
    """The reader of standard output is gone (``| head`` has read what it wanted)."""


class OutputError(FairpipeInputError):
    """Standard output refuses the result (a full disk, ``> /dev/full``)."""


def standard_streams() -> None:
    """Standard input, output and error opened on ``/dev/null`` where the program was started
    with them closed (``fairpipe info >&-``): the output is then discarded, as a shell's
    ``>/dev/null`` would, and no file the command opens can take their numbers, where a print
    would write into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    if sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115


def output_closed() -> None:
    """Discard what is left for a standard output whose reader is gone (Python would report the
    failed flush at exit), then end quietly with :data:`OUTPUT_CLOSED`."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    raise typer.Exit(OUTPUT_CLOSED)


def print_error(message: str) -> None:
    # A Text, not a string: rich would read "[lower, upper]" in a message as markup.
    print_line(Text.assemble(("error:", "bold red"), " ", escape_controls(message)))


def print_line(line: Text) -> None:
    with contextlib.suppress(OSError):  # a stderr closed or full: the exit code still tells
        diagnostics_console().print(line)
