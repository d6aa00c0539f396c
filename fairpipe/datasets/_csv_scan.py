"""Scans a plain CSV's bytes once: the byte offset of every OFFSET_STRIDE-th data row (so that a
chunk job seeks to its rows), checked as it goes (UTF-8 text, no blank line before the last row,
one row per line, each line with the header's fields).
"""

from __future__ import annotations

import numpy as np

from fairpipe.datasets._source_io import SourcePath, open_binary
from fairpipe.errors import FairpipeInputError
from fairpipe.tables import NOT_UTF8

# A CSV's data row 0 is on line 2, below its header.
CSV_FIRST_LINE = 2
OFFSET_STRIDE = 4096
SCAN_BYTES = 64 << 20


def scan_csv(path: SourcePath, n_fields: int | None = None) -> tuple[np.ndarray, int]:
    """Byte offsets of data rows 0, STRIDE, 2 STRIDE, ... of a plain CSV, and its number of data
    rows (one pass over its bytes looking for line ends). A row is found by its position, so the
    file's lines after the header must be its rows as pandas reads them: an empty or blank line
    before the last row, or a count that differs (a quoted field holding a line break), is an
    error naming the line (pandas skips blank lines, so every row after one was read from the line above).
    The same pass checks that the file is UTF-8 text and, in a file without quotes, that every
    line has the header's ``n_fields`` fields (pandas reads a short row as missing values, and
    fails on a long one only when the chunk holding it is read)."""
    import codecs

    utf8 = codecs.getincrementaldecoder("utf-8")()
    offsets, line, pos = [], 0, 0
    carry = False  # the unfinished line at the end of the previous block has content
    carry_commas = 0  # the commas of that unfinished line
    quoted = False  # a quote anywhere: commas may be inside fields, the fields are not counted
    blank: int | None = None  # the first blank line after the header (0 = the header)
    rows = 0  # lines after the header with content
    with open_binary(path) as f:
        while block := f.read(SCAN_BYTES):
            if not (block.isascii() and utf8.getstate()[0] == b""):  # ASCII: 30x faster
                _check_utf8(utf8, block, pos, path)
            b = np.frombuffer(block, dtype=np.uint8)
            nl = np.flatnonzero(b == 10)
            content = b > 32  # not a space, a tab, a line end or another control byte
            quoted = quoted or b'"' in block
            commas = (b == 44).view(np.uint8) if n_fields is not None and not quoted else None
            if nl.size:
                starts = np.r_[0, nl[:-1] + 1]
                has = np.logical_or.reduceat(content[: nl[-1] + 1], starts)
                has[0] |= carry
                numbers = np.arange(line, line + nl.size)  # each line ending in this block
                data = has & (numbers > 0)
                rows += int(data.sum())
                empty = np.flatnonzero(~has & (numbers > 0))
                if blank is None and empty.size:
                    blank = int(numbers[empty[0]])
                last = int(numbers[np.flatnonzero(data)[-1]]) if data.any() else -1
                if blank is not None and last > blank:
                    raise FairpipeInputError(BLANK_LINE.format(where=path.name, line=blank + 1))
                if commas is not None:  # (a sum over bytes: flatnonzero takes 1.5x as long)
                    fields = np.add.reduceat(commas[: nl[-1] + 1], starts, dtype=np.int64) + 1
                    fields[0] += carry_commas
                    wrong = np.flatnonzero(has & (fields != n_fields))
                    if wrong.size:
                        i = int(wrong[0])
                        raise FairpipeInputError(FIELD_COUNT.format(
                            line=int(numbers[i]) + 1, where=path.name, got=int(fields[i]),
                            n=n_fields))  # fmt: skip
                    carry_commas = int(np.count_nonzero(commas[nl[-1] + 1 :]))
                # Line i (0 = the header) ends at ends[i - line]; data row r starts after line r.
                ends = nl + pos + 1
                offsets.append(ends[numbers % OFFSET_STRIDE == 0])
                line += nl.size
                carry = bool(content[nl[-1] + 1 :].any())
            else:
                carry = carry or bool(content.any())
                carry_commas += 0 if commas is None else int(np.count_nonzero(commas))
            pos += len(block)
    _check_utf8(utf8, b"", pos, path, final=True)
    if carry and line > 0:  # a last row without a line end
        if blank is not None:
            raise FairpipeInputError(BLANK_LINE.format(where=path.name, line=blank + 1))
        if n_fields is not None and not quoted and carry_commas + 1 != n_fields:
            raise FairpipeInputError(FIELD_COUNT.format(line=line + 1, where=path.name,
                                                        got=carry_commas + 1, n=n_fields))  # fmt: skip
        rows += 1
    return (np.concatenate(offsets) if offsets else np.zeros(0, np.int64)), rows


def _check_utf8(decoder, block: bytes, pos: int, path: SourcePath, final: bool = False) -> None:
    """Decode ``block`` (the file's bytes from ``pos``) as UTF-8, or raise naming the line of
    the first byte that is not."""
    try:
        decoder.decode(block, final)
    except UnicodeDecodeError as e:
        at = pos + e.start - (len(e.object) - len(block))  # the decoder kept a partial character
        with open_binary(path) as again:
            before = again.read(at)
            byte = again.read(1)
        raise FairpipeInputError(NOT_UTF8.format(
            where=path.name, line=before.count(b"\n") + 1, byte=f"0x{byte[0]:02x}" if byte else "end",
        )) from None  # fmt: skip


BLANK_LINE = (
    "{where} has an empty line at line {line}, before its last row. fairpipe reads a CSV's rows "
    "by position: remove the empty lines."
)
ROW_COUNT = (
    "{where} has {rows} non-empty lines after its header, but {n} rows as CSV (a quoted field "
    "holding a line break?). fairpipe reads a CSV's rows by position: write one row per line."
)
FIELD_COUNT = "Line {line} of {where} has {got} field(s); its header has {n}."


def _header_fields(path: SourcePath) -> int | None:
    """The number of fields of a plain CSV's header line (None where it holds a quote: a comma
    may then be inside a field)."""
    with open_binary(path) as f:
        header = f.readline()
    return None if b'"' in header else header.count(b",") + 1
