"""Row sources for ingest: plan a source once, then read any row range [a, b) of it.

A plan holds what is small and global (n, d, ids, group codes and names); the feature rows are
read chunk by chunk, so a chunk reader's memory is bounded by the chunk size. Sources: a ``.npy``
matrix (memory-mapped; optional groups and ids ``.npy``), CSV (optionally gzip-compressed) or
Parquet with feature columns and optional id and group columns, the ``gaussian`` generator, and
in-memory data sets (``digits`` and the real data sets' loaders).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fairpipe.datasets import _loaders as loaders
from fairpipe.datasets._remote import (
    UrlPath,
    UrlUnreadable,
    is_url,
    list_url,
    open_url,
    url_size,
)
from fairpipe.datasets._scaling import apply_scaler
from fairpipe.errors import FairpipeInputError, check_positive_int, plain, subject
from fairpipe.neighbors import MAX_ROWS
from fairpipe.tables import (
    NOT_CSV,
    NOT_PARQUET,
    NOT_UTF8,
    check_flat_columns,
    csv_errors,
    parquet_errors,
)
from fairpipe.tables import first_line as _first_line
from fairpipe.validation import (
    EMPTY,
    NON_NUMERIC,
    check_points,
    check_unique_ids,
    load_npy,
    row_name,
)

SourcePath = Path | UrlPath  # a local file or folder, or an object's URL
BUILTINS = ("digits", "gaussian")
NAMED_LOADERS = ("mnist", "word2vec", "adult", "bank", "census-kdd")
MISSING_COLUMN = "Column {col!r} ({role}) is not in {where}; its columns are {columns}."
NON_NUMERIC_COLUMN = (
    "Feature column {col!r} of {where} is not numeric ({at} holds {value}); "
    "name it with --group-column or --id-column, or remove it."
)
MISSING_GROUP = "{at} has no value in the group column {col!r}."
MISSING_ID = "{at} has no value in the id column {col!r}."
LENGTH_MISMATCH = "{what} {path} holds {got} entries; the points file holds {n} rows."
NOT_A_LIST = "{what} {path} must hold one value per row (one dimension). Got shape {shape}."
NOT_A_MATRIX = "{where} must hold a 2-dimensional matrix. Got shape {shape}."
UNUSED_OPTION = "{flag} does not apply to {where}, {what}."
# A CSV's data row 0 is on line 2, below its header.
CSV_FIRST_LINE = 2
# The sizes of the gaussian data set, each with its upper bound and why. The generator makes
# GAUSSIAN_BLOCK rows at a time (float64, then float32) from the clusters' centres (clusters x d
# float64): at most 256 MiB each.
GAUSSIAN_SIZE = "{subject} must be an integer from 1 to {high}: {why}. Got {value} instead."
GAUSSIAN_BOUNDS = {
    "n": (MAX_ROWS, "a store indexes at most 2^31 - 1 rows"),
    "d": (8192, f"the generator makes {loaders.GAUSSIAN_BLOCK:,} rows of d values at a time"),
    "clusters": (4096, "the generator keeps a centre of d values for each cluster"),
    "groups": (4096, "a row's group is its cluster's number modulo the groups"),
}


@dataclass
class SourcePlan:
    kind: str  # npy | csv | parquet | gaussian | memory | rows (read already: rows_plan)
    where: str  # how error messages name the source
    n: int
    d: int
    path: str | None = None
    ids: np.ndarray | None = None  # None: row numbers
    groups: np.ndarray | None = None  # int32 codes into group_names
    group_names: list[str] = field(default_factory=list)
    feature_columns: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    points: np.ndarray | None = None  # in-memory sources only
    points_start: int = 0  # the source row of ``points[0]`` (a chunk's plan holds its rows only)
    columns: list[str] = field(default_factory=list)  # a table's columns, in file order
    # A plain CSV: the byte offset of every OFFSET_STRIDE-th data row, so that a chunk job seeks
    # to its rows instead of parsing the file from the top (each byte is parsed once).
    row_offsets: np.ndarray | None = None
    # A Parquet data set (a folder, or a prefix of objects): its files in order, and their rows.
    files: list[tuple[str, int]] = field(default_factory=list)
    # The scaler (center, scale: float64 per column) every row read is put through
    # (:func:`apply_scaler`); None: the values as they are.
    scaler: tuple[np.ndarray, np.ndarray] | None = None


OFFSET_STRIDE = 4096
SCAN_BYTES = 64 << 20


def csv_row_offsets(path: SourcePath, n_rows: int, n_fields: int | None = None) -> np.ndarray:
    """Byte offsets of data rows 0, STRIDE, 2 STRIDE, ... of a plain CSV of ``n_rows`` rows as
    pandas reads it, checked by :func:`scan_csv`."""
    offsets, rows = scan_csv(path, n_fields)
    if rows != n_rows:
        raise FairpipeInputError(ROW_COUNT.format(where=path.name, rows=rows, n=n_rows))
    return offsets[: -(-n_rows // OFFSET_STRIDE)]


def scan_csv(path: SourcePath, n_fields: int | None = None) -> tuple[np.ndarray, int]:
    """(Byte offsets of data rows 0, STRIDE, 2 STRIDE, ... of a plain CSV (one pass over its
    bytes looking for line ends). A row is found by its position, so the file's lines after the
    header must be its ``n_rows`` rows (what pandas reads): an empty or blank line before the
    last row, or a count that differs (a quoted field holding a line break), is an error naming
    the line (pandas skips blank lines, so every row after one was read from the line above).
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


def _codes(values: np.ndarray, where: str, col: str,
           first_line: int | None = None) -> tuple[np.ndarray, list[str]]:  # fmt: skip
    """(code of each row, the group names sorted as strings): a row's code is the position of
    its value, as a string, among the names. A missing value is named by its row (its line in
    a text file whose row 0 is on line ``first_line``)."""
    values = np.asarray(values)
    if values.dtype.kind in "biuU":  # no missing values, and str(v) is numpy's astype(str):
        # numpy alone (pandas costs a process 0.4 s to import, most of a small append's plan)
        unique, codes = np.unique(values.astype(str), return_inverse=True)
        return codes.astype(np.int32).reshape(-1), unique.tolist()
    import pandas as pd

    series = pd.Series(values)
    missing = series.isna().to_numpy()
    if missing.any():
        at = row_name(int(np.argmax(missing)), where, first_line)
        raise FairpipeInputError(MISSING_GROUP.format(at=at[:1].upper() + at[1:], col=col))
    as_str = series.astype(str)
    names = sorted(as_str.unique().tolist())
    lookup = {nm: i for i, nm in enumerate(names)}
    return as_str.map(lookup).to_numpy(dtype=np.int32), names


def _ids(values, where: str, col: str, first_line: int | None) -> np.ndarray:
    """The ids of the column ``col``, by the one rule of ids (:func:`check_ids`)."""
    import pandas as pd

    missing = pd.Series(values).isna().to_numpy()
    if missing.any():
        at = row_name(int(np.argmax(missing)), where, first_line)
        raise FairpipeInputError(MISSING_ID.format(at=at[:1].upper() + at[1:], col=col))

    def locate(i: int) -> str:
        return f"in column {col!r} on {row_name(i, where, first_line)}"

    return check_unique_ids(np.asarray(values), f"the column {col!r} of {where}", locate,
                            first_line=first_line)  # fmt: skip


def check_gaussian_sizes(sizes: dict) -> None:
    """The sizes of the gaussian data set (``n``, ``d``, ``clusters``, ``groups``; those given),
    each a positive integer within :data:`GAUSSIAN_BOUNDS`, named as the command line's flags."""
    for key, (high, why) in GAUSSIAN_BOUNDS.items():
        if sizes.get(key) is None:
            continue
        value = check_positive_int(sizes[key], f"--gaussian-{key}", "the gaussian data set")
        if value > high:
            where = subject(f"--gaussian-{key}", "the gaussian data set")
            raise FairpipeInputError(
                GAUSSIAN_SIZE.format(subject=where, high=high, why=why, value=plain(value))
            )


def plan_source(
    source: str,
    *,
    group_column: str | None = None,
    id_column: str | None = None,
    groups_file: str | None = None,
    ids_file: str | None = None,
    gaussian: dict | None = None,
    seed: int = 0,
) -> SourcePlan:
    """Inspect ``source`` (a path or a built-in name) and return its plan, or raise clearly."""
    name, _, arg = source.partition(":")
    check_source_options(source, group_column, id_column, groups_file, ids_file)
    if source in BUILTINS or (name in NAMED_LOADERS and arg):
        if source == "gaussian":
            params = {"n": 20_000, "d": 16, "clusters": 8, "groups": 4, **(gaussian or {})}
            check_gaussian_sizes(params)
            params["seed"] = int(params.get("seed", seed))
            ds = loaders.Dataset(
                points=np.zeros((0, 0)),
                groups=None,
                group_names=[f"g{i}" for i in range(params["groups"])],
            )
            return SourcePlan(
                kind="gaussian",
                where="gaussian",
                n=int(params["n"]),
                d=int(params["d"]),
                group_names=ds.group_names,
                params=params,
            )
        if source == "digits":
            ds = loaders.load_digits()
        elif name == "mnist":
            ds = loaders.load_mnist_csv(arg)
        elif name == "word2vec":
            ds, _ = loaders.load_word2vec_bin(arg)
        elif name == "bank":
            ds = loaders.load_bank(arg)
        elif name == "census-kdd":
            ds = loaders.load_census_kdd(arg)
        else:
            ds = loaders.load_adult(arg)
        return SourcePlan(
            kind="memory",
            where=source,
            n=ds.points.shape[0],
            d=ds.points.shape[1],
            groups=ds.groups,
            group_names=ds.group_names,
            points=ds.points,
        )
    if is_url(source):
        return _plan_url(UrlPath(source), group_column, id_column)
    path = Path(source)
    if path.is_dir():
        files = _parquet_files(path, group_column, id_column)
        return _plan_table(path, "parquet", group_column, id_column, files)
    if not path.exists():
        raise FairpipeInputError(
            f"Source {source!r} is neither an existing file nor a built-in data set "
            f"({', '.join(BUILTINS)}, or mnist:PATH, word2vec:PATH, adult:PATH, bank:PATH, census-kdd:PATH)."
        )
    suffixes = "".join(path.suffixes[-2:]).lower()
    if path.suffix.lower() == ".npy":
        return _plan_npy(path, groups_file, ids_file)
    if suffixes.endswith(".csv") or suffixes.endswith(".csv.gz"):
        return _plan_table(path, "csv", group_column, id_column)
    if path.suffix.lower() in (".parquet", ".pq"):
        return _plan_table(path, "parquet", group_column, id_column)
    raise FairpipeInputError(f"Source {source!r}: expected a .npy, .csv, .csv.gz or .parquet file.")


def check_source_options(source: str, group_column=None, id_column=None, groups_file=None,
                         ids_file=None) -> None:  # fmt: skip
    """Refuse (rather than ignore) an option that this kind of source does not use: columns of a
    table for a .npy matrix, .npy files of ids and groups for a table, any for a built-in."""
    table = {"--group-column": group_column, "--id-column": id_column}
    npy = {"--groups-file": groups_file, "--ids-file": ids_file}
    name, _, arg = source.partition(":")
    suffixes = "".join(Path(source).suffixes[-2:]).lower()
    if source in BUILTINS or (name in NAMED_LOADERS and arg):
        where, what, unused = source, "a built-in data set", {**table, **npy}
    elif suffixes.endswith(".npy"):
        what = "a .npy matrix (ids and groups come in .npy files of their own)"
        where, unused = Path(source).name, table
    elif (
        suffixes.endswith((".csv", ".csv.gz", ".parquet", ".pq"))
        or is_url(source)
        or (Path(source).is_dir())
    ):
        what = "a table (ids and groups are its columns: --id-column, --group-column)"
        where, unused = Path(source).name, npy
    else:
        return
    given = [flag for flag, value in unused.items() if value is not None]
    if given:
        raise FairpipeInputError(UNUSED_OPTION.format(flag=given[0], where=where, what=what))


def _plan_npy(path: Path, groups_file: str | None, ids_file: str | None) -> SourcePlan:
    X = load_npy(path, f"{path} is not a numeric .npy matrix ({{why}}).", mmap_mode="r")
    where = path.name
    if X.ndim != 2:
        raise FairpipeInputError(NOT_A_MATRIX.format(where=where, shape=X.shape))
    if X.dtype.kind not in "biuf":  # complex too: its imaginary parts would be dropped
        raise FairpipeInputError(NON_NUMERIC.format(where=where, dtype=X.dtype))
    if X.shape[0] == 0:
        raise FairpipeInputError(EMPTY.format(where=where))
    plan = SourcePlan(kind="npy", where=where, n=X.shape[0], d=X.shape[1], path=str(path))
    if groups_file is not None:
        g = _load_column(groups_file, "Groups file", plan.n)
        plan.groups, plan.group_names = _codes(g, Path(groups_file).name, "groups")
    if ids_file is not None:
        ids = _load_column(ids_file, "Ids file", plan.n)
        plan.ids = check_unique_ids(ids, where=Path(ids_file).name)
    return plan


def _load_column(path: str, what: str, n: int) -> np.ndarray:
    """A .npy file of one value per row of the points file, or an error naming it."""
    values = load_npy(path, f"{what} {path} is not a .npy array ({{why}}).")
    if values.ndim != 1:
        raise FairpipeInputError(NOT_A_LIST.format(what=what, path=path, shape=values.shape))
    if values.shape[0] != n:
        raise FairpipeInputError(
            LENGTH_MISMATCH.format(what=what, path=path, got=values.shape[0], n=n)
        )
    return values


def _read_table(path: SourcePath, kind: str, columns=None, skip: int = 0, nrows: int | None = None,
                dtype=None, files: list[tuple[str, int]] | None = None):  # fmt: skip
    """Rows [skip, skip + nrows) of a table's ``columns``, or an error naming what is wrong with
    the file (not Parquet; not CSV, or not UTF-8, as pandas reads it)."""
    import pandas as pd

    if kind == "parquet":
        # A URL that cannot be read is not the file's fault: the caller names the URL (and the
        # worker).
        with parquet_errors(path, keep=(UrlUnreadable,)):
            return _read_parquet(path, columns, skip, nrows, files)
    skiprows = range(1, skip + 1) if skip else None
    with csv_errors(path, empty=EMPTY.format(where=path.name), keep=(UrlUnreadable,)):
        if isinstance(path, UrlPath):  # pandas infers the compression from a name only
            gz = "gzip" if path.suffix.lower() == ".gz" else None
            with open_binary(path) as f:
                return pd.read_csv(f, usecols=columns, skiprows=skiprows, nrows=nrows, dtype=dtype,
                                   compression=gz)  # fmt: skip
        return pd.read_csv(path, usecols=columns, skiprows=skiprows, nrows=nrows, dtype=dtype)


def _read_parquet(path: SourcePath, columns, skip: int, nrows: int | None,
                  files: list[tuple[str, int]] | None = None):  # fmt: skip
    """Rows [skip, skip + nrows) of a Parquet file, or of a data set's ``files`` (path, rows)
    taken one after the other: only the row groups holding them are read."""
    import pandas as pd

    if not files:
        return _read_parquet_file(path, columns, skip, nrows)
    stop = skip + (nrows if nrows is not None else sum(rows for _, rows in files))
    parts: list = []
    base = 0
    for name, size in files:
        if base < stop and base + size > skip:
            a = max(skip - base, 0)
            parts.append(
                _read_parquet_file(_source_path(name), columns, a, min(stop - base, size) - a)
            )
        base += size
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def _read_parquet_file(path: SourcePath, columns, skip: int, nrows: int | None):
    import pandas as pd
    import pyarrow.parquet as pq

    with open_binary(path) as f:
        pf = pq.ParquetFile(f)
        if nrows is None and skip == 0:
            return pf.read(columns=columns).to_pandas()
        stop = skip + (nrows if nrows is not None else pf.metadata.num_rows)
        parts, base = [], 0
        for rg in range(pf.metadata.num_row_groups):
            size = pf.metadata.row_group(rg).num_rows
            if base < stop and base + size > skip:
                part = pf.read_row_group(rg, columns=columns).to_pandas()
                parts.append(part.iloc[max(skip - base, 0) : stop - base])
            base += size
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def _parquet_files(folder: Path | UrlPath, group_column: str | None = None,
                   id_column: str | None = None) -> list[tuple[str, int]]:  # fmt: skip
    """The Parquet files (``.parquet``, ``.pq``) of a folder or an object prefix, sorted by
    name, with their rows (read from their footers); each file's columns hold one value per
    row (:func:`_flat_columns`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(folder, UrlPath):
        try:
            names = [url for url, _ in list_url(str(folder))]
        except OSError as why:
            raise FairpipeInputError(
                URL_UNREADABLE.format(url=folder, why=_first_line(why))
            ) from None
    else:
        names = sorted(str(p) for p in folder.iterdir() if p.is_file())
    names = [n for n in names if n.lower().endswith((".parquet", ".pq"))]
    if not names:
        raise FairpipeInputError(NO_PARQUET_FILES.format(where=folder.name))
    files = []
    first: list[str] | None = None
    for name in names:
        try:
            with open_binary(_source_path(name)) as f:
                meta = pq.ParquetFile(f).metadata
        except UrlUnreadable:
            raise
        except (OSError, pa.ArrowException) as why:
            raise FairpipeInputError(NOT_PARQUET.format(where=name, why=_first_line(why))) from None
        schema = meta.schema.to_arrow_schema()
        columns = schema.names
        check_flat_columns(schema, Path(name).name, _flat_columns(columns, group_column, id_column))
        first = columns if first is None else first
        if columns != first:
            raise FairpipeInputError(NOT_SAME_COLUMNS.format(
                file=name, where=folder.name, columns=columns, first=first))  # fmt: skip
        files.append((name, meta.num_rows))
    return files


def _flat_columns(columns, group_column: str | None, id_column: str | None) -> dict:
    """What each column of a table source must hold in each row (:func:`check_flat_columns`):
    the id, the group, or else a feature."""
    roles = {c: ("a feature column", "number") for c in columns}
    if group_column is not None:
        roles[group_column] = ("the group column (--group-column)", "name or number")
    if id_column is not None:
        roles[id_column] = ("the id column (--id-column)", "integer")
    return roles


def _check_parquet_columns(path: SourcePath, group_column: str | None,
                           id_column: str | None) -> None:  # fmt: skip
    """A Parquet file's columns hold one value per row, checked on its schema (its footer)."""
    import pyarrow.parquet as pq

    with parquet_errors(path, keep=(UrlUnreadable,)), open_binary(path) as f:
        schema = pq.ParquetFile(f).schema_arrow
    check_flat_columns(schema, path.name, _flat_columns(schema.names, group_column, id_column))


def _source_path(path: str) -> SourcePath:
    """A source's path as the readers take it: a URL named by its whole self."""
    return UrlPath(path) if is_url(path) else Path(path)


def open_binary(path):
    """A local file or a URL (:func:`fairpipe.datasets._remote.open_url`), opened to read bytes."""
    return open_url(str(path)) if is_url(str(path)) else open(path, "rb")


def check_url_source(source: str) -> None:
    """Raise naming the URL ``source`` if there is nothing there or it cannot be read from here
    (one request: a quick check before a command starts its work; :func:`plan_source` reads the
    source's metadata)."""
    url = UrlPath(source)
    if url.endswith("/") or not url.suffix:
        try:
            found = list_url(str(url))
        except OSError as why:
            raise FairpipeInputError(URL_UNREADABLE.format(url=url, why=_first_line(why))) from None
        if not any(name.lower().endswith((".parquet", ".pq")) for name, _ in found):
            raise FairpipeInputError(NO_PARQUET_FILES.format(where=url))
        return
    suffixes = "".join(url.suffixes[-2:]).lower()
    if not suffixes.endswith((".csv", ".csv.gz", ".parquet", ".pq")):
        raise FairpipeInputError(URL_KIND.format(url=url))
    try:
        url_size(str(url))
    except FileNotFoundError:
        raise FairpipeInputError(URL_MISSING.format(url=url)) from None
    except OSError as why:
        raise FairpipeInputError(URL_UNREADABLE.format(url=url, why=_first_line(why))) from None


def _plan_url(url: UrlPath, group_column: str | None, id_column: str | None) -> SourcePlan:
    """The plan of a source at a URL: a Parquet file, a CSV (``.csv``, ``.csv.gz``), or a Parquet
    data set (a prefix: a URL ending in ``/``, or with no suffix); or an error naming the URL
    (nothing there, or it cannot be read from here)."""
    check_url_source(url)
    try:
        if url.endswith("/") or not url.suffix:
            files = _parquet_files(url, group_column, id_column)
            return _plan_table(url, "parquet", group_column, id_column, files)
        suffixes = "".join(url.suffixes[-2:]).lower()
        kind = "parquet" if suffixes.endswith((".parquet", ".pq")) else "csv"
        return _plan_table(url, kind, group_column, id_column)
    except OSError as why:  # gone, refused or unreachable while it was read
        raise FairpipeInputError(URL_UNREADABLE.format(url=url, why=_first_line(why))) from None


URL_MISSING = "Source {url} does not exist: there is no object at that URL."
URL_UNREADABLE = "Source {url} cannot be read ({why})."
URL_KIND = (
    "Source {url}: expected a .parquet, .csv or .csv.gz object, or a prefix of Parquet files "
    "(a URL ending in /)."
)
NO_PARQUET_FILES = "Source {where} holds no Parquet files (.parquet, .pq)."
NOT_SAME_COLUMNS = (
    "{file} has the columns {columns}; the first file of {where} has {first}. The files of a "
    "Parquet data set must have the same columns."
)


def _header_fields(path: SourcePath) -> int | None:
    """The number of fields of a plain CSV's header line (None where it holds a quote: a comma
    may then be inside a field)."""
    with open_binary(path) as f:
        header = f.readline()
    return None if b'"' in header else header.count(b",") + 1


def _plan_table(path: SourcePath, kind: str, group_column: str | None, id_column: str | None,
                files: list[tuple[str, int]] | None = None) -> SourcePlan:  # fmt: skip
    where = path.name
    plain_csv = kind == "csv" and path.suffix.lower() != ".gz"
    first_line = CSV_FIRST_LINE if kind == "csv" else None
    if plain_csv:  # its bytes checked before pandas reads it: errors name their line
        offsets, rows = scan_csv(path, _header_fields(path))
    if kind == "parquet" and not files:  # (a data set's files are checked as they are listed)
        _check_parquet_columns(path, group_column, id_column)
    head = _read_table(path, kind, nrows=100, files=files)
    columns = [str(c) for c in head.columns]
    for col, role in ((group_column, "--group-column"), (id_column, "--id-column")):
        if col is not None and col not in columns:
            raise FairpipeInputError(
                MISSING_COLUMN.format(col=col, role=role, where=where, columns=columns)
            )
    features = [c for c in columns if c not in (group_column, id_column)]
    if not features:
        raise FairpipeInputError(
            f"{where} has no feature columns besides the id and group columns."
        )
    meta_cols = [c for c in (id_column, group_column) if c is not None]
    meta = _read_table(path, kind, columns=meta_cols or [features[0]], files=files)
    n = len(meta)
    if n == 0:
        raise FairpipeInputError(EMPTY.format(where=where))
    plan = SourcePlan(
        kind=kind, where=where, n=n, d=len(features), path=str(path), feature_columns=features,
        columns=columns, files=files or [],
    )  # fmt: skip
    if plain_csv:
        if rows != n:
            raise FairpipeInputError(ROW_COUNT.format(where=where, rows=rows, n=n))
        plan.row_offsets = offsets[: -(-n // OFFSET_STRIDE)]
    if group_column is not None:
        plan.groups, plan.group_names = _codes(
            meta[group_column].to_numpy(), where, group_column, first_line
        )
    if id_column is not None:
        ids = meta[id_column].to_numpy()
        if kind == "csv" and ids.dtype.kind == "f":
            # Written with a decimal point (or with a gap): read as text, so that an id above
            # 2^53 is read exactly by the one rule of ids rather than rounded by a float.
            ids = _read_table(path, kind, columns=[id_column], dtype={id_column: str})[id_column]
            ids = ids.to_numpy(dtype=object)
        plan.ids = _ids(ids, where, id_column, first_line)
    return plan


def chunk_plan(plan: SourcePlan, a: int, b: int) -> SourcePlan:
    """What a job reading rows [a, b) of the source needs of its plan: without the ids and group
    codes (n of each), and an in-memory source's rows [a, b) only, so a job is shipped its share
    of the data rather than all of it."""
    points = (
        None if plan.points is None else plan.points[a - plan.points_start : b - plan.points_start]
    )
    return replace(plan, ids=None, groups=None, points=points, points_start=a)


def rows_plan(plan: SourcePlan, a: int, b: int, rows: np.ndarray) -> SourcePlan:
    """The plan of rows [a, b) of the source, read and validated already (``rows``, from
    :func:`read_source_rows`): what a job on a machine that cannot open the source gets."""
    return replace(chunk_plan(plan, a, b), kind="rows", points=rows, path=None, row_offsets=None,
                   files=[])  # fmt: skip


def read_source_rows(plan: SourcePlan, a: int, b: int) -> np.ndarray:
    """Validated float32 rows [a, b) of the source; errors name rows of the whole source."""
    names: list[str] | None = None  # a table's feature columns, named in errors
    first_line = CSV_FIRST_LINE if plan.kind == "csv" else None
    if plan.kind == "rows":  # read and validated where the source is (rows_plan)
        assert plan.points is not None
        return plan.points[a - plan.points_start : b - plan.points_start]
    if plan.kind == "memory":
        assert plan.points is not None
        X = plan.points[a - plan.points_start : b - plan.points_start]
    elif plan.kind == "npy":
        assert plan.path is not None
        X = np.load(plan.path, mmap_mode="r", allow_pickle=False)[a:b]
    elif plan.kind == "gaussian":
        X = _gaussian_rows(plan, a, b, 0)
    else:
        assert plan.path is not None
        if plan.row_offsets is not None and a // OFFSET_STRIDE < plan.row_offsets.shape[0]:
            frame = _read_csv_at(plan, a, b)
        else:
            frame = _read_table(_source_path(plan.path), plan.kind, columns=plan.feature_columns,
                                skip=a, nrows=b - a, files=plan.files)  # fmt: skip
        if len(frame) != b - a:
            raise FairpipeInputError(
                f"{plan.where} changed while it was read: rows {a + 1}..{b} missing."
            )
        import pandas as pd

        for col in plan.feature_columns:
            # pandas >= 3 reads text as a string dtype numpy cannot interpret: ask pandas.
            if not pd.api.types.is_numeric_dtype(frame[col].dtype):
                bad = pd.to_numeric(frame[col], errors="coerce").isna() & frame[col].notna()
                row = int(np.argmax(bad.to_numpy())) if bad.any() else 0
                at = row_name(a + row, plan.where, first_line)
                raise FairpipeInputError(NON_NUMERIC_COLUMN.format(
                    col=col, where=plan.where, at=at, value=plain(frame[col].iloc[row])
                ))  # fmt: skip
        X = frame.to_numpy(dtype=np.float64)
        names = list(plan.feature_columns)
    checked = check_points(X, where=plan.where, n_features=plan.d, row_offset=a,
                           column_names=names, first_line=first_line)  # fmt: skip
    return checked if plan.scaler is None else apply_scaler(checked, *plan.scaler)


def _read_csv_at(plan: SourcePlan, a: int, b: int):
    """Rows [a, b) of a plain CSV, parsed from the nearest stored offset at or before row a."""
    import pandas as pd

    assert plan.path is not None and plan.row_offsets is not None
    j = a // OFFSET_STRIDE
    with open_binary(plan.path) as f:
        f.seek(int(plan.row_offsets[j]))
        try:
            return pd.read_csv(f, header=None, names=plan.columns, usecols=plan.feature_columns,
                               skiprows=a - j * OFFSET_STRIDE, nrows=b - a)  # fmt: skip
        except pd.errors.ParserError as why:  # a quoted file's fields are not counted ahead
            # pandas counts lines from the offset: its line 1 is data row j * STRIDE.
            found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(why))
            if found is None:
                raise FairpipeInputError(NOT_CSV.format(where=plan.where,
                                                        why=_first_line(why))) from None  # fmt: skip
            expected, line, got = map(int, found.groups())
            raise FairpipeInputError(FIELD_COUNT.format(
                line=j * OFFSET_STRIDE + CSV_FIRST_LINE - 1 + line, where=plan.where, got=got,
                n=expected)) from None  # fmt: skip


def _gaussian_rows(plan: SourcePlan, a: int, b: int, part: int) -> np.ndarray:
    """Rows [a, b) of the ``gaussian`` source: its points (``part`` 0) or groups (1), generated
    block by block (a row's values do not depend on the range asked for)."""
    p = plan.params
    blocks = range(a // loaders.GAUSSIAN_BLOCK, (b - 1) // loaders.GAUSSIAN_BLOCK + 1)
    if part == 1:  # the groups only: no points generated
        parts = [loaders.gaussian_block_groups(p["seed"], blk, p["n"], p["clusters"], p["groups"])
                 for blk in blocks]  # fmt: skip
    else:
        parts = [
            loaders.gaussian_block(p["seed"], blk, p["n"], p["d"], p["clusters"], p["groups"])[0]
            for blk in blocks
        ]
    first = blocks[0] * loaders.GAUSSIAN_BLOCK
    return np.concatenate(parts)[a - first : b - first]


def source_groups(plan: SourcePlan, a: int, b: int) -> np.ndarray:
    """Group codes of rows [a, b) (all 0 when the source has no groups)."""
    if plan.kind == "gaussian":
        return _gaussian_rows(plan, a, b, 1)
    if plan.groups is None:
        return np.zeros(b - a, dtype=np.int32)
    return plan.groups[a:b]


def read_source_sample(plan: SourcePlan, rows: np.ndarray, step: int = 65536) -> np.ndarray:
    """The validated rows ``rows`` (sorted positions) of the source. A ``.npy`` file gives just
    those rows, and a plain CSV just their lines (found from the stored line offsets, parsed
    alone: the source's bytes are parsed once, by the chunk jobs); any other source, or a
    sample holding a bad value (whose error must name its row), is read ``step`` rows at a time
    (memory bounded by the step, not by the source)."""
    rows = np.asarray(rows, dtype=np.int64)
    quick = _sample_rows(plan, rows) if rows.size else None
    if quick is not None:
        return quick
    parts = []
    for a in range(0, plan.n, step):
        mine = rows[(rows >= a) & (rows < a + step)]
        if mine.size:
            parts.append(read_source_rows(plan, a, min(a + step, plan.n))[mine - a])
    if not parts:
        return np.zeros((0, plan.d), dtype=np.float32)
    return np.concatenate(parts)


def _sample_rows(plan: SourcePlan, rows: np.ndarray) -> np.ndarray | None:
    """:func:`read_source_sample`'s rows read alone (``.npy``, plain CSV), or None where they
    cannot be (or hold anything but finite numbers: the full read then names the row)."""
    try:
        if plan.kind == "npy" and plan.path is not None:
            X = np.load(plan.path, mmap_mode="r", allow_pickle=False)
            if X.ndim != 2 or X.dtype.kind not in "biuf":
                return None
            X = np.asarray(X[rows])
        elif plan.row_offsets is not None and plan.path is not None:
            X = _csv_lines(plan, rows)
            if X is None:
                return None
        else:
            return None
        if X.shape != (rows.size, plan.d) or not np.isfinite(X).all():  # bool, ints: finite
            return None
        checked = check_points(X, where=plan.where, n_features=plan.d)
        return checked if plan.scaler is None else apply_scaler(checked, *plan.scaler)
    except (FairpipeInputError, ValueError, TypeError, OSError):
        return None


def _csv_lines(plan: SourcePlan, rows: np.ndarray) -> np.ndarray | None:
    """The feature values (float64) of data rows ``rows`` of a plain CSV: each stride of rows
    holding one is read as bytes from its stored offset and split into lines; only the wanted
    lines are parsed. None if a line is missing or a value is not a number."""
    import io

    import pandas as pd

    assert plan.path is not None and plan.row_offsets is not None
    offsets = plan.row_offsets
    lines: list[bytes] = []
    with open_binary(plan.path) as f:
        for j in np.unique(rows // OFFSET_STRIDE).tolist():
            if j >= offsets.shape[0]:
                return None
            f.seek(int(offsets[j]))
            size = int(offsets[j + 1] - offsets[j]) if j + 1 < offsets.shape[0] else -1
            block = f.read(size).split(b"\n")
            for r in (rows[rows // OFFSET_STRIDE == j] - j * OFFSET_STRIDE).tolist():
                if r >= len(block) or not block[r].strip():
                    return None
                lines.append(block[r].rstrip(b"\r"))
    frame = pd.read_csv(io.BytesIO(b"\n".join(lines)), header=None, names=plan.columns,
                        usecols=plan.feature_columns)  # fmt: skip
    if len(frame) != rows.size:
        return None
    for col in plan.feature_columns:
        if not pd.api.types.is_numeric_dtype(frame[col].dtype):
            return None
    return frame.to_numpy(dtype=np.float64)  # as read_source_rows


def remap_groups(plan: SourcePlan, existing: list[str]) -> tuple[np.ndarray, list[str]]:
    """Group codes of every row of the source in the numbering of ``existing`` group names (new
    names appended), and the names after it."""
    names = list(existing)
    lookup = {nm: i for i, nm in enumerate(names)}
    for nm in plan.group_names:
        if nm not in lookup:
            lookup[nm] = len(names)
            names.append(nm)
    remap = np.array([lookup[nm] for nm in plan.group_names] or [0], dtype=np.int32)
    if not plan.group_names:
        return np.zeros(plan.n, np.int32), names
    return remap[source_groups(plan, 0, plan.n)].astype(np.int32), names
