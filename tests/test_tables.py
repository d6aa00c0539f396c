"""Tables users give as files, read with one error per malformed file (fairpipe.tables)."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fairpipe import tables
from fairpipe.errors import FairpipeInputError


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 22])
def test_the_first_byte_that_is_not_utf8_is_named_by_its_line_in_any_block(
    tmp_path, monkeypatch, block
):
    """Blocks of 1 to 7 bytes cut the two-byte 'é' and the line ends anywhere."""
    monkeypatch.setattr(tables, "SCAN_BYTES", block)
    (tmp_path / "a.csv").write_bytes("x,y\ncafé,1\n".encode() + b"th\xe9,2\n")
    with pytest.raises(FairpipeInputError, match=r"^a.csv is not UTF-8 text: line 3 holds the "
                                                 r"byte 0xe9\. Save it as UTF-8\.$"):  # fmt: skip
        tables.count_lines(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_bytes("x\ncafé".encode()[:-1])  # cut inside its last character
    with pytest.raises(FairpipeInputError, match="line 2 holds the byte 0xc3"):
        tables.count_lines(tmp_path / "b.csv")
    (tmp_path / "c.csv").write_bytes("x\ncafé\n\n3".encode())
    assert tables.count_lines(tmp_path / "c.csv") == 4  # the last line has no line end


def test_a_csv_that_is_not_utf8_csv_or_gzip_is_one_error_naming_the_file(tmp_path):
    (tmp_path / "latin.csv.gz").write_bytes(gzip.compress("a,b\n1,caf\xe9\n".encode("latin-1")))
    with pytest.raises(FairpipeInputError, match="^latin.csv.gz is not UTF-8 text: line 2 "):
        tables.read_csv_table(tmp_path / "latin.csv.gz")
    (tmp_path / "fake.csv.gz").write_text("a,b\n1,2\n")
    with pytest.raises(FairpipeInputError, match=r"^fake.csv.gz is not a CSV file pandas can "):
        tables.read_csv_table(tmp_path / "fake.csv.gz")
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n1,2,3,4\n")
    with pytest.raises(FairpipeInputError, match=r"Expected 2 fields in line 3, saw 4"):
        tables.read_csv_table(tmp_path / "ragged.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(FairpipeInputError, match="^empty.csv holds no rows.$"):
        tables.read_csv_table(tmp_path / "empty.csv")
    with pytest.raises(FairpipeInputError, match="^nothing here$"):
        tables.read_csv_table(tmp_path / "empty.csv", empty="nothing here")


def test_a_parquet_file_that_is_not_one_or_holds_lists_is_one_error_naming_it(tmp_path):
    (tmp_path / "text.parquet").write_text("list,score\n1,0.5\n")
    with pytest.raises(FairpipeInputError, match=r"^text.parquet is not a readable Parquet file "
                                                 r"\(Parquet magic bytes"):  # fmt: skip
        tables.read_parquet_table(tmp_path / "text.parquet")
    table = pa.table({"x": [1.0, 2.0], "v": pa.array([[1.0, 2.0], [3.0]]),
                      "r": pa.array([{"a": 1}, {"a": 2}]),
                      "m": pa.array([[("k", 1)], []], type=pa.map_(pa.string(), pa.int64()))})  # fmt: skip
    pq.write_table(table, tmp_path / "nested.parquet")
    flat = {c: ("a feature column", "number") for c in ("x", "v", "r", "m")}
    expected = {
        "v": "holds lists (list<element: double>); a feature column must hold one number per row.",
        "r": "holds records (struct<a: int64>)",
        "m": "holds maps (map<string, int64 ('m')>)",
    }
    for col, says in expected.items():
        with pytest.raises(
            FairpipeInputError, match=f"^Column '{col}' of nested.parquet " + re.escape(says)
        ):
            tables.read_parquet_table(tmp_path / "nested.parquet", {col: flat[col]})
    # Columns not named may hold anything: they are carried, not read.
    got = tables.read_parquet_table(tmp_path / "nested.parquet", {"x": flat["x"]})
    assert np.array_equal(got["x"].to_numpy(), [1.0, 2.0])
