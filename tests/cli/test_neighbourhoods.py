"""Neighbourhoods a user can trust, on the command line: ``ingest --scale`` (a table scaled by
default, the scaler kept in the store and applied to appends and to queries given by value; a
warning for wide spreads left unscaled), and ``sample`` leaving a query's own row out, saying
when its neighbourhood is empty or holds one point and which radius would hold about 50."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fairpipe.flows.cli import app
from fairpipe.storage import open_store
from fairpipe.storage.reader import open_reader
from fairpipe.storage.rows import unscale_points

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def people(n: int, seed: int, first_id: int = 0) -> pd.DataFrame:
    """Age in years and a weight in persons (10^4 times wider), with ids and a group."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": np.arange(first_id, first_id + n), "age": rng.normal(40, 12, n),
                         "weight": rng.normal(2e5, 1e5, n),
                         "flag": (rng.random(n) < 0.1).astype(float),
                         "sex": np.where(rng.random(n) < 0.4, "f", "m")})  # fmt: skip


COLUMNS = ["age", "weight", "flag"]
TABLE = ["--id-column", "id", "--group-column", "sex", "--n-hashes", 2, "--n-tables", 4]


@pytest.fixture(scope="module")
def scaled_store(prefect_server, dask_address, tmp_path_factory):
    """A CSV table ingested with the default scaling, then a second table appended."""
    folder = tmp_path_factory.mktemp("people")
    first, more = people(300, 1), people(40, 2, first_id=300)
    first.to_csv(folder / "first.csv", index=False)
    more.to_csv(folder / "more.csv", index=False)
    store = folder / "store"
    cluster = ["--dask-address", dask_address]
    made = invoke("ingest", folder / "first.csv", "--store", store, *TABLE, *cluster, "--json")
    assert made.exit_code == 0 and made.stderr == "", made.output
    appended = invoke("ingest", folder / "more.csv", "--store", store, "--id-column", "id",
                      "--group-column", "sex", *cluster, "--json")  # fmt: skip
    assert appended.exit_code == 0, appended.output
    return folder, store, first, more, json.loads(made.stdout), json.loads(appended.stdout)


def test_a_table_is_standardised_and_appends_use_the_stored_scaler(scaled_store):
    folder, store, first, more, made, appended = scaled_store
    assert made["scale"] == "standard" and appended["scale"] == "standard"
    st = open_store(str(store))
    scale = st.attrs()["scale"]
    raw = first[COLUMNS].to_numpy().astype(np.float32).astype(np.float64)
    assert np.allclose(scale["center"], raw.mean(0)) and np.allclose(scale["scale"], raw.std(0))
    points = st.read("points")
    assert np.allclose(points[:300].std(0), 1.0, atol=1e-5)
    # The appended rows: scaled with the first table's center and scale, not refitted.
    added = more[COLUMNS].to_numpy().astype(np.float32).astype(np.float64)
    expected = (added - raw.mean(0)) / raw.std(0)
    assert np.allclose(points[300:], expected, atol=1e-5)
    assert not np.allclose(points[300:].mean(0), 0.0, atol=1e-3)  # a refit would centre them
    assert np.allclose(unscale_points(st.attrs(), points[300:]), added, rtol=1e-6, atol=1e-4)
    # show prints a row as the table gave it: the source's column names and units.
    shown = invoke("show", "--store", store, "--ids", "305,7", "--json")
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.stdout)
    assert rows["feature_names"] == COLUMNS and rows["scale"] == "standard"
    given = pd.concat([first, more]).set_index("id")
    for row in rows["rows"]:
        assert np.allclose(row["features"], given.loc[row["id"], COLUMNS].to_numpy(float),
                           rtol=1e-5, atol=1e-3)  # fmt: skip
    text = invoke("show", "--store", store, "--ids", "305").stdout
    assert "weight" in text and "the store keeps them scaled: standard" in text


def test_a_query_given_by_value_is_scaled_as_the_stored_points(scaled_store, tmp_path):
    _, store, first, _, _, _ = scaled_store
    np.save(tmp_path / "q.npy", first[COLUMNS].to_numpy()[[5]])  # row 5, in the source's units
    out = invoke("sample", "--store", store, "--query-file", tmp_path / "q.npy", "--radius",
                 1e-3, "--n-samples", 3, "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["ids"] == [5, 5, 5] and res["neighbourhood_size"] == 1  # itself, by value


def test_an_append_with_another_scaling_is_refused(scaled_store):
    folder, store, *_ = scaled_store
    out = invoke("ingest", folder / "more.csv", "--store", store, "--id-column", "id",
                 "--group-column", "sex", "--scale", "robust")  # fmt: skip
    assert out.exit_code == 2
    assert "--scale robust contradicts the store" in out.stderr
    assert "built with --scale standard" in out.stderr


def test_unscaled_wide_spreads_are_warned_about_once(prefect_server, dask_address, tmp_path):
    people(200, 3).to_csv(tmp_path / "raw.csv", index=False)
    out = invoke("ingest", tmp_path / "raw.csv", "--store", tmp_path / "raw", *TABLE,
                 "--scale", "none", "--dask-address", dask_address)  # fmt: skip
    assert out.exit_code == 0, out.output
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, out.stderr
    assert "in column 'weight' (standard deviation" in warnings[0]
    assert "than in column 'flag'" in warnings[0] and "--scale standard" in warnings[0]
    assert open_store(str(tmp_path / "raw")).attrs()["scale"] == {"method": "none"}


def test_robust_scaling_falls_back_to_the_spread_where_the_iqr_is_zero(
    prefect_server, dask_address, tmp_path
):
    frame = people(200, 4)
    frame.to_csv(tmp_path / "t.csv", index=False)
    out = invoke("ingest", tmp_path / "t.csv", "--store", tmp_path / "r", *TABLE, "--scale",
                 "robust", "--dask-address", dask_address)  # fmt: skip
    assert out.exit_code == 0, out.output
    scale = open_store(str(tmp_path / "r")).attrs()["scale"]
    raw = frame[COLUMNS].to_numpy().astype(np.float32).astype(np.float64)
    q25, median, q75 = np.percentile(raw, [25, 50, 75], axis=0)
    assert scale["method"] == "robust" and np.allclose(scale["center"], median)
    assert np.allclose(scale["scale"][:2], (q75 - q25)[:2])
    assert q75[2] == q25[2] and np.isclose(scale["scale"][2], raw[:, 2].std())  # the rare flag


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scale", "minmax"], "must be one of 'auto', 'none', 'standard', 'robust'. Got "
                                "'minmax'"),
        ([], "Column 'const' of c.csv holds one value (3) in every row; --scale standard (a "
             "table's default) would divide it by 0. Remove the column, or ingest with --scale "
             "none."),
        (["--scale", "robust"], "Column 'const' of c.csv holds one value (3) in every row; "
                                "--scale robust"),
    ],
)  # fmt: skip
def test_bad_scaling_exits_2_and_writes_nothing(prefect_server, tmp_path, args, message):
    frame = people(50, 5)
    frame["const"] = 3.0
    frame.to_csv(tmp_path / "c.csv", index=False)
    out = invoke("ingest", tmp_path / "c.csv", "--store", tmp_path / "s", *TABLE, *args)
    assert out.exit_code == 2 and message in out.stderr, out.stderr
    assert out.stderr.startswith("error: ") and not (tmp_path / "s").exists()


def test_a_query_by_id_leaves_its_own_row_out_unless_included(digits_store):
    path, _ = digits_store
    args = ["sample", "--store", path, "--query-id", 42, "--radius", 25, "--n-samples", 300]
    left_out = json.loads(invoke(*args, "--json").stdout)
    kept = json.loads(invoke(*args, "--include-query", "--json").stdout)
    assert 42 not in left_out["ids"] and 42 in kept["ids"]
    assert kept["neighbourhood_size"] == left_out["neighbourhood_size"] + 1
    assert left_out["suggested_radius"] is None  # a neighbourhood of more than one point


def test_an_empty_neighbourhood_says_so_and_suggests_a_radius(digits_store):
    path, _ = digits_store
    args = ["sample", "--store", path, "--query-id", 42, "--radius", 1, "--n-samples", 5]
    res = json.loads(invoke(*args, "--json").stdout)
    assert res["neighbourhood_size"] == 0 and res["ids"] == []
    r, candidates = res["suggested_radius"], res["candidates"]
    assert r > 1 and candidates >= 50
    text = invoke(*args).stdout.splitlines()
    assert text[-1] == (
        f"query 0: its neighbourhood within r=1 is empty besides the query itself; try "
        f"--radius {r:.4g} (about 50 of the {candidates:,} candidates it read)"
    )
    # The radius suggested holds about 50 points (distances estimated from the sketch).
    wider = json.loads(invoke(*args[:-4], "--radius", r, "--n-samples", 5, "--json").stdout)
    assert 40 <= wider["neighbourhood_size"] <= 60 and wider["suggested_radius"] is None


def test_a_file_of_query_ids_is_answered_in_its_order_as_the_library_answers(digits_store,
                                                                             tmp_path):  # fmt: skip
    path, _ = digits_store
    wanted = [42, 7, 42, 100]
    (tmp_path / "q.txt").write_text("".join(f"{i}\n" for i in wanted))
    args = ["sample", "--store", path, "--radius", 25, "--n-samples", 50, "--json"]
    got = json.loads(invoke(*args, "--query-ids-file", tmp_path / "q.txt").stdout)["queries"]
    ref = open_reader(str(path)).sample(query_ids=wanted, radius=25, n_samples=50, seed=0,
                                        with_neighbourhood=True)  # fmt: skip
    assert len(got) == 4 and ref.neighbourhood_sizes is not None
    for i, q in enumerate(got):
        assert q["ids"] == ref.ids[i, : ref.counts[i]].tolist() and wanted[i] not in q["ids"]
        assert q["neighbourhood_size"] == int(ref.neighbourhood_sizes[i])
        alone = json.loads(invoke(*args, "--query-id", wanted[i]).stdout)
        assert alone["neighbourhood_size"] == q["neighbourhood_size"]  # as asked one by one
    assert got[0]["neighbourhood_size"] == got[2]["neighbourhood_size"]


@pytest.mark.parametrize(("lines", "also", "message"), [
    ("42\n99999\n", (), "error: Id 99999 is not in the store"),
    ("42\nabc\n", (), "line 2"),
    ("42\n", ("--query-id", 7), "error: Give exactly one of --query-id, --query-ids-file, "
                                 "--query-row or --query-file."),
])  # fmt: skip
def test_a_bad_file_of_query_ids_is_one_line_naming_it(digits_store, tmp_path, lines, also,
                                                       message):  # fmt: skip
    path, _ = digits_store
    (tmp_path / "q.txt").write_text(lines)
    out = invoke("sample", "--store", path, "--query-ids-file", tmp_path / "q.txt", *also)
    assert out.exit_code == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert message in out.stderr, out.stderr


def test_include_query_with_a_query_file_is_refused(digits_store, tmp_path):
    path, _ = digits_store
    np.save(tmp_path / "q.npy", np.zeros((1, 64)))
    out = invoke("sample", "--store", path, "--query-file", tmp_path / "q.npy", "--include-query")
    assert out.exit_code == 2 and out.stdout == ""
    assert out.stderr == (
        "error: --include-query applies to --query-id, --query-ids-file and --query-row: the "
        "points of --query-file are given by value, not rows of the store. Leave out "
        "--include-query.\n"
    )


def test_predict_scales_a_point_given_by_value(scaled_store, dask_address, tmp_path):
    _, store, first, _, _, _ = scaled_store
    fit = invoke("fit", "--store", store, "--n-clusters", 3, "--fanout", 2, "--height", 1,
                 "--dask-address", dask_address)  # fmt: skip
    assert fit.exit_code == 0, fit.output
    np.save(tmp_path / "q.npy", first[COLUMNS].to_numpy()[[5]])  # row 5, in the source's units
    by_value = json.loads(invoke("predict", "--store", store, "--query-file", tmp_path / "q.npy",
                                 "--json").stdout)  # fmt: skip
    by_row = json.loads(invoke("predict", "--store", store, "--query-row", 5, "--json").stdout)
    assert by_value["clusters"] == by_row["clusters"]
    assert np.allclose(by_value["distances"], by_row["distances"], atol=1e-5)
    # Many stored points by the file of their ids, in its order: as each asked by its row.
    ids = first["id"].to_numpy()[[5, 0, 5]]
    np.save(tmp_path / "ids.npy", ids)
    many = json.loads(invoke("predict", "--store", store, "--query-ids-file",
                             tmp_path / "ids.npy", "--json").stdout)  # fmt: skip
    one_by_one = [json.loads(invoke("predict", "--store", store, "--query-row", row,
                                    "--json").stdout) for row in (5, 0, 5)]  # fmt: skip
    assert many["clusters"] == [r["clusters"][0] for r in one_by_one]
    assert many["distances"] == [r["distances"][0] for r in one_by_one]


def test_a_one_point_neighbourhood_and_few_candidates_are_said_as_they_are():
    from fairpipe.flows.cli.sample import small_line

    one = {"neighbourhood_size": 1, "suggested_radius": 2.5, "candidates": 30}
    assert small_line(0, one, 1.0, True) == (
        "query 0: its neighbourhood within r=1 holds one point besides the query itself; try "
        "--radius 2.5 (all 30 candidates it read)"
    )
    assert small_line(0, {**one, "neighbourhood_size": 2}, 1.0, True) is None


def test_a_radius_beyond_the_range_says_so_and_configure_extends_the_range(
    prefect_server, tmp_path
):
    """A query beyond the store's radius range is answered with one line naming its expected
    recall and the command that extends the range (and the same in --json); that command adds
    scales, after which the radius is in range and its recall is the target's; info shows the
    range."""
    rng = np.random.default_rng(4)
    np.save(tmp_path / "x.npy", rng.normal(size=(3000, 6)).astype(np.float32))
    store = tmp_path / "s"
    made = invoke("ingest", tmp_path / "x.npy", "--store", store, "--max-radius", 1.5, "--json")
    assert made.exit_code == 0, made.output
    lsh = json.loads(made.stdout)["lsh"]
    assert lsh["max_radius"] == 1.5 and lsh["radius"] < 1.5
    args = ["sample", "--store", store, "--query-id", 7, "--radius", 3, "--n-samples", 4]
    res = json.loads(invoke(*args, "--json").stdout)
    command = f"fairpipe configure --store {store} --max-radius 3"
    assert res["in_range"] is False and res["max_radius"] == 1.5
    assert res["expected_recall"] < 0.9 and res["extend_range"] == command
    first = invoke(*args).stdout.splitlines()[0]
    assert first == (
        f"r=3 is outside the store's radius range (its recall target holds up to 1.5): "
        f"expected recall {res['expected_recall']:.3f}, so up to "
        f"{1 - res['expected_recall']:.0%} of the people within r are never drawn; extend the "
        f"range with: {command}"
    )
    extended = invoke(*command.split()[1:], "--json")
    assert extended.exit_code == 0, extended.output
    added = json.loads(extended.stdout)["radius_range"]
    assert added["before"] == 1.5 and added["max_radius"] == 3 and added["added"]
    res = json.loads(invoke(*args, "--json").stdout)
    assert res["in_range"] is True and res["expected_recall"] >= 0.98
    assert res["extend_range"] is None
    assert not invoke(*args).stdout.startswith("r=3 is outside")
    info = invoke("info", "--store", store).stdout
    assert "radius range up to 3," in info, info
