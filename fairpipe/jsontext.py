"""JSON text from users and producers, parsed within bounds on its size and its nesting.

Every JSON document fairpipe reads from bytes it did not write (a deletion request a producer
filed, a bounds or desired-distribution file, a lock's holder note) goes through
:func:`parse_json`. Python's parser recurses once per nested array or object: a document nested
deeper than the interpreter's recursion limit (``[[[[...`` 200,000 deep fits in 400 kB) raises
RecursionError, a crash rather than bad input, and one nested a little less builds values that
every later recursive step (printing, comparing, dumping them) trips on. So a document is refused
when it holds more than ``max_bytes`` or nests arrays and objects more than ``max_depth`` deep,
before the parser sees it. The depth is measured over the bytes with numpy (brackets outside
strings), so checking a 32 MiB document costs milliseconds, and nothing when it holds fewer
opening brackets than the maximum depth (a deletion request holds one).

Messages are clauses about the document ("it is not UTF-8 text: line 3 holds the byte 0xe9"),
for the caller's sentence naming the file or object.

>>> parse_json(b'{"ids": [1, 2]}')
{'ids': [1, 2]}
>>> parse_json(b"[" * 65 + b"]" * 65)
Traceback (most recent call last):
...
fairpipe.jsontext.JSONTextError: it nests arrays and objects 65 deep, over 64
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fairpipe.errors import FairpipeInputError

# A deletion request of 1,000,000 ids (the most one holds) takes 21 MB; bounds and
# distributions take a few hundred bytes.
MAX_JSON_BYTES = 32 * 1024 * 1024
# Far above any document fairpipe reads (a request nests 2 deep, a bounds file 3) and far below
# the parser's recursion limit.
MAX_JSON_DEPTH = 64

TOO_LARGE = "it holds more than {limit:,} bytes"
NOT_UTF8 = "it is not UTF-8 text: line {line} holds the byte 0x{byte:02x}"
TOO_DEEP = "it nests arrays and objects {depth:,} deep, over {limit}"
NOT_JSON = "it is not valid JSON ({why})"

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
# +1 for an opening bracket, -1 for a closing one, 0 for every other byte (UTF-8's multi-byte
# sequences hold no ASCII byte, so the bytes of text in any script count 0).
_NESTING = np.zeros(256, dtype=np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1
_CHUNK = 1 << 20  # bytes measured at once: the arrays of one step stay a few MB


class JSONTextError(FairpipeInputError):
    """A JSON document :func:`parse_json` refuses; the message is a clause saying why."""


def parse_json(
    data: bytes, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """The value the UTF-8 JSON text ``data`` holds, or :class:`JSONTextError` when it holds
    more than ``max_bytes`` bytes, is not UTF-8, nests arrays and objects more than
    ``max_depth`` deep, or is not JSON."""
    if len(data) > max_bytes:
        raise JSONTextError(TOO_LARGE.format(limit=max_bytes))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise JSONTextError(NOT_UTF8.format(line=line, byte=data[e.start])) from None
    if data.count(b"[") + data.count(b"{") > max_depth:  # else it cannot nest deeper
        depth = nesting_depth(data)
        if depth > max_depth:
            raise JSONTextError(TOO_DEEP.format(depth=depth, limit=max_depth))
    try:
        return json.loads(text)
    except ValueError as e:  # JSONDecodeError, and an integer of over 4,300 digits
        raise JSONTextError(NOT_JSON.format(why=e)) from None


def nesting_depth(data: bytes) -> int:
    r"""How deep the JSON text ``data`` nests arrays and objects (0 for a number or a string): the
    most brackets open at once, brackets inside strings not counted. For text that is not JSON,
    at least the depth a parser reaches before it finds the error (up to there, both see the
    same strings).

    >>> nesting_depth(b'{"a": [[1], "]]]"], "b": "\\\\"}')
    3
    """
    b = np.frombuffer(data, dtype=np.uint8)
    quotes = _unescaped_quotes(b)
    depth = deepest = 0
    for start in range(0, b.size, _CHUNK):
        step = _NESTING[b[start : start + _CHUNK]]
        at = np.flatnonzero(step)
        # A bracket is inside a string when an odd number of quotes precede it.
        outside = np.searchsorted(quotes, at + start) % 2 == 0
        levels = np.cumsum(step[at[outside]], dtype=np.int64) + depth
        if levels.size:
            deepest = max(deepest, int(levels.max()))
            depth = int(levels[-1])
    return deepest


def _unescaped_quotes(b: np.ndarray) -> np.ndarray:
    """Positions of the quotes that open or close strings: those not escaped by an odd run of
    backslashes before them."""
    quotes = np.flatnonzero(b == _QUOTE)
    slashes = np.flatnonzero(b == _BACKSLASH)
    if quotes.size == 0 or slashes.size == 0:
        return quotes
    breaks = np.flatnonzero(np.diff(slashes) != 1)
    run_starts = slashes[np.concatenate(([0], breaks + 1))]
    run_ends = slashes[np.concatenate((breaks, [slashes.size - 1]))]
    run = np.minimum(np.searchsorted(run_ends, quotes - 1), run_ends.size - 1)
    escaped = (run_ends[run] == quotes - 1) & ((run_ends[run] - run_starts[run]) % 2 == 0)
    return quotes[~escaped]
