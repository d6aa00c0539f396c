"""Row sources for ingest, planned: a source is inspected once, and its plan is what any job
reading a row range [a, b) of it needs (:mod:`fairpipe.datasets._source_rows` reads the rows).

A plan holds what is small and global (n, d, ids, group codes and names); the feature rows are
read chunk by chunk, so a chunk reader's memory is bounded by the chunk size. Sources: a ``.npy``
matrix (memory-mapped; optional groups and ids ``.npy``), CSV (optionally gzip-compressed) or
Parquet with feature columns and optional id and group columns, the ``gaussian`` generator, and
in-memory data sets (``digits`` and the real data sets' loaders).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

# The row stride is read as csv_scan.OFFSET_STRIDE: one value, wherever it is set.
from fairpipe.datasets import _csv_scan as csv_scan
from fairpipe.datasets import _loaders as loaders
from fairpipe.datasets._csv_scan import CSV_FIRST_LINE, ROW_COUNT, _header_fields, scan_csv
from fairpipe.datasets._parquet import (
    NO_PARQUET_FILES,
    _check_parquet_columns,
    _parquet_files,
    _read_parquet,
)
from fairpipe.datasets._remote import UrlPath, UrlUnreadable, is_url, list_url, url_size
from fairpipe.datasets._source_io import URL_UNREADABLE, SourcePath, open_binary
from fairpipe.errors import FairpipeInputError, check_positive_int, plain, subject
from fairpipe.neighbors import MAX_ROWS
from fairpipe.tables import csv_errors, parquet_errors
from fairpipe.tables import first_line as _first_line
from fairpipe.validation import EMPTY, NON_NUMERIC, check_unique_ids, load_npy, row_name

BUILTINS = ("digits", "gaussian")
NAMED_LOADERS = ("mnist", "word2vec", "adult", "bank", "census-kdd")
MISSING_COLUMN = "Column {col!r} ({role}) is not in {where}; its columns are {columns}."
MISSING_GROUP = "{at} has no value in the group column {col!r}."
MISSING_ID = "{at} has no value in the id column {col!r}."
LENGTH_MISMATCH = "{what} {path} holds {got} entries; the points file holds {n} rows."
NOT_A_LIST = "{what} {path} must hold one value per row (one dimension). Got shape {shape}."
NOT_A_MATRIX = "{where} must hold a 2-dimensional matrix. Got shape {shape}."
UNUSED_OPTION = "{flag} does not apply to {where}, {what}."
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
    table for a .npy matrix, .npy files of ids and groups for a table, any for a built-in; and
    a named data set's file that is not there (``mnist:PATH``)."""
    table = {"--group-column": group_column, "--id-column": id_column}
    npy = {"--groups-file": groups_file, "--ids-file": ids_file}
    name, _, arg = source.partition(":")
    suffixes = "".join(Path(source).suffixes[-2:]).lower()
    if name in NAMED_LOADERS and arg:
        loaders.existing(arg)
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
URL_KIND = (
    "Source {url}: expected a .parquet, .csv or .csv.gz object, or a prefix of Parquet files "
    "(a URL ending in /)."
)


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
        plan.row_offsets = offsets[: -(-n // csv_scan.OFFSET_STRIDE)]
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
