"""One error type and one message style for bad input.

Messages follow scikit-learn's style: what was expected, where, and what was given, e.g.
``The 'radius' parameter of FairNN.sample must be a positive float. Got -1.0 instead.``
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any


class FairpipeInputError(ValueError):
    """Bad input: raised before anything is written."""


POSITIVE_INT = (
    "The {name!r} parameter of {owner} must be a positive integer. Got {value!r} instead."
)
POSITIVE_FLOAT = (
    "The {name!r} parameter of {owner} must be a positive float. Got {value!r} instead."
)
ONE_OF = "The {name!r} parameter of {owner} must be one of {allowed}. Got {value!r} instead."
NON_NEGATIVE_INT = (
    "The {name!r} parameter of {owner} must be a non-negative integer. Got {value!r} instead."
)
INTEGER = "The {name!r} parameter of {owner} must be an integer. Got {value!r} instead."
OPEN_UNIT = "The {name!r} parameter of {owner} must be in (0, 1). Got {value!r} instead."
# k (clusters, summary size) larger than what it selects from: one message for every estimator,
# flow and command ("n_clusters = 9 is larger than the 4 points given to DCKMeans.fit").
K_TOO_LARGE = "{name} = {k} is larger than the {n} {what}."


def check_positive_int(value: Any, name: str, owner: str) -> int:
    if type(value) is int and value > 0:  # the common case, without the ABC checks
        return value
    if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
        raise FairpipeInputError(POSITIVE_INT.format(name=name, owner=owner, value=value))
    return int(value)


def check_positive_float(value: Any, name: str, owner: str) -> float:
    if (type(value) is float or type(value) is int) and 0 < value < math.inf:  # NaN fails too
        return float(value)
    ok = isinstance(value, Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        raise FairpipeInputError(POSITIVE_FLOAT.format(name=name, owner=owner, value=value))
    return float(value)


def check_one_of(value: Any, allowed: tuple[str, ...], name: str, owner: str) -> str:
    if value not in allowed:
        raise FairpipeInputError(
            ONE_OF.format(
                name=name, owner=owner, allowed=", ".join(map(repr, allowed)), value=value
            )
        )
    return str(value)


def check_non_negative_int(value: Any, name: str, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise FairpipeInputError(NON_NEGATIVE_INT.format(name=name, owner=owner, value=value))
    return int(value)


def check_int(value: Any, name: str, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise FairpipeInputError(INTEGER.format(name=name, owner=owner, value=value))
    return int(value)


def check_open_unit(value: Any, name: str, owner: str) -> float:
    """A float strictly between 0 and 1."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and 0 < float(value) < 1
    if not ok:
        raise FairpipeInputError(OPEN_UNIT.format(name=name, owner=owner, value=value))
    return float(value)
