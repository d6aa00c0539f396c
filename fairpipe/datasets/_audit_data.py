"""Tabular data for fairness testing, encoded as ADF does: every attribute a bounded integer.

Each data set has its own domains (the released ADF code used the census bounds for every data
set). Numbers are binned with fixed rules, so the domain does not depend on the rows present:

- **adult** (UCI Adult, 13 attributes as ADF's census): age in decades (1-9), fnlwgt in 20
  quantile bins, capital gain and loss as floor(log2(1 + x)) (0-17), hours per week in decades
  (0-9), the categorical columns as codes in sorted order; label income > 50K. Protected: age,
  race, sex. Rows with a missing value ('?') are dropped, as in ADF.
- **german** (Statlog German Credit, 20 attributes): the A-codes as their number within the
  attribute, duration in half-years (0-12), credit amount in 10 quantile bins, age in decades
  (1-7), sex from personal status (0 male, 1 female) in place of it; label good credit. Protected:
  age, sex.
- **bank** (Bank Marketing, 16 attributes): age in decades (1-9), balance and duration in 10
  quantile bins, day in 5-day bins (0-6), campaign and previous capped at 10, pdays as -1 -> 0 else
  1 + floor(pdays / 100) (0-9), the categorical columns as codes; label subscribed. Protected: age.
- **a CSV path**: every column already an integer, the label in a column named ``label``; the
  domain of each attribute is the range seen in the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairpipe.audit import Domain
from fairpipe.datasets._loaders import ADULT_COLUMNS
from fairpipe.errors import FairpipeInputError, plain
from fairpipe.tables import read_csv_table
from fairpipe.validation import text_row_name

PROTECTED = {"adult": ("age", "race", "sex"), "german": ("age", "sex"), "bank": ("age",)}
MISSING_VALUE = "{At} has no value in column {col!r}; {why}."
NOT_NUMBER = "{At} has {value} in column {col!r}; {rule}."
NO_LABEL = "{path} has no column 'label'; its columns are {columns}."
TOO_FEW_COLUMNS = "{path} has {got} columns; the {name} data set has {expected}."
NO_COLUMN = "{path} has no column {col!r}; the {name} data set needs it."
NO_FILE = "Data file {path} does not exist."


@dataclass
class AuditData:
    X: np.ndarray  # (n, d) int64 within the domain
    y: np.ndarray  # (n,) int64 labels 0/1
    domain_names: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    name: str

    def domain(self, protected) -> Domain:
        return Domain.make(self.domain_names, self.lower, self.upper, list(protected))


def _read_csv(path, **kw):
    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(NO_FILE.format(path=path))
    frame = read_csv_table(p, **kw)  # not UTF-8, not CSV: one error naming the file
    # How its rows are found in its lines, for messages naming a row (_row_of).
    frame.attrs["text"] = {"header": kw.get("header", "infer") is not None,
                           "comment": kw.get("comment")}  # fmt: skip
    return frame


def _row_of(frame, row, path) -> str:
    """The data row labelled ``row`` as a message's subject: "Line 7 of adult.data"."""
    at = text_row_name(path, int(row), **frame.attrs.get("text", {}))
    return at[:1].upper() + at[1:]


def _numbers(frame, col, path, integer: bool = True, rule: str | None = None,
             missing_why: str = "the encoding needs a number") -> np.ndarray:  # fmt: skip
    """A column that the encoding reads as numbers, or an error naming the first bad row (its
    label in ``frame.index``, the row of the file)."""
    import pandas as pd

    v = frame[col]
    missing = v.isna().to_numpy()
    if missing.any():
        row = frame.index[int(np.argmax(missing))]
        raise FairpipeInputError(
            MISSING_VALUE.format(At=_row_of(frame, row, path), col=col, why=missing_why)
        )
    values = pd.to_numeric(v, errors="coerce").to_numpy(dtype=float)
    bad = np.isnan(values) | (values % 1 != 0 if integer else ~np.isfinite(values))
    if bad.any():
        i = int(np.argmax(bad))
        rule = rule or f"the encoding needs {'an integer' if integer else 'a number'} there"
        raise FairpipeInputError(
            NOT_NUMBER.format(
                At=_row_of(frame, frame.index[i], path), value=plain(v.iloc[i]), col=col, rule=rule
            )
        )
    return values.astype(np.int64) if integer else values


def _codes(series) -> tuple[np.ndarray, int]:
    names = sorted(series.astype(str).unique().tolist())
    return series.astype(str).map({n: i for i, n in enumerate(names)}).to_numpy(np.int64), len(
        names
    )


def _quantile_bins(x: np.ndarray, bins: int) -> np.ndarray:
    edges = np.unique(np.quantile(x, np.linspace(0, 1, bins + 1)[1:-1]))
    return np.searchsorted(edges, x, side="right").astype(np.int64)


def _build(name, columns: list[tuple[str, np.ndarray, int, int]], y) -> AuditData:
    X = np.stack([np.clip(v, lo, hi) for _, v, lo, hi in columns], axis=1).astype(np.int64)
    return AuditData(
        X=X,
        y=np.asarray(y, dtype=np.int64),
        domain_names=tuple(c[0] for c in columns),
        lower=np.array([c[2] for c in columns], dtype=np.int64),
        upper=np.array([c[3] for c in columns], dtype=np.int64),
        name=name,
    )


def load_audit_adult(path) -> AuditData:
    """UCI Adult encoded for fairness testing (13 integer attributes, label income > 50K)."""
    frame = _read_csv(path, header=None, names=ADULT_COLUMNS, skipinitialspace=True,
                      na_values="?", comment="|")  # fmt: skip
    if frame.shape[1] != len(ADULT_COLUMNS) or frame[ADULT_COLUMNS[-1]].isna().all():
        got = int(frame.notna().any().sum())
        raise FairpipeInputError(
            TOO_FEW_COLUMNS.format(path=path, got=got, name="adult", expected=len(ADULT_COLUMNS))
        )
    frame = frame.dropna()  # rows with a '?' (ADF drops them too); the index keeps the file's rows
    cols = []
    for c in ADULT_COLUMNS:
        if c in ("income", "education_num"):
            continue
        v = frame[c]
        if c == "age":
            cols.append((c, _numbers(frame, c, path) // 10, 1, 9))
        elif c == "fnlwgt":
            cols.append((c, _quantile_bins(_numbers(frame, c, path, False), 20), 0, 19))
        elif c in ("capital_gain", "capital_loss"):
            x = np.maximum(_numbers(frame, c, path, False), 0.0)
            cols.append((c, np.floor(np.log2(1 + x)).astype(np.int64), 0, 17))
        elif c == "hours_per_week":
            cols.append((c, _numbers(frame, c, path) // 10, 0, 9))
        else:
            codes, n = _codes(v)
            cols.append((c, codes, 0, n - 1))
    y = frame["income"].astype(str).str.contains(">50K").to_numpy()
    return _build("adult", cols, y)


GERMAN_COLUMNS = [
    "status", "duration", "credit_history", "purpose", "credit_amount", "savings",
    "employment", "installment_rate", "sex", "other_debtors", "residence_since", "property",
    "age", "other_installments", "housing", "existing_credits", "job", "people_liable",
    "telephone", "foreign_worker",
]  # fmt: skip
GERMAN_NUMERIC = ("installment_rate", "residence_since", "existing_credits", "people_liable")


def load_audit_german(path) -> AuditData:
    """Statlog German Credit encoded for fairness testing (20 integer attributes)."""
    frame = _read_csv(path, sep=" ", header=None)
    if frame.shape[1] != len(GERMAN_COLUMNS) + 1:
        raise FairpipeInputError(
            TOO_FEW_COLUMNS.format(path=path, got=frame.shape[1], name="german", expected=21)
        )
    frame.columns = [*GERMAN_COLUMNS, "label"]
    cols = []
    for c in GERMAN_COLUMNS:
        v = frame[c]
        if c == "sex":  # personal status A91-A95: A92 and A95 are female
            cols.append((c, v.isin(["A92", "A95"]).to_numpy().astype(np.int64), 0, 1))
        elif c == "duration":
            cols.append((c, _numbers(frame, c, path) // 6, 0, 12))
        elif c == "credit_amount":
            cols.append((c, _quantile_bins(_numbers(frame, c, path, False), 10), 0, 9))
        elif c == "age":
            cols.append((c, _numbers(frame, c, path) // 10, 1, 7))
        elif c in GERMAN_NUMERIC:
            x = _numbers(frame, c, path)
            cols.append((c, x, int(x.min()), int(x.max())))
        else:
            codes, n = _codes(v)
            cols.append((c, codes, 0, n - 1))
    return _build("german", cols, (_numbers(frame, "label", path) == 1))


def load_audit_bank(path) -> AuditData:
    """Bank Marketing encoded for fairness testing (16 integer attributes, label subscribed)."""
    frame = _read_csv(path, sep=None, engine="python")
    for c in ["age", "balance", "duration", "day", "campaign", "previous", "pdays", "y"]:
        if c not in frame.columns:
            raise FairpipeInputError(NO_COLUMN.format(path=path, col=c, name="bank"))
    cols = []
    for c in frame.columns:
        if c == "y":
            continue
        v = frame[c]
        if c == "age":
            cols.append((c, _numbers(frame, c, path) // 10, 1, 9))
        elif c in ("balance", "duration"):
            cols.append((c, _quantile_bins(_numbers(frame, c, path, False), 10), 0, 9))
        elif c == "day":
            cols.append((c, _numbers(frame, c, path) // 5, 0, 6))
        elif c in ("campaign", "previous"):
            cols.append((c, np.minimum(_numbers(frame, c, path), 10), 0, 10))
        elif c == "pdays":
            p = _numbers(frame, c, path)
            cols.append((c, np.where(p < 0, 0, 1 + p // 100), 0, 9))
        else:
            codes, n = _codes(v)
            cols.append((c, codes, 0, n - 1))
    return _build("bank", cols, (frame["y"].astype(str) == "yes").to_numpy())


def load_audit_csv(path) -> AuditData:
    """A CSV of integer attributes with a ``label`` column; domains from the file's ranges."""
    frame = _read_csv(path)
    if "label" not in frame.columns:
        raise FairpipeInputError(NO_LABEL.format(path=path, columns=list(frame.columns)))
    values = {
        c: _numbers(frame, c, path, rule="every attribute must be an integer",
                    missing_why="the encoding needs integers")
        for c in frame.columns
    }  # fmt: skip
    cols = [(str(c), x, int(x.min()), int(x.max())) for c, x in values.items() if c != "label"]
    return _build(Path(path).stem, cols, values["label"])


# The repository's parent holds ``shared/data`` (fairpipe/datasets/_audit_data.py -> parents[3]).
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
LOADERS = {
    "adult": (load_audit_adult, ("adult", "adult.data.gz")),
    "german": (load_audit_german, ("german", "german.data")),
    "bank": (load_audit_bank, ("bank", "bank-full.csv.gz")),
}


def load_audit_data(name_or_path: str, data_dir: str | Path | None = None) -> AuditData:
    """'adult', 'german', 'bank' (from ``data_dir``; by default the folder ``shared/data`` beside
    the repository, where the test suite finds the real data sets), the same with a path of the
    original file ('adult:PATH'), or an integer CSV path."""
    name, sep, path = name_or_path.partition(":")
    if name in LOADERS:
        loader, parts = LOADERS[name]
        if sep:
            return loader(path)
        base = Path(data_dir) if data_dir else DEFAULT_DATA_DIR
        return loader(base.joinpath(*parts))
    return load_audit_csv(name_or_path)
