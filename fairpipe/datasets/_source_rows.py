"""Reads a planned source's rows: any row range [a, b), validated (errors name rows of the whole
source), a sample of rows (read alone where the source allows), and the rows' group codes.
"""

from __future__ import annotations

import re

import numpy as np

# The row stride is read as csv_scan.OFFSET_STRIDE: one value, wherever it is set.
from fairpipe.datasets import _csv_scan as csv_scan
from fairpipe.datasets import _loaders as loaders
from fairpipe.datasets._csv_scan import CSV_FIRST_LINE, FIELD_COUNT
from fairpipe.datasets._scaling import apply_scaler
from fairpipe.datasets._source_io import _source_path, open_binary
from fairpipe.datasets._sources import SourcePlan, _read_table
from fairpipe.errors import FairpipeInputError, plain
from fairpipe.tables import NOT_CSV
from fairpipe.tables import first_line as _first_line
from fairpipe.validation import check_points, row_name

NON_NUMERIC_COLUMN = (
    "Feature column {col!r} of {where} is not numeric ({at} holds {value}); "
    "name it with --group-column or --id-column, or remove it."
)


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
        if plan.row_offsets is not None and a // csv_scan.OFFSET_STRIDE < plan.row_offsets.shape[0]:
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
    j = a // csv_scan.OFFSET_STRIDE
    with open_binary(plan.path) as f:
        f.seek(int(plan.row_offsets[j]))
        try:
            return pd.read_csv(f, header=None, names=plan.columns, usecols=plan.feature_columns,
                               skiprows=a - j * csv_scan.OFFSET_STRIDE, nrows=b - a)  # fmt: skip
        except pd.errors.ParserError as why:  # a quoted file's fields are not counted ahead
            # pandas counts lines from the offset: its line 1 is data row j * STRIDE.
            found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(why))
            if found is None:
                raise FairpipeInputError(NOT_CSV.format(where=plan.where,
                                                        why=_first_line(why))) from None  # fmt: skip
            expected, line, got = map(int, found.groups())
            raise FairpipeInputError(FIELD_COUNT.format(
                line=j * csv_scan.OFFSET_STRIDE + CSV_FIRST_LINE - 1 + line, where=plan.where, got=got,
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
        for j in np.unique(rows // csv_scan.OFFSET_STRIDE).tolist():
            if j >= offsets.shape[0]:
                return None
            f.seek(int(offsets[j]))
            size = int(offsets[j + 1] - offsets[j]) if j + 1 < offsets.shape[0] else -1
            block = f.read(size).split(b"\n")
            for r in (
                rows[rows // csv_scan.OFFSET_STRIDE == j] - j * csv_scan.OFFSET_STRIDE
            ).tolist():
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
