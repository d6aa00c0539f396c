"""Candidate tables: read with one error per malformed file, k checked against them, and re-ranked
in memory bounded by the table whatever k is."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fairpipe.errors import FairpipeInputError
from fairpipe.ranking import ALGORITHMS, read_candidates, rerank_lists
from fairpipe.ranking._candidates import candidate_columns, check_table_ahead

COLUMNS = candidate_columns("list", "score", "group")


def table(n_lists: int = 4, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 12, size=n_lists)
    return pd.DataFrame({"list": np.repeat(np.arange(n_lists), sizes),
                         "score": rng.random(sizes.sum()),
                         "group": rng.choice(["a", "b", "c"], sizes.sum())})  # fmt: skip


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_k_past_the_longest_list_ranks_as_the_longest_list(tmp_path, algorithm):
    """Every list keeps all its candidates from its length on: a k of 10^12 gives what k = the
    longest list gives, without arrays of k columns."""
    for seed in range(20):
        table(seed=seed).to_csv(tmp_path / "c.csv", index=False)
        lists = read_candidates(str(tmp_path / "c.csv"))
        width = int(np.diff(lists.starts).max())
        args = (lists.scores, lists.codes, lists.starts, lists.p)
        at_width = rerank_lists(*args, width, algorithm, 0.0)
        huge = rerank_lists(*args, 10**12, algorithm, 0.0)
        for key in ("rows", "rank"):
            assert np.array_equal(huge[key], at_width[key])
        for when in ("before", "after"):
            for metric, values in at_width[when].items():
                np.testing.assert_array_equal(huge[when][metric], values, err_msg=metric)


def test_a_table_that_is_not_utf8_or_not_parquet_is_named(tmp_path):
    frame = table()
    (tmp_path / "latin.csv").write_bytes(
        frame.to_csv(index=False).encode() + "2,0.5,caf\xe9\n".encode("latin-1")
    )
    line = len(frame) + 2
    with pytest.raises(FairpipeInputError,
                       match=f"^latin.csv is not UTF-8 text: line {line} holds the byte 0xe9"):  # fmt: skip
        read_candidates(str(tmp_path / "latin.csv"))
    with pytest.raises(FairpipeInputError, match=f"line {line} holds the byte 0xe9"):
        check_table_ahead(str(tmp_path / "latin.csv"), COLUMNS)  # before it is read
    (tmp_path / "text.parquet").write_text(frame.to_csv(index=False))
    for check in (lambda p: read_candidates(p), lambda p: check_table_ahead(p, COLUMNS)):
        with pytest.raises(FairpipeInputError, match="^text.parquet is not a readable Parquet"):
            check(str(tmp_path / "text.parquet"))


def test_a_score_column_of_lists_is_named_with_its_type(tmp_path):
    pq.write_table(pa.table({"list": [1, 1], "score": pa.array([[1.0], [2.0]]),
                             "group": ["a", "b"], "tags": pa.array([["x"], []])}),
                   tmp_path / "c.parquet")  # fmt: skip
    says = (r"^Column 'score' of c.parquet holds lists \(list<element: double>\); the score "
            r"column \(--score-column\) must hold one number per row.$")  # fmt: skip
    for check in (lambda p: read_candidates(p), lambda p: check_table_ahead(p, COLUMNS)):
        with pytest.raises(FairpipeInputError, match=says):
            check(str(tmp_path / "c.parquet"))
