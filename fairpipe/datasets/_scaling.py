"""Feature scaling for ingest: each column centred and divided by its spread, so that columns in
units of their own (age in years, a weight in persons) weigh alike in a Euclidean distance.

- ``standard``: centre the mean, scale the standard deviation (scikit-learn's StandardScaler).
- ``robust``: centre the median, scale the interquartile range (RobustScaler); a column whose
  IQR is 0 (more than half its values equal: a rare flag) is scaled by its standard deviation.
- ``none``: the values as they are.

The scaler is fitted on a sample of the source (``SCALE_SAMPLE`` rows chosen by a hash of
(seed, id): :func:`fairpipe.neighbors.width_sample_rows`), so it depends on the data and the
seed, never on the file order, the chunking or the workers; the same sample, read once, gives
the LSH width its rows. :func:`apply_scaler` is the one arithmetic every scaled point goes
through (a stored row, a query given by value): its validated float32 values, scaled in
float64, rounded to float32, so a query equal to a source row lands on the stored point.

>>> S = np.array([[1.0, 10.0], [3.0, 30.0]])
>>> center, scale = fit_scaler(S, "standard", "x.csv", ["a", "b"], 2)
>>> apply_scaler(S, center, scale).tolist()
[[-1.0, -1.0], [1.0, 1.0]]
"""

from __future__ import annotations

import numpy as np

from fairpipe.errors import FairpipeInputError

# ``auto``: ``standard`` for a table (CSV, Parquet), whose columns have units of their own;
# ``none`` for a .npy matrix and the built-in data sets (one unit: pixels, embeddings, or
# standardised already).
TABLE_KINDS = ("csv", "parquet")
SCALE_SAMPLE = 20_000
# Spreads (standard deviations) of a source ingested unscaled that differ by more than this
# factor get a warning.
SPREAD_RATIO = 100.0

CONSTANT_COLUMN = (
    "Column {col} of {where} holds one value ({value}) in {rows}; --scale {method}{default} "
    "would divide it by 0. Remove the column, or ingest with --scale none."
)
WIDE_SPREADS = (
    "The columns of {where} spread {ratio:,.0f} times wider in {col_wide} (standard deviation "
    "{wide:.4g}) than in {col_narrow} ({narrow:.4g}), and are stored unscaled: distances are "
    "decided by the widest columns. Ingest into a new store with --scale standard (or robust) "
    "to weigh every column alike."
)


def resolve_scale(method: str, kind: str) -> str:
    """The scaling ``method`` (``auto`` resolved for a source of plan kind ``kind``)."""
    if method != "auto":
        return method
    return "standard" if kind in TABLE_KINDS else "none"


def column_name(names: list[str], j: int) -> str:
    """How messages name feature column ``j``: its name in a table, else its number from 1."""
    return repr(names[j]) if names else str(j + 1)


def fit_scaler(sample: np.ndarray, method: str, where: str, names: list[str], n_rows: int,
               by_default: bool = False) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(center, scale), float64 per column, of ``method`` (``standard`` or ``robust``) on the
    rows ``sample`` of ``where`` (of ``n_rows``; ``names``: its feature columns, if a table);
    raises naming a column that holds one value (``by_default``: the method was not asked for,
    ``auto`` chose it)."""
    S = np.asarray(sample, dtype=np.float64)
    std = S.std(axis=0)
    if method == "standard":
        center, scale = S.mean(axis=0), std
    else:
        q25, center, q75 = np.percentile(S, [25.0, 50.0, 75.0], axis=0)
        scale = q75 - q25
        scale = np.where(scale > 0, scale, std)
    if not (scale > 0).all():
        j = int(np.argmin(scale > 0))
        rows = "every row" if S.shape[0] >= n_rows else f"all {S.shape[0]:,} sampled rows"
        raise FairpipeInputError(CONSTANT_COLUMN.format(
            col=column_name(names, j), where=where, value=f"{S[0, j]:.6g}", rows=rows,
            method=method, default=" (a table's default)" if by_default else ""))  # fmt: skip
    return center, scale


def apply_scaler(X: np.ndarray, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(X - center) / scale`` in float64, as a C-contiguous float32 matrix."""
    out = (np.asarray(X, dtype=np.float64) - center) / scale
    return np.ascontiguousarray(out, dtype=np.float32)


def spread_warning(sample: np.ndarray, where: str, names: list[str]) -> str | None:
    """The warning for the unscaled rows ``sample`` of ``where`` whose columns' spreads differ
    by more than SPREAD_RATIO (None where they do not; constant columns do not count)."""
    std = np.asarray(sample, dtype=np.float64).std(axis=0)
    moving = np.flatnonzero(std > 0)
    if moving.size < 2:
        return None
    wide, narrow = moving[np.argmax(std[moving])], moving[np.argmin(std[moving])]
    ratio = std[wide] / std[narrow]
    if ratio <= SPREAD_RATIO:
        return None
    return WIDE_SPREADS.format(where=where, ratio=ratio, col_wide=f"column {column_name(names, wide)}",
                               wide=std[wide], col_narrow=f"column {column_name(names, narrow)}",
                               narrow=std[narrow])  # fmt: skip
