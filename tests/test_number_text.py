"""The one rule of numbers typed as text, against Python's own readers as the reference: every
text Python reads as a number is read here to the same value, or refused for a named flaw."""

import sys
import unicodedata

import pytest

from fairpipe.number_text import flaw, read_decimal, read_duration, read_integer

# Every character Unicode calls a decimal digit, in every script: the lookalikes of 0-9.
OTHER_DIGITS = [
    chr(c) for c in range(sys.maxunicode + 1) if chr(c).isdecimal() and not chr(c).isascii()
]


def test_no_digit_of_another_script_is_read_although_python_reads_each():
    assert len(OTHER_DIGITS) > 600  # Unicode 14 has 650 such digits
    for ch in OTHER_DIGITS:
        text = "2" + ch + "0"
        assert int(text) == 200 + 10 * unicodedata.decimal(ch)  # Python's int reads it
        assert read_integer(text) is None and read_decimal(text) is None
        assert read_duration(text + "d") is None
        assert flaw(text) == "is written with digits other than ASCII 0-9"


@pytest.mark.parametrize(
    ("text", "said"),
    [("200_000", "holds '_'"), (" +200000 ", "has spaces around it"), ("+5", "has a '+' sign"),
     ("1 0", "is not a number"), ("", "is not a number"), ("0x10", "is not a number")],
)  # fmt: skip
def test_what_python_reads_and_the_rule_refuses_is_named(text, said):
    assert read_integer(text) is None and read_decimal(text) is None
    assert flaw(text) == said


@pytest.mark.parametrize("text", ["0", "7", "007", "-3", "200000", "9223372036854775808", "-0"])
def test_integers_read_as_python_reads_them(text):
    assert read_integer(text) == int(text)
    assert read_decimal(text) == float(text)


@pytest.mark.parametrize(
    "text", ["0.5", ".5", "5.", "1e3", "1E-3", "-2.5E+3", "1e999", "inf", "-Infinity", "1e308"]
)
def test_decimals_read_as_python_reads_them(text):
    assert read_decimal(text) == float(text)
    assert read_integer(text) is None or text.isdigit()


def test_nan_is_a_decimal():
    value = read_decimal("NaN")
    assert value is not None and value != value


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0), ("3600s", 3600), ("90m", 5400), ("1.5h", 5400), ("7d", 604800), ("2W", 1209600)],
)
def test_durations(text, seconds):
    assert read_duration(text) == seconds


@pytest.mark.parametrize("text", ["-1d", "1e3s", "7 d", " 7d", "7dd", "d", "7y", "1_0s"])
def test_what_is_not_a_duration(text):
    assert read_duration(text) is None
