"""Tables users give as files (CSV, optionally gzip-compressed, and Parquet), read by pandas and
pyarrow with one error for each way a file can be malformed, naming the file and what is wrong:
not UTF-8 text (the line and the byte), not a CSV file pandas can read, no rows, not a Parquet
file, a column of lists or records where one value per row is expected.

Ingest's sources (:mod:`fairpipe.datasets`), the named data sets' and the audit's files, and
rerank's candidates (:mod:`fairpipe.ranking`) are read through here.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fairpipe.errors import FairpipeInputError

NOT_CSV = "{where} is not a CSV file pandas can read ({why})."
NOT_UTF8 = "{where} is not UTF-8 text: line {line} holds the byte {byte}. Save it as UTF-8."
NOT_UTF8_SOMEWHERE = "{where} is not UTF-8 text ({why}). Save it as UTF-8."
NOT_PARQUET = "{where} is not a readable Parquet file ({why})."
NO_ROWS = "{where} holds no rows."
NESTED_COLUMN = (
    "Column {col!r} of {where} holds {what} ({type}); {role} must hold one {unit} per row."
)
SCAN_BYTES = 1 << 22  # bytes decoded at once when looking for the first byte that is not UTF-8


def _name(path: Any) -> str:
    """How messages name a file: its name (a URL's ``name`` is the whole URL)."""
    return getattr(path, "name", None) or Path(str(path)).name


def first_line(error: BaseException) -> str:
    """The first line of an error's message (pandas and pyarrow add lines of context)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")


def open_text_file(path: str | Path):
    """A local file's bytes, decompressed when its name ends in ``.gz``."""
    return gzip.open(path, "rb") if str(path).lower().endswith(".gz") else open(path, "rb")


def count_lines(path: str | Path, where: str | None = None) -> int:
    """The lines of the local text file ``path`` (decompressed; a last line without its line end
    counted), checked to be UTF-8 on the way: :data:`NOT_UTF8` names the line and the byte of
    the first that is not. A pass at disk speed (blocks of ASCII are not decoded)."""
    where = where or _name(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines, last = 0, b"\n"  # line ends before the bytes the decoder holds; the last byte
    with open_text_file(path) as f:
        while True:
            block = f.read(SCAN_BYTES)
            if not (block.isascii() and decoder.getstate()[0] == b"") or not block:
                try:
                    decoder.decode(block, final=not block)
                except UnicodeDecodeError as e:
                    # The decoder's bytes: those it kept of the last block (part of one
                    # character, no line end), then this block.
                    line = lines + e.object[: e.start].count(b"\n") + 1
                    byte = e.object[e.start : e.start + 1]
                    raise FairpipeInputError(NOT_UTF8.format(
                        where=where, line=line, byte=f"0x{byte[0]:02x}" if byte else "end"
                    )) from None  # fmt: skip
            if not block:
                return lines + (last != b"\n")
            lines += block.count(b"\n")
            last = block[-1:]


def not_utf8(path: Any, why: UnicodeDecodeError, where: str | None = None) -> FairpipeInputError:
    """The error for a text table that is not UTF-8: its line and byte where the file is local
    (read again to find them), else the decoder's message."""
    where = where or _name(path)
    if isinstance(path, (str, Path)) and Path(path).is_file():
        try:
            count_lines(path, where)
        except FairpipeInputError as found:
            return found
        except (OSError, EOFError):  # a gzip cut short: the decoder's message
            pass
    return FairpipeInputError(NOT_UTF8_SOMEWHERE.format(where=where, why=first_line(why)))


@contextlib.contextmanager
def csv_errors(path: Any, where: str | None = None, empty: str | None = None,
               keep: tuple[type[BaseException], ...] = ()) -> Iterator[None]:  # fmt: skip
    """pandas's errors reading the CSV ``path`` inside as one FairpipeInputError naming the
    file: no rows (the message ``empty``, by default :data:`NO_ROWS`), not UTF-8 (line and
    byte), not CSV (pandas's reason: a row of more fields than the header, an unterminated
    quote, a gzip that is not one...). Errors of the types ``keep`` pass as they are."""
    import pandas as pd

    where = where or _name(path)
    passed: tuple[type[BaseException], ...] = (FairpipeInputError, *keep)
    try:
        yield
    except passed:
        raise
    except pd.errors.EmptyDataError:
        raise FairpipeInputError(empty or NO_ROWS.format(where=where)) from None
    except UnicodeDecodeError as why:
        raise not_utf8(path, why, where) from None
    except (pd.errors.ParserError, ValueError, OSError, EOFError) as why:
        raise FairpipeInputError(NOT_CSV.format(where=where, why=first_line(why))) from None


@contextlib.contextmanager
def parquet_errors(path: Any, where: str | None = None,
                   keep: tuple[type[BaseException], ...] = ()) -> Iterator[None]:  # fmt: skip
    """pyarrow's errors reading the Parquet file ``path`` inside (not Parquet, cut short,
    unreadable) as one FairpipeInputError naming the file. Errors of the types ``keep`` pass as
    they are."""
    import pyarrow as pa

    where = where or _name(path)
    passed: tuple[type[BaseException], ...] = (FairpipeInputError, *keep)
    try:
        yield
    except passed:
        raise
    except (OSError, pa.ArrowException) as why:
        raise FairpipeInputError(NOT_PARQUET.format(where=where, why=first_line(why))) from None


def read_csv_table(path: str | Path, empty: str | None = None, **options):
    """The CSV file ``path`` (``.gz``: decompressed) as pandas reads it with ``options``, or one
    FairpipeInputError naming the file and what is wrong (:func:`csv_errors`)."""
    import pandas as pd

    with csv_errors(path, empty=empty), open_text_file(path) as f:
        return pd.read_csv(f, **options)


def read_parquet_table(path: str | Path, flat: Mapping[str, tuple[str, str]] | None = None,
                       where: str | None = None):  # fmt: skip
    """The Parquet file ``path`` as a pandas table, or one FairpipeInputError naming the file and
    what is wrong; ``flat`` (:func:`check_flat_columns`) names the columns that must hold one
    value per row, checked on the file's schema before its rows are read."""
    import pyarrow.parquet as pq

    where = where or _name(path)
    with parquet_errors(path, where), open(path, "rb") as f:
        table = pq.ParquetFile(f)
        check_flat_columns(table.schema_arrow, where, flat or {})
        return table.read().to_pandas()


def _nested_kind(arrow_type) -> str | None:
    """What a column of this Arrow type holds per row when it is not one value: "lists",
    "records", "maps", "unions"; None for a plain value (a number, text, a time...)."""
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_map(t):
        return "maps"
    if pa.types.is_struct(t):
        return "records"
    if pa.types.is_union(t):
        return "unions"
    return "lists" if pa.types.is_nested(t) else None


def check_flat_columns(schema, where: str, flat: Mapping[str, tuple[str, str]]) -> None:
    """The columns of the Arrow ``schema`` named in ``flat`` (a column's name -> (how messages
    name its role, the one value each row must hold): ``("a feature column", "number")``) hold
    one value per row, or an error naming the first that holds lists or records (pandas would
    make them arrays in cells, which no later step reads)."""
    for field in schema:
        if field.name not in flat:
            continue
        what = _nested_kind(field.type)
        if what is not None:
            role, unit = flat[field.name]
            raise FairpipeInputError(NESTED_COLUMN.format(
                col=field.name, where=where, what=what, type=field.type, role=role, unit=unit
            ))  # fmt: skip
