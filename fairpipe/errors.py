"""One error type and one message style for bad input.

Messages follow scikit-learn's style: what was expected, where, and what was given, e.g.
``The 'radius' parameter of FairNN.sample must be a positive float. Got -1.0 instead.``
A command-line option is named as the user typed it: ``The --workers option of fairpipe
ingest must be a positive integer. Got 0 instead.`` Values are shown as plain Python values
(``-3``, never ``np.int64(-3)``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from numbers import Integral, Real
from typing import Any


class FairpipeInputError(ValueError):
    """Bad input: raised before anything is written."""


# Seeds are stored with the data (an int64 attribute) and seed numpy Generators (which refuse
# negative seeds): integers from 0 to MAX_SEED.
MAX_SEED = 2**63 - 1

POSITIVE_INT = "{subject} must be a positive integer. Got {value} instead."
POSITIVE_FLOAT = "{subject} must be a positive float. Got {value} instead."
ONE_OF = "{subject} must be one of {allowed}. Got {value} instead."
NON_NEGATIVE_INT = "{subject} must be a non-negative integer. Got {value} instead."
OPEN_UNIT = "{subject} must be in (0, 1). Got {value} instead."
FRACTION = "{subject} must be a fraction from 0 to 1. Got {value} instead."
INT_AT_LEAST = "{subject} must be an integer >= {low}. Got {value} instead."
INT_AT_MOST = "{subject} must be an integer from {low} to {high}. Got {value} instead."
NON_NEGATIVE_FLOAT = "{subject} must be a number >= 0{inf}. Got {value} instead."
SEED = "{subject} must be an integer from 0 to " + f"{MAX_SEED}. Got {{value}} instead."
# k (clusters, summary size) larger than what it selects from: one message for every estimator,
# flow and command ("n_clusters = 9 is larger than the 4 points given to DCKMeans.fit").
K_TOO_LARGE = "{name} = {k} is larger than the {n} {what}."


def plain(value: Any) -> str:
    """``value`` as a message shows it: a numpy scalar as the Python value it holds (``-3``, not
    ``np.int64(-3)``), a string quoted, anything else as Python writes it.

    >>> import numpy as np
    >>> plain(np.int64(-3)), plain(np.float32(0.5)), plain("x"), plain(float("nan"))
    ('-3', '0.5', "'x'", 'nan')
    """
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()
    return repr(value)


def subject(name: str, owner: str) -> str:
    """How a message names a parameter: ``The 'radius' parameter of FairNN.sample``, or a
    command-line option (a name starting with ``--``): ``The --workers option of fairpipe
    ingest``."""
    if name.startswith("--"):
        return f"The {name} option of {owner}"
    return f"The {name!r} parameter of {owner}"


def _bad(template: str, value: Any, name: str, owner: str, **more: Any) -> FairpipeInputError:
    return FairpipeInputError(
        template.format(subject=subject(name, owner), value=plain(value), **more)
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_positive_int(value: Any, name: str, owner: str) -> int:
    if type(value) is int and value > 0:  # the common case, without the ABC checks
        return value
    if not _is_int(value) or value <= 0:
        raise _bad(POSITIVE_INT, value, name, owner)
    return int(value)


def check_positive_float(value: Any, name: str, owner: str) -> float:
    if (type(value) is float or type(value) is int) and 0 < value < math.inf:  # NaN fails too
        return float(value)
    ok = isinstance(value, Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        raise _bad(POSITIVE_FLOAT, value, name, owner)
    return float(value)


def check_one_of(value: Any, allowed: tuple[str, ...], name: str, owner: str) -> str:
    if value not in allowed:
        raise _bad(ONE_OF, value, name, owner, allowed=", ".join(map(repr, allowed)))
    return str(value)


def check_non_negative_int(value: Any, name: str, owner: str) -> int:
    if not _is_int(value) or value < 0:
        raise _bad(NON_NEGATIVE_INT, value, name, owner)
    return int(value)


def check_int_range(value: Any, name: str, owner: str, low: int, high: int | None = None) -> int:
    """An integer from ``low`` to ``high`` (no upper limit for None)."""
    if not _is_int(value) or value < low or (high is not None and value > high):
        if high is None:
            raise _bad(INT_AT_LEAST, value, name, owner, low=low)
        raise _bad(INT_AT_MOST, value, name, owner, low=low, high=high)
    return int(value)


def check_seed(value: Any, name: str, owner: str) -> int:
    """A seed: an integer from 0 to MAX_SEED."""
    if not _is_int(value) or not 0 <= value <= MAX_SEED:
        raise _bad(SEED, value, name, owner)
    return int(value)


def check_non_negative_float(value: Any, name: str, owner: str, allow_inf: bool = False) -> float:
    """A number >= 0 (not NaN; infinity only where ``allow_inf``: "wait forever")."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and float(value) >= 0
    if not ok or (not allow_inf and not math.isfinite(float(value))):
        raise _bad(
            NON_NEGATIVE_FLOAT, value, name, owner, inf=" (or inf: no limit)" if allow_inf else ""
        )
    return float(value)


def check_open_unit(value: Any, name: str, owner: str) -> float:
    """A float strictly between 0 and 1."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and 0 < float(value) < 1
    if not ok:
        raise _bad(OPEN_UNIT, value, name, owner)
    return float(value)


def check_fraction(value: Any, name: str, owner: str) -> float:
    """A number from 0 to 1 (not NaN)."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and 0 <= float(value) <= 1
    if not ok:
        raise _bad(FRACTION, value, name, owner)
    return float(value)


# What became of the work an error stopped (a deletion request withdrawn, or left filed for the
# next drain): a note on the exception (PEP 678) that the command line prints on the error's line.
OUTCOME = "fairpipe outcome: "


def note_outcome(error: BaseException, text: str) -> None:
    """Tell, with ``error``, what became of the work it stopped."""
    error.add_note(OUTCOME + text)


def outcomes(error: BaseException) -> list[str]:
    """The outcomes :func:`note_outcome` gave ``error``."""
    notes = getattr(error, "__notes__", ())
    return [n.removeprefix(OUTCOME) for n in notes if isinstance(n, str) and n.startswith(OUTCOME)]


def wrapped(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and the errors it wraps, outermost first: its explicit cause (``raise ...
    from``), the one error of a group of one (as Prefect and Dask hand errors on), and the
    original of a flow's redacted error (``fairpipe.flows.private.RedactedError``, its ``original``)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        yield error
        seen.add(id(error))
        if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        elif type(error).__name__ == "RedactedError" and getattr(error, "original", None):
            error = error.original  # type: ignore[attr-defined]
        else:
            error = error.__cause__
