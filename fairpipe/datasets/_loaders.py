"""Built-in and real data sets as (points, groups, group_names, ids) in memory.

Built-ins need no download: ``digits`` (scikit-learn's bundled 8x8 digits, group = label) and
``gaussian`` (a deterministic Gaussian mixture). Loaders for the real data sets take a path, so
users can point them at their own copy.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError, check_positive_int, plain
from fairpipe.tables import read_csv_table
from fairpipe.validation import text_row_name

NOT_NUMBERS = "{At} holds {value} in column {col!r}, which must hold numbers."
WORD2VEC_TOO_SHORT = (
    "{path}: its first line announces {n} vectors of {d} values, more than its {size:,} bytes hold."
)
GZIP_MOST = 1032  # the most bytes a gzip stream gives per byte

GAUSSIAN_BLOCK = 4096


@dataclass
class Dataset:
    points: np.ndarray  # (n, d) float32
    groups: np.ndarray | None  # (n,) int32 codes into group_names
    group_names: list[str]
    ids: np.ndarray | None = None
    name: str = ""


def _open(path: str | Path):
    path = existing(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _numbers(frame, columns: list, path, header: bool = True,
             comment: str | None = None) -> np.ndarray:  # fmt: skip
    """The ``columns`` of a data set's table as float64, or an error naming the first value that
    is not a number (its column, and its line in the file ``path``)."""
    import pandas as pd

    for col in columns:
        values = frame[col]
        if pd.api.types.is_numeric_dtype(values.dtype):
            continue
        bad = (pd.to_numeric(values, errors="coerce").isna() & values.notna()).to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            at = text_row_name(path, row, header=header, comment=comment)
            raise FairpipeInputError(NOT_NUMBERS.format(
                col=col, At=at[:1].upper() + at[1:], value=plain(values.iloc[row])))  # fmt: skip
    return frame[columns].to_numpy(dtype=np.float64)


def existing(path: str | Path) -> Path:
    """``path``, a named data set's file; an error naming it where there is none."""
    path = Path(path)
    if not path.exists():
        raise FairpipeInputError(f"Data file {str(path)!r} does not exist.")
    return path


def load_digits() -> Dataset:
    """scikit-learn's bundled handwritten digits: 1,797 points in 64 dimensions, group = digit."""
    from sklearn.datasets import load_digits as _load

    data = _load()
    return Dataset(
        points=data.data.astype(np.float32),
        groups=data.target.astype(np.int32),
        group_names=[str(i) for i in range(10)],
        name="digits",
    )


def gaussian_block(seed: int, block: int, n: int, d: int, clusters: int, groups: int):
    """Rows [block * GAUSSIAN_BLOCK, ...) of the ``gaussian`` data set (independent of chunking)."""
    start = block * GAUSSIAN_BLOCK
    rows = min(GAUSSIAN_BLOCK, n - start)
    centres = np.random.default_rng(np.random.SeedSequence([seed, 0xCE])).normal(
        0.0, 6.0, size=(clusters, d)
    )
    rng, comp = _gaussian_components(seed, block, rows, clusters)
    spread = 0.5 + comp / max(clusters - 1, 1)
    # centres[comp] + normal * spread, in float64 then rounded to float32, computed in place
    # (the same bits as the expression, with two temporaries fewer).
    X = rng.normal(size=(rows, d))
    X *= spread[:, None]
    X += centres[comp]
    return X.astype(np.float32), (comp % groups).astype(np.int32)


def _gaussian_components(seed: int, block: int, rows: int, clusters: int):
    """(the block's generator, each row's mixture component): the components are its first draw,
    so the groups of a block cost no normal draws (:func:`gaussian_block_groups`)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB0, block]))
    # Unequal cluster weights and spreads give dense and sparse regions (what makes LSH unfair).
    weights = np.arange(1, clusters + 1, dtype=float)
    return rng, rng.choice(clusters, size=rows, p=weights / weights.sum())


def gaussian_block_groups(seed: int, block: int, n: int, clusters: int, groups: int):
    """The groups of :func:`gaussian_block` (the same values), without generating its points."""
    rows = min(GAUSSIAN_BLOCK, n - block * GAUSSIAN_BLOCK)
    return (_gaussian_components(seed, block, rows, clusters)[1] % groups).astype(np.int32)


def load_gaussian(
    n: int = 20_000, d: int = 16, clusters: int = 8, groups: int = 4, seed: int = 0
) -> Dataset:
    """A deterministic Gaussian mixture; group = component modulo ``groups``."""
    for name, value in (("n", n), ("d", d), ("clusters", clusters), ("groups", groups)):
        check_positive_int(value, name, "load_gaussian")
    blocks = [
        gaussian_block(seed, b, n, d, clusters, groups)
        for b in range((n + GAUSSIAN_BLOCK - 1) // GAUSSIAN_BLOCK)
    ]
    return Dataset(
        points=np.concatenate([b[0] for b in blocks]),
        groups=np.concatenate([b[1] for b in blocks]),
        group_names=[f"g{i}" for i in range(groups)],
        name="gaussian",
    )


def load_mnist_csv(path: str | Path) -> Dataset:
    """MNIST in CSV (784 pixel columns then the label; optional .gz), group = digit."""

    frame = read_csv_table(existing(path), header=None)
    if frame.shape[1] != 785:
        raise FairpipeInputError(
            f"{path}: an MNIST CSV has 785 columns (784 pixels and the label). Got {frame.shape[1]}."
        )
    values = _numbers(frame, list(frame.columns), path, header=False)
    return Dataset(
        points=values[:, :784].astype(np.float32),
        groups=values[:, 784].astype(np.int32),
        group_names=[str(i) for i in range(10)],
        name="mnist",
    )


def load_word2vec_bin(path: str | Path, limit: int | None = None) -> tuple[Dataset, list[str]]:
    """word2vec binary format: a line ``n d``, then per word its bytes, a space, d float32s."""
    with _open(path) as fh:
        header = fh.readline().split()
        n = d = 0
        if len(header) == 2 and all(v.isdigit() for v in header):
            n, d = int(header[0]), int(header[1])
        if n < 1 or d < 1:
            raise FairpipeInputError(f"{path}: the first line of a word2vec file is 'n d'.")
        n = n if limit is None else min(n, limit)
        # Each vector takes 4 d bytes: a header announcing more than the file can hold is
        # refused before the array is made (a gzip holds at most 1032 times its size).
        size = Path(path).stat().st_size
        if 4 * n * d > size * (GZIP_MOST if Path(path).suffix == ".gz" else 1):
            raise FairpipeInputError(WORD2VEC_TOO_SHORT.format(path=path, n=n, d=d, size=size))
        words, vectors = [], np.empty((n, d), dtype=np.float32)
        for i in range(n):
            word = bytearray()
            while True:
                ch = fh.read(1)
                if ch == b" " or ch == b"":
                    break
                if ch != b"\n":
                    word.extend(ch)
            raw = fh.read(4 * d)
            if len(raw) != 4 * d:
                raise FairpipeInputError(
                    f"{path}: vector {i} ends early ({len(raw)} of {4 * d} bytes)."
                )
            vectors[i] = np.frombuffer(raw, dtype="<f4")
            words.append(word.decode("utf-8", errors="replace"))
    return Dataset(points=vectors, groups=None, group_names=[], name="word2vec"), words


ADULT_COLUMNS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education_num",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
    "native_country",
    "income",
]
ADULT_NUMERIC = ["age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"]


def load_adult(path: str | Path, group: str = "sex") -> Dataset:
    """UCI Adult (adult.data or adult.test, optional .gz): the six numeric columns, standardised,
    as points; ``group`` (a categorical column such as sex or race) as the group. Rows with a
    missing value ('?') are dropped."""

    if group not in ADULT_COLUMNS:
        raise FairpipeInputError(f"Adult has no column {group!r}; columns are {ADULT_COLUMNS}.")
    frame = read_csv_table(existing(path), header=None, names=ADULT_COLUMNS,
                           skipinitialspace=True, na_values="?", comment="|")  # fmt: skip
    _numbers(frame, ADULT_NUMERIC, path, header=False, comment="|")
    frame = frame.dropna().reset_index(drop=True)
    X = frame[ADULT_NUMERIC].to_numpy(dtype=np.float64)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    names = sorted(frame[group].astype(str).unique().tolist())
    codes = frame[group].astype(str).map({nm: i for i, nm in enumerate(names)}).to_numpy()
    return Dataset(
        points=X.astype(np.float32), groups=codes.astype(np.int32), group_names=names, name="adult"
    )


# El Halabi et al.'s age groups: [0,29], [30,39], ..., [60,69], 70+.
AGE_EDGES = [30, 40, 50, 60, 70]
AGE_NAMES = ["0-29", "30-39", "40-49", "50-59", "60-69", "70+"]
BANK_NUMERIC = ["age", "balance", "day", "duration", "campaign", "pdays", "previous"]
# Census-Income KDD: age, wage per hour, capital gains, capital losses, dividends, persons worked
# for employer, weeks worked in year.
CENSUS_KDD_NUMERIC = [0, 5, 16, 17, 18, 30, 39]


def _age_colours(points: np.ndarray, age: np.ndarray, name: str) -> Dataset:
    X = (points - points.mean(axis=0)) / points.std(axis=0)
    codes = np.digitize(age, AGE_EDGES).astype(np.int32)
    return Dataset(points=X.astype(np.float32), groups=codes, group_names=AGE_NAMES, name=name)


def load_bank(path: str | Path) -> Dataset:
    """UCI Bank Marketing (bank-full.csv, ';' or ',' separated, optional .gz): the seven numeric
    columns, standardised, as points; six age groups (0-29, ..., 70+) as the group."""

    frame = read_csv_table(existing(path), sep=None, engine="python")
    missing = [c for c in BANK_NUMERIC if c not in frame.columns]
    if missing:
        raise FairpipeInputError(
            f"{str(path)!r} has no column {missing[0]!r}; Bank Marketing's numeric columns are "
            f"{BANK_NUMERIC}."
        )
    X = _numbers(frame, BANK_NUMERIC, path)
    return _age_colours(X, frame["age"].to_numpy(), "bank")


def load_census_kdd(path: str | Path) -> Dataset:
    """UCI Census-Income (KDD) (no header, ', ' separated, optional .gz): seven numeric columns,
    standardised, as points; six age groups (0-29, ..., 70+) as the group."""

    frame = read_csv_table(existing(path), header=None, usecols=CENSUS_KDD_NUMERIC,
                           skipinitialspace=True)  # fmt: skip
    X = _numbers(frame, CENSUS_KDD_NUMERIC, path, header=False)
    return _age_colours(X, frame[0].to_numpy(), "census-kdd")
