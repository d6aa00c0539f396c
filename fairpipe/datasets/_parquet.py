"""Reads Parquet sources: a file's rows, row group by row group, or a data set's files (a folder,
or a prefix of objects) listed and checked (the same columns, one value per row in each).
"""

from __future__ import annotations

from pathlib import Path

from fairpipe.datasets._remote import UrlPath, UrlUnreadable, list_url
from fairpipe.datasets._source_io import URL_UNREADABLE, SourcePath, _source_path, open_binary
from fairpipe.errors import FairpipeInputError
from fairpipe.tables import NOT_PARQUET, check_flat_columns, parquet_errors
from fairpipe.tables import first_line as _first_line

NO_PARQUET_FILES = "Source {where} holds no Parquet files (.parquet, .pq)."
NOT_SAME_COLUMNS = (
    "{file} has the columns {columns}; the first file of {where} has {first}. The files of a "
    "Parquet data set must have the same columns."
)


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
