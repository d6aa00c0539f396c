"""JSON text from users and producers, parsed within bounds (fairpipe.jsontext)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fairpipe.jsontext import MAX_JSON_DEPTH, JSONTextError, nesting_depth, parse_json
from fairpipe.validation import read_json_object

# Characters that make strings hard to tell from structure: brackets, quotes, backslashes.
TRICKY = ["[", "]", "{", "}", '"', "\\", '\\"', "é", ",", ":", " ", "a"]


def random_value(rng: np.random.Generator, depth: int):
    """A JSON value nested at most ``depth`` deep, its strings made of TRICKY characters."""
    kind = rng.integers(0, 5 if depth else 3)
    if kind == 0:
        return int(rng.integers(-5, 5))
    if kind == 1:
        return None
    if kind == 2:
        return "".join(rng.choice(TRICKY, size=int(rng.integers(0, 8))))
    items = [random_value(rng, depth - 1) for _ in range(int(rng.integers(0, 4)))]
    if kind == 3:
        return items
    return {"".join(rng.choice(TRICKY, size=3)) + str(i): v for i, v in enumerate(items)}


def reference_depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(reference_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(reference_depth, value.values()), default=0)
    return 0


def test_the_depth_of_the_text_is_the_depth_of_the_value():
    """Against the depth of the parsed value, over 2,000 random documents whose strings hold
    brackets, quotes and escaped quotes (with and without non-ASCII text)."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        value = random_value(rng, int(rng.integers(0, 9)))
        for ascii in (True, False):
            text = json.dumps(value, ensure_ascii=ascii).encode()
            assert nesting_depth(text) == reference_depth(value), text


def test_a_document_nested_deeper_than_the_maximum_is_refused_before_it_is_parsed():
    deep = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert nesting_depth(deep) == MAX_JSON_DEPTH and parse_json(deep)  # the maximum is read
    for text in (b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 200_000 + b"1" + b"}" * 200_000,
                 b"[" * 200_000):  # fmt: skip
        with pytest.raises(JSONTextError, match="nests arrays and objects 200,000 deep, over 64"):
            parse_json(text)


def test_text_that_is_too_large_not_utf8_or_not_json_is_refused_saying_so():
    with pytest.raises(JSONTextError, match="^it holds more than 10 bytes$"):
        parse_json(b'{"a": 12345678}', max_bytes=10)
    with pytest.raises(JSONTextError, match="^it is not UTF-8 text: line 2 holds the byte 0xe9$"):
        parse_json(b'{\n"caf\xe9": 1}')
    with pytest.raises(JSONTextError, match=r"^it is not valid JSON \(Expecting value"):
        parse_json(b'{"a": }')
    with pytest.raises(JSONTextError, match="not valid JSON.*4300"):
        parse_json(b"1" * 5000)  # Python's limit on the digits of an integer


def test_a_bounds_file_nested_too_deep_or_not_utf8_is_named(tmp_path):
    bad = "The file {path} must hold an object; {problem}."
    (tmp_path / "deep.json").write_bytes(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(ValueError, match="deep.json must hold an object; it nests arrays and "
                                         "objects 100,001 deep, over 64."):  # fmt: skip
        read_json_object(str(tmp_path / "deep.json"), "missing", bad.replace("{path}", "deep.json"))
    (tmp_path / "latin.json").write_bytes('{"café": 1}'.encode("latin-1"))
    with pytest.raises(ValueError, match="line 1 holds the byte 0xe9"):
        read_json_object(str(tmp_path / "latin.json"), "missing", bad.replace("{path}", "x"))
