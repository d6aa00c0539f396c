"""The id lookup every forget and query-by-id goes through, against a dict."""

import numpy as np
import pytest

from fairpipe.validation import IdLookup


@pytest.mark.parametrize("order", ["increasing", "shuffled", "with_gaps_decreasing"])
def test_id_lookup_finds_the_rows_a_dict_finds(order):
    rng = np.random.default_rng(5)
    ids = np.cumsum(rng.integers(1, 9, size=5_000)) - 40  # increasing, some negative
    if order == "shuffled":
        ids = rng.permutation(ids)
    elif order == "with_gaps_decreasing":
        ids = ids[::-1].copy()
    wanted = np.r_[rng.choice(ids, 300), [-1_000, 10**9, ids.max() + 1]]
    rows, known = IdLookup(ids).rows(wanted)
    where = {int(v): r for r, v in enumerate(ids)}
    assert known.tolist() == [int(w) in where for w in wanted]
    assert rows.tolist() == [where[int(w)] for w in wanted if int(w) in where]
    # The increasing case keeps no sorted copy (no sort at all).
    assert (IdLookup(ids).order is None) == (order == "increasing")


def test_id_lookup_of_an_empty_or_single_store():
    assert IdLookup(np.zeros(0, np.int64)).rows(np.array([3]))[1].tolist() == [False]
    rows, known = IdLookup(np.array([7])).rows(np.array([7, 8]))
    assert rows.tolist() == [0] and known.tolist() == [True, False]


# -- the one rule of ids: every way ids come in gives the same answer ----------------------------
MAX_ID = 2**63 - 1


def id_sources(tmp_path, values: list[str]) -> dict[str, object]:
    """The same ids written every way they come in: --ids text, a text file, a CSV with a header,
    a CSV id column of a source to ingest, and as numbers in npy and Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fairpipe.datasets import plan_source, read_ids

    (tmp_path / "ids.txt").write_text("\n".join(values) + "\n")
    (tmp_path / "ids.csv").write_text("id,reason\n" + "".join(f"{v},x\n" for v in values))
    (tmp_path / "src.csv").write_text(
        "person,a\n" + "".join(f"{v},{i}.5\n" for i, v in enumerate(values))
    )
    ways = {
        "--ids": lambda: read_ids(text=",".join(values)),
        "text file": lambda: read_ids(path=str(tmp_path / "ids.txt")),
        "csv file": lambda: read_ids(path=str(tmp_path / "ids.csv")),
        "ingest csv": lambda: plan_source(str(tmp_path / "src.csv"), id_column="person").ids,
    }
    if not any("e" in v for v in values):  # (1e5 is the binary float 100000.0: a good id)
        numbers = [float(v) if "." in v else int(v) for v in values]
        arr = np.array(numbers, dtype=np.uint64 if max(numbers) > MAX_ID else None)
        np.save(tmp_path / "ids.npy", arr)
        pq.write_table(pa.table({"id": arr}), tmp_path / "ids.parquet")
        ways["npy file"] = lambda: read_ids(path=str(tmp_path / "ids.npy"))
        ways["parquet file"] = lambda: read_ids(path=str(tmp_path / "ids.parquet"))
    return ways


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["7", "100300"], [7, 100300]),
        (["7.0", "100300.0"], [7, 100300]),  # a decimal point and zeros: the same ids
        (["0", str(MAX_ID)], [0, MAX_ID]),
        (["7", "100300.5"], "Id 100300.5 .* is not an integer; ids are integers from 0 to "),
        (["7", "-3"], "Id -3 .* is negative; ids are integers from 0 to "),
        (["7", str(2**63)], "Id 9223372036854775808 .* is too large"),
        (["7", "1e5"], "Id 1e5 .* is written with an exponent"),
    ],
)
def test_one_rule_for_ids_in_every_way_they_come_in(tmp_path, values, expected):
    from fairpipe.errors import FairpipeInputError

    for way, read in id_sources(tmp_path, values).items():
        if isinstance(expected, list):
            assert read().tolist() == expected, way
        else:
            with pytest.raises(FairpipeInputError, match=expected):
                read()


def test_ids_name_their_line_or_row_and_floats_above_2_53_are_refused(tmp_path):
    from fairpipe.datasets import read_ids
    from fairpipe.errors import FairpipeInputError
    from fairpipe.validation import check_ids, check_unique_ids

    (tmp_path / "a.txt").write_text("1\n2, 3\n\n4 x\n")
    with pytest.raises(FairpipeInputError, match="Id 'x' on line 4 of a.txt is not an integer"):
        read_ids(path=str(tmp_path / "a.txt"))
    (tmp_path / "b.csv").write_text("id\n1\n\n2\n,\n")
    with pytest.raises(FairpipeInputError, match="^Line 5 of b.csv has no id"):
        read_ids(path=str(tmp_path / "b.csv"))
    (tmp_path / "c.txt").write_bytes(b"1\n2\xff\n")
    with pytest.raises(FairpipeInputError, match="c.txt is not UTF-8 text: line 2 holds the byte"):
        read_ids(path=str(tmp_path / "c.txt"))
    with pytest.raises(FairpipeInputError, match=r"Id 9007199254740994.0 in row 2 of f.npy is a"):
        check_ids(np.array([1.0, 2.0**53 + 2]), "f.npy")
    assert check_ids(np.array([2.0**53]), "f.npy").tolist() == [2**53]
    with pytest.raises(FairpipeInputError, match="^Row 2 of f.npy has no id"):
        check_ids(np.array([1.0, np.nan]), "f.npy")
    with pytest.raises(FairpipeInputError, match="Ids in b.npy must be integers. Got .* bool"):
        check_ids(np.array([True]), "b.npy")
    # Python ints that numpy would make floats are checked exactly.
    with pytest.raises(FairpipeInputError, match="Id -1 in row 2 of DCKMeans.fit is negative"):
        check_ids([2**63 - 1, -1], "DCKMeans.fit")
    with pytest.raises(FairpipeInputError, match=r"Id 5 appears more than once in x \(rows 2, 4\)"):
        check_unique_ids([1, 5, 2, 5], "x")


def test_a_row_of_a_text_table_is_named_by_its_line(tmp_path):
    from fairpipe.validation import text_row_name

    (tmp_path / "a.csv").write_text("x,y\n1,2\n\n  \n3,4\n5,6\n")  # pandas skips blank lines
    assert text_row_name(tmp_path / "a.csv", 0) == "line 2 of a.csv"
    assert text_row_name(tmp_path / "a.csv", 2) == "line 6 of a.csv"
    (tmp_path / "b.data").write_text("|a comment\n1, 2\n| another\n3, 4\n")
    assert text_row_name(tmp_path / "b.data", 1, header=False, comment="|") == "line 4 of b.data"
    (tmp_path / "q.csv").write_text('x,y\n"1\n2",3\n4,5\n')  # a quote may hold a line break
    assert text_row_name(tmp_path / "q.csv", 1) == "row 2 of q.csv"


def test_messages_show_plain_values_never_numpy_reprs():
    from fairpipe.errors import FairpipeInputError, check_positive_float, check_positive_int

    with pytest.raises(FairpipeInputError, match=r"must be a positive integer. Got -3 instead\.$"):
        check_positive_int(np.int64(-3), "k", "fit")
    with pytest.raises(
        FairpipeInputError, match=r"^The --radius option of fairpipe sample .* nan "
    ):
        check_positive_float(np.float32("nan"), "--radius", "fairpipe sample")
