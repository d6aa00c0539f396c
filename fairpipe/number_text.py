"""Numbers written as text, read by one rule: ASCII digits only.

Python's ``int`` and ``float`` (and numpy's, and click's) read more than ASCII digits:
fullwidth ``'２０００００'``, Arabic-Indic ``'٢٠٠'``, ``'200_000'``, ``' +200000 '``. A person's id
read from text that looks like another number is another person's, so every number a user types
(an option's value, an id in ``--ids``, a duration) and every id in a text file is read here:

- an **integer** is ASCII digits, with a ``-`` before a negative one: ``200000``, ``-3``, ``007``
  (leading zeros change nothing a reader sees); no ``+``, no ``_``, no space, no other script's
  digits;
- a **decimal** is an integer, a fraction or both, with an optional exponent (``0.5``, ``.5``,
  ``1e-3``, ``-2.5E+3``), or ``inf``, ``infinity`` or ``nan`` (any case, with an optional ``-``);
- a **duration** is a non-negative decimal without exponent and one of the units ``s``, ``m``,
  ``h``, ``d``, ``w`` (none: seconds): ``0``, ``90m``, ``1.5h``, ``7d``.

Each reader returns None for text that breaks its rule; the caller names the option, file or row
in its error.

>>> read_integer("200000"), read_integer("２０００００"), read_integer("200_000"), read_integer(" 1")
(200000, None, None, None)
>>> read_decimal(".5"), read_decimal("1e3"), read_decimal("-inf"), read_decimal("１.５")
(0.5, 1000.0, -inf, None)
>>> read_duration("90m"), read_duration("７d"), read_duration("1 h")
(5400.0, None, None)
"""

from __future__ import annotations

import re

INTEGER = re.compile(r"-?[0-9]+")
DECIMAL = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
WORDS = re.compile(r"-?(?:inf|infinity|nan)", re.IGNORECASE)
DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw]?)", re.IGNORECASE)
DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

INTEGER_RULE = "ASCII digits 0-9 only, without '+', '_' or spaces"
DECIMAL_RULE = "a number written in ASCII (such as 0.5, 2, 1e-3 or inf), without '+', '_' or spaces"
NOT_A_NUMBER = "is not a number"


def read_integer(text: str) -> int | None:
    """The integer ``text`` writes (see the module), or None."""
    return int(text) if INTEGER.fullmatch(text) else None


def read_decimal(text: str) -> float | None:
    """The decimal ``text`` writes (see the module), or None. A value too large for a float is
    ``inf`` (as Python reads ``1e999``)."""
    if DECIMAL.fullmatch(text) or WORDS.fullmatch(text):
        return float(text)
    return None


def read_duration(text: str) -> float | None:
    """The seconds of the duration ``text`` writes (see the module), or None."""
    found = DURATION.fullmatch(text)
    if found is None:
        return None
    return float(found.group(1)) * DURATION_UNITS[found.group(2).lower()]


def flaw(text: str) -> str:
    """What keeps ``text`` from being a number by the module's rules, as a message says it
    (``"is written with digits other than ASCII 0-9"``)."""
    if any(ch.isdigit() and not ch.isascii() for ch in text):
        return "is written with digits other than ASCII 0-9"
    if text != text.strip():
        return "has spaces around it"
    for mark, said in (("_", "holds '_'"), ("+", "has a '+' sign")):
        if mark in text:
            return said
    return NOT_A_NUMBER
