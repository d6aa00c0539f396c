"""Validation of user-supplied arrays, with messages that name the row and the field."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError, plain
from fairpipe.jsontext import MAX_JSON_BYTES, JSONTextError, parse_json
from fairpipe.number_text import NOT_A_NUMBER, flaw, read_integer

NOT_2D = "{where} expects a 2-dimensional matrix of points. Got an array of shape {shape}."
WRONG_DIM = (
    "{where}: the points have {got} values per row; {expected}-dimensional points were expected."
)
NON_FINITE = "{at} holds {what} in column {col}; points must be finite numbers."
EMPTY = "{where} holds no rows; at least one point is needed."
NON_NUMERIC = "{where} must hold real numbers. Got values of type {dtype}."
DUPLICATE_ID = "Id {id} appears more than once in {where} ({rows}); ids must be unique."


def row_name(row: int, where: str, first_line: int | None = None) -> str:
    """How messages name the 0-based data row ``row`` of ``where``: its line in a text file
    whose row 0 is on line ``first_line`` ("line 19 of good.csv"), else its row counted from 1
    ("row 18 of good.npy")."""
    if first_line is None:
        return f"row {row + 1} of {where}"
    return f"line {row + first_line} of {where}"


def text_row_name(path, row: int, header: bool = True, comment: str | None = None) -> str:
    """How messages name the data row ``row`` (0-based, as pandas numbers the rows of a text
    table: blank lines, and lines starting with ``comment``, skipped) of the file ``path``: its
    line ("line 19 of people.csv"), found by reading the lines up to it; or its row counted from 1
    where a quote may hold a line break ("row 18 of people.csv")."""
    import gzip

    name = Path(path).name
    rows = -1 if header else 0  # the header is the first line with content
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                if '"' in line:
                    break
                text = line.strip()
                if not text or (comment is not None and text.startswith(comment)):
                    continue
                if rows == row:
                    return f"line {number} of {name}"
                rows += 1
    except OSError:
        pass
    return row_name(row, name)


def check_points(
    X: np.ndarray,
    where: str,
    n_features: int | None = None,
    row_offset: int = 0,
    column_names: list[str] | None = None,
    first_line: int | None = None,
) -> np.ndarray:
    """Return ``X`` as a C-contiguous float32 matrix, or raise naming the first bad row.

    ``row_offset`` is added to reported row numbers, so a chunk can report rows of the whole file;
    rows are counted from 1, or named by their line in a text file whose row 0 is on line
    ``first_line``; ``column_names`` (of a table) name the bad column, else its position (from 1).

    >>> check_points(np.array([[1.0, np.nan]]), where="points.npy")
    Traceback (most recent call last):
    ...
    fairpipe.errors.FairpipeInputError: Row 1 of points.npy holds a NaN value in column 2; points must be finite numbers.
    """
    X = np.asarray(X)
    if X.dtype.kind not in "biuf":  # not complex: its imaginary parts would be dropped
        raise FairpipeInputError(NON_NUMERIC.format(where=where, dtype=X.dtype))
    if X.ndim != 2:
        raise FairpipeInputError(NOT_2D.format(where=where, shape=X.shape))
    if X.shape[0] == 0:
        raise FairpipeInputError(EMPTY.format(where=where))
    if n_features is not None and X.shape[1] != n_features:
        raise FairpipeInputError(WRONG_DIM.format(where=where, got=X.shape[1], expected=n_features))
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    finite = np.isfinite(X32)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        value = X32[row, col]
        if np.isnan(value):
            what = "a NaN value"
        else:
            what = "an inf value" if value > 0 else "a -inf value"
        if np.isfinite(X[row, col]):
            what = f"a value too large for float32 ({plain(X[row, col])})"
        col_text = f"{int(col) + 1}" if column_names is None else repr(column_names[col])
        at = row_name(int(row) + row_offset, where, first_line)
        raise FairpipeInputError(
            NON_FINITE.format(at=at[:1].upper() + at[1:], what=what, col=col_text)
        )
    return X32


# -- ids: one rule for every way ids come in ------------------------------------------------------
# Ids are integers from 0 to MAX_ID: stored as int64, with -1 the padding of stored id arrays.
# An id may be written with a decimal point and zeros ("100300.0", as spreadsheets and pandas
# write an integer column with a gap): it is the same id everywhere (ingest, forget, request
# files). Never with an exponent ("1.003E+05": spreadsheets write long ids so after rounding
# them). A binary float (a float column of Parquet or .npy) is an id only up to MAX_FLOAT_ID,
# where floats still hold every integer: above it, the id may already be another person's.
MAX_ID = 2**63 - 1
MAX_FLOAT_ID = 2**53
ID_RULE = f"ids are integers from 0 to {MAX_ID}"
BAD_ID = "Id {value} {where} {problem}; " + ID_RULE + "."
NOT_AN_INTEGER = "is not an integer"
NEGATIVE = "is negative"
EXPONENT = "is written with an exponent (spreadsheets write long ids so after rounding them)"
TOO_LARGE = "is too large"
ROUNDED_FLOAT = (
    f"is a float above 2^53 ({MAX_FLOAT_ID}), which may be a rounded id: store ids as integers"
)
NO_ID = "{Where} has no id"
IDS_TYPE = "Ids in {where} must be integers. Got values of type {dtype}."
IDS_SHAPE = "Ids in {where} must be a list (one dimension). Got an array of shape {shape}."
_WHOLE = re.compile(r"(.*[0-9])\.0*")  # "100300.0": the integer before the zeros
_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")


def id_from_text(token: str) -> tuple[int | None, str]:
    """(the id a token of text names, "") or (None, why it names none): the text rule of ids."""
    t = token.strip(" \t")  # the spaces a list or a table puts around its fields
    whole = _WHOLE.fullmatch(t)
    value = read_integer(whole.group(1) if whole else t)  # ASCII digits only
    if value is None:
        number = _NUMBER.fullmatch(t)
        if number and number.group(2):
            return None, EXPONENT
        problem = flaw(t)
        return None, NOT_AN_INTEGER if problem == NOT_A_NUMBER else problem
    return _in_range(value)


def _in_range(value: int) -> tuple[int | None, str]:
    if value < 0:
        return None, NEGATIVE
    if value > MAX_ID:
        return None, TOO_LARGE
    return value, ""


def _id_of(x) -> tuple[int | None, str]:
    """The id a Python value is, or (None, why not)."""
    if isinstance(x, bool):
        return None, NOT_AN_INTEGER
    if isinstance(x, int):
        return _in_range(x)
    if isinstance(x, float):
        if not (math.isfinite(x) and x == math.floor(x)):
            return None, NOT_AN_INTEGER
        if x > MAX_FLOAT_ID:
            return None, ROUNDED_FLOAT
        return _in_range(int(x))
    if isinstance(x, bytes):
        x = x.decode("utf-8", errors="replace")
    if isinstance(x, str):
        return id_from_text(x)
    return None, NOT_AN_INTEGER


def is_number_text(token: str) -> bool:
    """Whether ``token`` is written as a number (a CSV's first field: an id, not a header)."""
    return _NUMBER.fullmatch(token.strip()) is not None


def show_id(x) -> str:
    """An offending id as a message shows it: numbers plainly, other text quoted."""
    if isinstance(x, bytes):
        x = x.decode("utf-8", errors="replace")
    if isinstance(x, str):
        return x.strip() if is_number_text(x) else repr(x.strip())
    return plain(x)


def bad_id(value, where: str, problem: str) -> FairpipeInputError:
    """The error for an id that breaks the rule (``where``: "in --ids", "on line 3 of a.txt")."""
    return FairpipeInputError(BAD_ID.format(value=show_id(value), where=where, problem=problem))


def check_ids(values, where: str, locate: Callable[[int], str] | None = None) -> np.ndarray:
    """``values`` (integers, floats, or text) as int64 ids, or an error naming the first value
    that is not an id by the rule above. ``where`` names the list ("ids.npy", "DCKMeans.fit");
    ``locate(i)`` says where its i-th value is ("on line 7 of a.csv"; default: its 1-based row).

    >>> check_ids(np.array([3.0, 100300.0]), "ids.npy").tolist()
    [3, 100300]
    >>> check_ids(np.array([2**63], dtype=np.uint64), "ids.npy")
    Traceback (most recent call last):
    ...
    fairpipe.errors.FairpipeInputError: Id 9223372036854775808 in row 1 of ids.npy is too large; ids are integers from 0 to 9223372036854775807.
    """
    if locate is None:

        def locate(i: int) -> str:
            return f"in row {i + 1} of {where}"

    arr = as_id_array(values)
    if arr.ndim != 1:
        raise FairpipeInputError(IDS_SHAPE.format(where=where, shape=arr.shape))
    kind = arr.dtype.kind
    if kind == "i":
        if arr.size and arr.min() < 0:
            i = int(np.argmax(arr < 0))
            raise bad_id(arr[i], locate(i), NEGATIVE)
        return arr.astype(np.int64, copy=False)
    if kind == "u":
        if arr.size and arr.max() > MAX_ID:
            i = int(np.argmax(arr > MAX_ID))
            raise bad_id(arr[i], locate(i), TOO_LARGE)
        return arr.astype(np.int64)
    if kind == "f":
        with np.errstate(invalid="ignore"):
            good = (arr == np.floor(arr)) & (arr >= 0) & (arr <= MAX_FLOAT_ID)
        if not good.all():
            i = int(np.argmin(good))
            number = float(arr[i])
            if math.isnan(number):
                raise FairpipeInputError(NO_ID.format(Where=_capital(locate(i))) + ".")
            raise bad_id(number, locate(i), _id_of(number)[1] or NOT_AN_INTEGER)
        return arr.astype(np.int64)
    if kind in "OUS":
        out = np.empty(arr.shape[0], dtype=np.int64)
        for i, x in enumerate(arr.tolist()):
            if x is None or (isinstance(x, float) and math.isnan(x)):
                raise FairpipeInputError(NO_ID.format(Where=_capital(locate(i))) + ".")
            value, problem = _id_of(x)
            if value is None:
                raise bad_id(x, locate(i), problem)
            out[i] = value
        return out
    raise FairpipeInputError(IDS_TYPE.format(where=where, dtype=arr.dtype))


def as_id_array(values) -> np.ndarray:
    """``values`` as an array :func:`check_ids` checks exactly (Python ints that no one numpy
    integer type holds are kept as objects, never made floats)."""
    if isinstance(values, np.ndarray):
        return values
    arr = np.asarray(values)
    if arr.dtype.kind in "fu" and arr.size:
        # Python ints numpy could not give one integer type (a negative one and one above
        # int64): checked one by one, never through a float.
        return np.asarray(values, dtype=object)
    return arr


def _capital(where: str) -> str:
    """ "in row 3 of a.npy" -> "Row 3 of a.npy": a ``locate`` phrase as a sentence's subject."""
    words = where.split(" ", 1)
    rest = words[1] if words[0] in ("in", "on", "at") and len(words) > 1 else where
    return rest[:1].upper() + rest[1:]


def check_unique_ids(ids, where: str, locate: Callable[[int], str] | None = None,
                     first_line: int | None = None) -> np.ndarray:  # fmt: skip
    """Return ``ids`` as int64 (:func:`check_ids`), or raise naming a duplicated id and its rows
    (counted from 1), or its lines in a text file whose row 0 is on line ``first_line``."""
    ids = check_ids(ids, where, locate)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if dup.size:
        value = sorted_ids[dup[0]]
        rows = np.flatnonzero(ids == value)[:5]
        at = "rows " if first_line is None else "lines "
        at += ", ".join(map(str, (rows + (1 if first_line is None else first_line)).tolist()))
        raise FairpipeInputError(DUPLICATE_ID.format(id=int(value), where=where, rows=at))
    return ids


# -- the points an estimator's method is given ----------------------------------------------------
# scikit-learn's check_estimator matches parts of these messages ("sparse", "Complex data not
# supported", "Reshape your data", "0 feature(s)", "X has 1 features, but"): each keeps its words.
SPARSE = (
    "{where} does not accept sparse input (a {kind}); give a dense array, for example X.toarray()."
)
COMPLEX = "Complex data not supported: {where} must hold real numbers. Got values of type {dtype}."
NOT_NUMBERS = "{where} must hold real numbers: {problem}."
ONE_DIMENSIONAL = (
    "{where} expects a 2-dimensional matrix of points. Got a 1-dimensional array of shape {shape} "
    "instead. Reshape your data with X.reshape(-1, 1) if it holds one feature, or "
    "X.reshape(1, -1) if it holds one point."
)
NO_FEATURES = "{where} got 0 feature(s) (shape={shape}) while a minimum of 1 is required."
N_FEATURES = (
    "X has {got} features, but {owner} is expecting {expected} features as input ({where})."
)


class NotNumbersError(FairpipeInputError, TypeError):
    """Values that are not numbers at all (a dict in an object array): a TypeError too, as
    numpy's and scikit-learn's are."""


def check_estimator_points(X, owner: str, method: str, n_features: int | None = None):
    """``X`` given to ``owner.method`` (fit, predict, ...) as :func:`check_points` returns it, after
    the checks scikit-learn's estimator contract asks for: sparse input refused (fairpipe's
    kernels are dense), complex values refused, an object array of numbers converted, 1-D input
    and 0 features refused with a hint, and the feature count a fitted estimator expects."""
    where = f"{owner}.{method}"
    sparse = sys.modules.get("scipy.sparse")
    if sparse is not None and sparse.issparse(X):
        raise FairpipeInputError(SPARSE.format(where=where, kind=type(X).__name__))
    X = np.asarray(X)
    if X.dtype.kind == "c":
        raise FairpipeInputError(COMPLEX.format(where=where, dtype=X.dtype))
    if X.dtype.kind == "O":
        try:
            X = X.astype(np.float64)
        except TypeError as exc:
            raise NotNumbersError(NOT_NUMBERS.format(where=where, problem=exc)) from None
        except ValueError as exc:
            raise FairpipeInputError(NOT_NUMBERS.format(where=where, problem=exc)) from None
    if X.ndim == 1:
        raise FairpipeInputError(ONE_DIMENSIONAL.format(where=where, shape=X.shape))
    if X.ndim == 2 and X.shape[1] == 0:
        raise FairpipeInputError(NO_FEATURES.format(where=where, shape=X.shape))
    if X.ndim == 2 and n_features is not None and X.shape[1] != n_features:
        raise FairpipeInputError(
            N_FEATURES.format(got=X.shape[1], owner=owner, expected=n_features, where=where)
        )
    return check_points(X, where=where, n_features=n_features)


def check_points_and_ids(X, ids, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """Validated points and their ids (row numbers when ``ids`` is None), for ``owner.fit``."""
    X = check_estimator_points(X, owner, "fit")
    ids = np.arange(X.shape[0], dtype=np.int64) if ids is None else np.asarray(ids)
    if ids.shape != (X.shape[0],):
        raise FairpipeInputError(
            f"{owner}.fit got {ids.shape[0]} ids for {X.shape[0]} points; one id per point is needed."
        )
    return X, check_unique_ids(ids, where=f"{owner}.fit")


class IdLookup:
    """Rows of ids, by binary search over a sorted copy made once (none when the ids are
    already increasing, as assigned ids are: no sort, no copy; at 10M ids the sort took
    0.08-0.35 s and two more arrays of n)."""

    def __init__(self, ids: np.ndarray):
        ids = np.asarray(ids)
        self.order: np.ndarray | None = None
        if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            self.order = np.argsort(ids, kind="stable")
            ids = ids[self.order]
        self.sorted = ids

    def rows(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows of the known ids, which of ``wanted`` are known)."""
        wanted = np.asarray(wanted, dtype=np.int64)
        if self.sorted.size == 0:
            return np.zeros(0, np.int64), np.zeros(wanted.shape, bool)
        pos = np.minimum(np.searchsorted(self.sorted, wanted), self.sorted.size - 1)
        known = self.sorted[pos] == wanted
        return (pos[known] if self.order is None else self.order[pos[known]]), known


def deletion_request(ids, lookup: IdLookup, alive: np.ndarray):
    """Ids to delete, checked: (unique ids, known mask, rows of the known ids, live mask over them).

    Unknown ids and ids already deleted are not errors: the caller reports them.
    """
    ids = np.unique(check_ids(np.atleast_1d(as_id_array(ids)), "the ids to delete"))
    rows, known = lookup.rows(ids)
    return ids, known, rows, alive[rows]


def load_npy(path, bad: str, **options) -> np.ndarray:
    """The array in the .npy file ``path`` (``options`` go to ``numpy.load``; pickled objects are
    refused). Raises ``bad`` (a message; ``{why}`` in it becomes the reason) when the file is not
    a .npy array numpy can read."""
    try:
        return np.load(path, allow_pickle=False, **options)
    except (ValueError, OSError, EOFError) as exc:  # not a .npy, cut short, empty, or pickled
        raise FairpipeInputError(bad.replace("{why}", str(exc))) from None


def read_json_object(path: str, missing: str, bad: str) -> dict:
    """The JSON object in the file ``path``, parsed within :mod:`fairpipe.jsontext`'s bounds.
    Raises ``missing`` (a message) when there is no such file, and ``bad`` (a template with
    ``{problem}``) when it is too large, not UTF-8, nested too deep, not JSON or not an object."""
    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(missing)
    try:
        with open(p, "rb") as f:
            spec = parse_json(f.read(MAX_JSON_BYTES + 1))  # one byte over: refused as too large
    except JSONTextError as exc:
        raise FairpipeInputError(bad.format(problem=exc)) from None
    if not isinstance(spec, dict):
        raise FairpipeInputError(bad.format(problem="it is not an object"))
    return spec
