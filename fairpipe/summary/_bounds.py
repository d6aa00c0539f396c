"""Fairness bounds as users give them, turned into per-group counts.

Either fractions of k for every group (l_c = floor(lower * k), u_c = ceil(upper * k), with the
1e-9 tolerance the re-rankers use, so 0.3 * 10 counts as 3), or counts per group name in a JSON
file: ``{"female": [3, 6], "male": {"lower": 3, "upper": 6}}`` (an upper bound left out or null
is k).

>>> resolve_bounds(10, ["a", "b"], lower=0.2, upper=0.75)
([2, 2], [8, 8])
"""

from __future__ import annotations

import math

from fairpipe.errors import FairpipeInputError, check_positive_int, plain
from fairpipe.validation import read_json_object

NO_BOUNDS = "No fairness bounds: give --lower and --upper (fractions of k) or --bounds FILE.json."
BOTH_BOUNDS = "Give either --lower/--upper or --bounds FILE.json, not both."
BAD_FRACTION = "--{which} must be a fraction of k between 0 and 1. Got {value} instead."
NO_BOUNDS_FILE = "The bounds file {path} does not exist."
BAD_BOUNDS_FILE = (
    "The bounds file {path} must hold a JSON object mapping each group name to [lower, upper] or "
    '{{"lower": L, "upper": U}}; {problem}.'
)
UNKNOWN_GROUP = (
    "The bounds file {path} names group {name!r}, which the store does not have (it has {known})."
)
MISSING_GROUP = "The bounds file {path} gives no bounds for group {name!r} of the store."
TOL = 1e-9


def resolve_bounds(k, names: list[str], lower: float | None = None, upper: float | None = None,
                   bounds_file: str | None = None) -> tuple[list, list]:  # fmt: skip
    """Per-group (lower, upper) counts for the groups ``names``, from fractions of k or from a
    bounds file (not both); upper bounds not given are k. The counts are checked against each
    other and k by :func:`check_bounds` afterwards."""
    k = check_positive_int(k, "k", "summarize")
    if bounds_file is not None:
        if lower is not None or upper is not None:
            raise FairpipeInputError(BOTH_BOUNDS)
        lo, up = load_bounds_file(bounds_file, names)
    else:
        if lower is None and upper is None:
            raise FairpipeInputError(NO_BOUNDS)
        lo, up = bounds_from_fractions(k, len(names), lower, upper)
    return lo, [k if u is None else u for u in up]


def bounds_from_fractions(k: int, n_groups: int, lower: float | None, upper: float | None):
    """The same bounds for every group: floor(lower * k) and ceil(upper * k)."""
    lower = 0.0 if lower is None else lower
    upper = 1.0 if upper is None else upper
    for which, value in (("lower", lower), ("upper", upper)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
        if not ok:
            raise FairpipeInputError(BAD_FRACTION.format(which=which, value=plain(value)))
    lo = math.floor(lower * k + TOL)
    up = math.ceil(upper * k - TOL)
    return [lo] * n_groups, [up] * n_groups


def load_bounds_file(path: str, names: list[str]) -> tuple[list, list]:
    """Per-group (lower, upper) from a JSON file naming every group of ``names`` (upper may be
    None: k)."""
    bad = BAD_BOUNDS_FILE.replace("{path}", str(path).replace("{", "{{").replace("}", "}}"))
    spec = read_json_object(path, NO_BOUNDS_FILE.format(path=path), bad)
    for name in spec:
        if name not in names:
            raise FairpipeInputError(UNKNOWN_GROUP.format(path=path, name=name, known=names))
    lower, upper = [], []
    for name in names:
        if name not in spec:
            raise FairpipeInputError(MISSING_GROUP.format(path=path, name=name))
        entry = spec[name]
        if isinstance(entry, dict) and set(entry) <= {"lower", "upper"}:
            pair = [entry.get("lower", 0), entry.get("upper", None)]
        elif isinstance(entry, list) and len(entry) == 2:
            pair = list(entry)
        else:
            problem = f"group {name!r} has {entry!r}"
            raise FairpipeInputError(BAD_BOUNDS_FILE.format(path=path, problem=problem))
        for value in pair:
            if value is not None and not isinstance(value, (int, float)):
                problem = f"group {name!r} has the non-numeric bound {value!r}"
                raise FairpipeInputError(BAD_BOUNDS_FILE.format(path=path, problem=problem))
        lower.append(pair[0])
        upper.append(pair[1])
    return lower, upper
