"""Loaders of the real data sets in ../shared/data, and store URL parsing (object stores: local only)."""

import gzip

import numpy as np
import pytest

from fairpipe import FairpipeInputError
from fairpipe.datasets import load_adult, load_gaussian, load_mnist_csv, load_word2vec_bin
from fairpipe.storage.urls import make_storage, parse_store_url
from tests.conftest import shared_data


def test_mnist_5k_has_500_images_per_digit():
    ds = load_mnist_csv(shared_data("mnist", "mnist_5k.csv.gz"))
    assert ds.points.shape == (5000, 784) and ds.points.dtype == np.float32
    assert np.array_equal(np.bincount(ds.groups), np.full(10, 500))
    assert 0 <= ds.points.min() and ds.points.max() <= 255


def test_word2vec_reads_unit_vectors_and_words_with_a_limit(tmp_path):
    ds, words = load_word2vec_bin(
        shared_data("word2vec", "GoogleNews-vectors-negative300-bolukbasi.bin.gz"), limit=500
    )
    assert ds.points.shape == (500, 300) and len(words) == 500
    assert np.allclose(np.linalg.norm(ds.points, axis=1), 1.0, atol=1e-3)
    # A tiny file written in the same format reads back exactly.
    vecs = np.arange(6, dtype=np.float32).reshape(2, 3)
    with gzip.open(tmp_path / "w.bin.gz", "wb") as fh:
        fh.write(b"2 3\n")
        for word, v in zip([b"cat", b"dog"], vecs):
            fh.write(word + b" " + v.astype("<f4").tobytes() + b"\n")
    small, names = load_word2vec_bin(tmp_path / "w.bin.gz")
    assert names == ["cat", "dog"] and np.array_equal(small.points, vecs)


def test_adult_groups_by_sex_and_race():
    by_sex = load_adult(shared_data("adult", "adult.data.gz"))
    assert by_sex.group_names == ["Female", "Male"]
    assert by_sex.points.shape[1] == 6 and by_sex.points.shape[0] > 30000
    assert np.allclose(by_sex.points.mean(axis=0), 0.0, atol=1e-4)
    by_race = load_adult(shared_data("adult", "adult.data.gz"), group="race")
    assert "White" in by_race.group_names and len(by_race.group_names) == 5
    with pytest.raises(FairpipeInputError, match="Adult has no column 'gender'"):
        load_adult(shared_data("adult", "adult.data.gz"), group="gender")


def test_missing_files_and_bad_formats_are_named(tmp_path):
    with pytest.raises(FairpipeInputError, match="does not exist"):
        load_mnist_csv(tmp_path / "nope.csv")
    (tmp_path / "three.csv").write_text("1,2,3\n4,5,6\n")
    with pytest.raises(FairpipeInputError, match="785 columns .* Got 3"):
        load_mnist_csv(tmp_path / "three.csv")


def test_gaussian_is_deterministic():
    a = load_gaussian(n=5000, d=4, seed=2)
    b = load_gaussian(n=5000, d=4, seed=2)
    c = load_gaussian(n=5000, d=4, seed=3)
    assert np.array_equal(a.points, b.points) and not np.array_equal(a.points, c.points)
    assert a.points.shape == (5000, 4) and set(np.unique(a.groups)) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("url", "scheme", "kwargs"),
    [
        ("s3://bucket/a/b", "s3", {"bucket": "bucket", "prefix": "a/b"}),
        ("gs://bucket/x", "gcs", {"bucket": "bucket", "prefix": "x"}),
        ("r2://bucket/x", "r2", {"bucket": "bucket", "prefix": "x"}),
        ("tigris://bucket", "tigris", {"bucket": "bucket", "prefix": ""}),
        ("az://acct/cont/p/q", "azure", {"account": "acct", "container": "cont", "prefix": "p/q"}),
    ],
)
def test_object_store_urls_parse(url, scheme, kwargs):
    spec = parse_store_url(url)
    assert spec.scheme == scheme and spec.local_dir is None
    assert {k: spec.kwargs[k] for k in kwargs} == kwargs


def test_local_and_bad_urls(tmp_path):
    assert parse_store_url(str(tmp_path / "s")).local_dir == (tmp_path / "s").resolve()
    assert parse_store_url(f"file://{tmp_path}/s").local_dir == (tmp_path / "s").resolve()
    make_storage(str(tmp_path / "s"), parse_store_url(str(tmp_path / "s")))
    with pytest.raises(FairpipeInputError, match="unknown scheme 'ftp'"):
        parse_store_url("ftp://host/x")
    with pytest.raises(FairpipeInputError, match="names no bucket"):
        parse_store_url("s3:///x")
    with pytest.raises(FairpipeInputError, match="az://ACCOUNT/CONTAINER/PREFIX"):
        parse_store_url("az://acct")


def test_a_non_finite_csv_value_names_row_and_column(tmp_path):
    from fairpipe.datasets import plan_source, read_source_rows

    (tmp_path / "t.csv").write_text("id,a,b,g\n1,0.5,1.0,x\n2,0.25,inf,y\n")
    plan = plan_source(str(tmp_path / "t.csv"), id_column="id", group_column="g")
    with pytest.raises(
        FairpipeInputError, match=r"Line 3 of t.csv holds an inf value in column 'b'"
    ):
        read_source_rows(plan, 0, 2)


def test_ids_files_that_are_not_ids_are_named(tmp_path):
    from fairpipe.datasets import read_ids

    (tmp_path / "broken.npy").write_bytes(b"not numpy at all")
    with pytest.raises(FairpipeInputError, match="broken.npy is not a numeric .npy array"):
        read_ids(path=str(tmp_path / "broken.npy"))
    (tmp_path / "empty.npy").write_bytes(b"")
    with pytest.raises(FairpipeInputError, match="empty.npy is not a numeric .npy array"):
        read_ids(path=str(tmp_path / "empty.npy"))
    from fairpipe.datasets import plan_source

    np.save(tmp_path / "points.npy", np.zeros((5, 2)))
    cut = (tmp_path / "points.npy").read_bytes()[:100]
    (tmp_path / "cut.npy").write_bytes(cut)
    with pytest.raises(FairpipeInputError, match="cut.npy is not a numeric .npy matrix"):
        plan_source(str(tmp_path / "cut.npy"))
    (tmp_path / "none.npy").write_bytes(b"")
    with pytest.raises(FairpipeInputError, match="Groups file .*none.npy is not a .npy array"):
        plan_source(str(tmp_path / "points.npy"), groups_file=str(tmp_path / "none.npy"))
    np.save(tmp_path / "floats.npy", np.array([1.5, 2.0]))
    with pytest.raises(FairpipeInputError, match="Id 1.5 in row 1 of floats.npy is not an integer"):
        read_ids(path=str(tmp_path / "floats.npy"))
    np.save(tmp_path / "square.npy", np.array([[4, 5], [6, 7]]))
    with pytest.raises(FairpipeInputError, match=r"square.npy must be a list .*shape \(2, 2\)"):
        read_ids(path=str(tmp_path / "square.npy"))
    np.save(tmp_path / "ok.npy", np.array([4.0, 5.0]))  # integral floats: the ids 4 and 5
    assert read_ids(path=str(tmp_path / "ok.npy")).tolist() == [4, 5]


def test_group_codes_without_pandas_equal_pandas_codes():
    """Integer, boolean and string groups are coded by numpy alone; the codes and names equal
    those of the pandas path (names sorted as strings) that other values take."""
    import pandas as pd

    from fairpipe.datasets._sources import _codes

    def by_pandas(values):
        as_str = pd.Series(values).astype(str)
        names = sorted(as_str.unique().tolist())
        return as_str.map({nm: i for i, nm in enumerate(names)}).to_numpy(np.int32), names

    rng = np.random.default_rng(0)
    for values in (rng.integers(-20, 20, 500), rng.integers(0, 300, 500).astype(np.uint16),
                   rng.random(50) > 0.5, np.array(["b", "a", "é", "A", "b", "10", "9"]),
                   rng.integers(-(2**62), 2**62, 100), np.zeros(0, np.int64)):  # fmt: skip
        codes, names = _codes(values, "g.npy", "group")
        want_codes, want_names = by_pandas(values)
        assert names == want_names and codes.dtype == np.int32
        assert np.array_equal(codes, want_codes)
    codes, names = _codes(np.array([2.5, 1.0, 2.5]), "g.npy", "group")  # floats: pandas
    assert names == ["1.0", "2.5"] and codes.tolist() == [1, 0, 1]


def test_a_width_sample_reads_only_its_rows_and_equals_the_full_read(tmp_path, monkeypatch):
    """The rows the bucket width is estimated from: read alone from a ``.npy`` file and from a
    plain CSV (its lines found from the stored offsets; CRLF line ends, an id and a group
    column between the features, quoted values), the same values as reading the source in
    steps; a bad value in a sampled row is still reported with its row in the source."""
    import fairpipe.datasets._csv_scan as csv_scan
    import fairpipe.datasets._source_rows as source_rows
    from fairpipe.datasets import plan_source, read_source_sample

    monkeypatch.setattr(csv_scan, "OFFSET_STRIDE", 64)  # several strides in a small file
    rng = np.random.default_rng(3)
    X = rng.normal(size=(1000, 3)) * 1e3
    lines = ["a,id,b,g,c"] + [f'{x[0]!r},{i},"{x[1]!r}",g{i % 3},{x[2]:.9g}'
                              for i, x in enumerate(X.tolist())]  # fmt: skip
    (tmp_path / "t.csv").write_bytes(("\r\n".join(lines) + "\r\n").encode())
    np.save(tmp_path / "t.npy", (X * 1e3).astype(np.int64))
    rows = np.sort(rng.choice(1000, size=150, replace=False))
    for name, kw in [("t.csv", dict(id_column="id", group_column="g")), ("t.npy", {})]:
        plan = plan_source(str(tmp_path / name), **kw)
        assert source_rows._sample_rows(plan, rows) is not None, name  # the rows alone
        got = read_source_sample(plan, rows)
        with monkeypatch.context() as m:
            m.setattr(source_rows, "_sample_rows", lambda *a: None)
            want = read_source_sample(plan, rows, step=100)
        assert got.dtype == np.float32 and np.array_equal(got, want), name
    bad = 1 + int(rows[7])  # its line (after the header), counted from 0
    lines[bad] = "nan," + lines[bad].split(",", 1)[1]
    (tmp_path / "t.csv").write_bytes(("\r\n".join(lines) + "\r\n").encode())
    plan = plan_source(str(tmp_path / "t.csv"), id_column="id", group_column="g")
    with pytest.raises(FairpipeInputError, match=f"Line {bad + 1} of t.csv holds a NaN"):
        read_source_sample(plan, rows)


def test_a_csv_is_read_by_position_or_refused_naming_the_line(tmp_path, monkeypatch):
    """Rows are found by their line: every stride reads its own rows, with CRLF line ends,
    trailing empty lines and no final line end; an empty (or blank) line before the last row,
    which pandas would skip (shifting every later row onto the line above), and a quoted field
    holding a line break are refused naming what is wrong."""
    import fairpipe.datasets._csv_scan as csv_scan
    from fairpipe.datasets import plan_source, read_source_rows

    monkeypatch.setattr(csv_scan, "OFFSET_STRIDE", 8)
    rows = [f"{i},{i}.5" for i in range(100)]
    for text in ("a,b\n" + "\n".join(rows) + "\n", "a,b\n" + "\n".join(rows),
                 "a,b\r\n" + "\r\n".join(rows) + "\r\n\r\n\n  \n"):  # fmt: skip
        (tmp_path / "t.csv").write_bytes(text.encode())
        plan = plan_source(str(tmp_path / "t.csv"))
        assert plan.n == 100 and plan.row_offsets is not None
        for a, b in [(0, 7), (17, 40), (95, 100)]:
            assert read_source_rows(plan, a, b)[:, 0].tolist() == list(range(a, b))
    for middle in ("", "   "):
        text = "a,b\n" + "\n".join(rows[:10]) + f"\n{middle}\n" + "\n".join(rows[10:]) + "\n"
        (tmp_path / "t.csv").write_text(text)
        with pytest.raises(FairpipeInputError, match="t.csv has an empty line at line 12"):
            plan_source(str(tmp_path / "t.csv"))
    (tmp_path / "t.csv").write_text('a,b\n"1\n2",3\n' + "\n".join(rows) + "\n")
    with pytest.raises(FairpipeInputError, match="102 non-empty lines .* but 101 rows"):
        plan_source(str(tmp_path / "t.csv"))


@pytest.mark.parametrize(
    "size, value, says",
    [
        ("n", 10**13, "--gaussian-n option of the gaussian data set must be an integer from 1 to "
                      "2147483647: a store indexes at most 2\\^31 - 1 rows. Got 10000000000000"),
        ("d", 10**9, "--gaussian-d option .* from 1 to 8192: the generator makes 4,096 rows"),
        ("clusters", 10**12, "--gaussian-clusters option .* from 1 to 4096"),
        ("groups", 10**12, "--gaussian-groups option .* from 1 to 4096"),
        ("n", 0, "--gaussian-n option of the gaussian data set must be a positive integer"),
    ],
)  # fmt: skip
def test_gaussian_sizes_past_their_bounds_are_refused_before_anything_is_made(size, value, says):
    from fairpipe.datasets import check_gaussian_sizes, plan_source

    with pytest.raises(FairpipeInputError, match=says):
        check_gaussian_sizes({size: value})
    with pytest.raises(FairpipeInputError, match=says):
        plan_source("gaussian", gaussian={size: value})
    top = {"n": 2**31 - 1, "d": 8192, "clusters": 4096, "groups": 4096}
    check_gaussian_sizes(top)  # the bounds themselves are sizes


def test_a_parquet_column_of_lists_is_named_with_its_type_and_role(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fairpipe.datasets import plan_source

    columns = {"id": [1, 2], "x": [0.5, 1.5], "v": pa.array([[1.0, 2.0], [3.0]]),
               "g": ["a", "b"]}  # fmt: skip
    pq.write_table(pa.table(columns), tmp_path / "lists.parquet")
    (tmp_path / "folder").mkdir()
    pq.write_table(pa.table(columns), tmp_path / "folder" / "part-0.parquet")
    says = (r"^Column 'v' of (lists|part-0).parquet holds lists \(list<element: double>\); a "
            r"feature column must hold one number per row.$")  # fmt: skip
    for source in ("lists.parquet", "folder"):
        with pytest.raises(FairpipeInputError, match=says):
            plan_source(str(tmp_path / source), id_column="id", group_column="g")
    pq.write_table(pa.table({**columns, "v": [1.0, 2.0], "g": pa.array([["a"], ["b"]])}),
                   tmp_path / "groups.parquet")  # fmt: skip
    with pytest.raises(FairpipeInputError, match=r"Column 'g' of groups.parquet holds lists "
                       r".*; the group column \(--group-column\) must hold one name or number"):  # fmt: skip
        plan_source(str(tmp_path / "groups.parquet"), id_column="id", group_column="g")


def test_named_data_sets_that_are_not_utf8_csv_or_numbers_are_named(tmp_path):
    from fairpipe.datasets import load_bank, load_census_kdd

    (tmp_path / "latin.csv").write_bytes("age;balance\n3;caf\xe9\n".encode("latin-1"))
    for load in (load_mnist_csv, load_adult, load_bank):
        with pytest.raises(FairpipeInputError, match="^latin.csv is not UTF-8 text: line 2 holds "
                                                     "the byte 0xe9. Save it as UTF-8.$"):  # fmt: skip
            load(tmp_path / "latin.csv")
    with pytest.raises(FairpipeInputError, match="^latin.csv is not a CSV file pandas can read"):
        load_census_kdd(tmp_path / "latin.csv")  # (its columns are not found)
    row = ["39", "State-gov", "77516", "Bachelors", "13", "Never-married", "Adm-clerical",
           "Not-in-family", "White", "Male", "2174", "0", "40", "United-States", "<=50K"]  # fmt: skip
    (tmp_path / "adult.data").write_text(", ".join(row) + "\n" + ", ".join(["x", *row[1:]]) + "\n")
    with pytest.raises(FairpipeInputError,
                       match="^Line 2 of adult.data holds 'x' in column 'age', which must hold "
                             "numbers.$"):  # fmt: skip
        load_adult(tmp_path / "adult.data")
    (tmp_path / "w.bin").write_bytes(b"abc def\n")
    with pytest.raises(FairpipeInputError, match="the first line of a word2vec file is 'n d'"):
        load_word2vec_bin(tmp_path / "w.bin")
    (tmp_path / "w.bin").write_bytes(b"99999999999 99999999\n")
    with pytest.raises(FairpipeInputError, match="announces 99999999999 vectors of 99999999 "
                                                 "values, more than its 21 bytes hold"):  # fmt: skip
        load_word2vec_bin(tmp_path / "w.bin")
