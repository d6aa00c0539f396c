"""The ``fairpipe`` command line, end to end: real flows, a real store, the user's error messages."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from flows.cli import app
from storage import open_store

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_sample_info_and_json_on_the_digits_store(digits_store):
    path, _ = digits_store
    out = invoke("sample", "--store", path, "--query-id", 42, "--radius", 25, "--samples", 30,
                 "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    q = res["queries"][0]
    assert len(q["ids"]) == 30 and q["neighbourhood_size"] >= 1
    # Every sampled id is a stored point within the radius of point 42.
    st = open_store(str(path))
    X = st.read("points")
    assert np.all(np.linalg.norm(X[q["ids"]] - X[42], axis=1) <= 25 + 1e-4)
    again = json.loads(
        invoke(
            "sample", "--store", path, "--query-id", 42, "--radius", 25, "--samples", 30, "--json"
        ).stdout  # fmt: skip
    )
    assert again["queries"][0]["ids"] == q["ids"]  # same seed, same samples
    other = invoke("sample", "--store", path, "--query-row", 42, "--radius", 25, "--samples", 30,
                   "--method", "rank", "--json")  # fmt: skip
    assert (
        other.exit_code == 0
        and json.loads(other.stdout)["queries"][0]["neighbourhood_size"]
        == (q["neighbourhood_size"])
    )
    info = invoke("info", "--store", path, "--json")
    assert info.exit_code == 0
    parsed = json.loads(info.stdout)
    assert parsed["n"] == 1797 and parsed["d"] == 64 and len(parsed["history"]) >= 2
    # The ingest's own checkpoints are marked internal; the human listing shows commits only.
    messages = {h["message"]: h["internal"] for h in parsed["history"]}
    assert messages["ingest digits"] is False
    assert messages["checkpoint before distributed writes"] is True
    text = invoke("info", "--store", path).stdout
    assert "ingest digits" in text and "checkpoint before" not in text
    assert "internal checkpoints of these commits not shown" in text


def test_sample_with_a_query_file(digits_store, tmp_path):
    path, _ = digits_store
    X = open_store(str(path)).read("points")
    np.save(tmp_path / "q.npy", X[[3, 9]] + 0.5)
    out = invoke("sample", "--store", path, "--query-file", tmp_path / "q.npy", "--radius", 30,
                 "--samples", 5, "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert [len(q["ids"]) for q in json.loads(out.stdout)["queries"]] == [5, 5]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--query-id", 999999], "999999"),
        (["--query-row", 5000], "5000"),
        (["--query-id", 1, "--radius", 0], "radius"),
        (["--query-id", 1, "--radius", -2], "radius"),
        (["--query-id", 1, "--samples", 0], "n_samples"),
        (["--query-id", 1, "--method", "fastest"], "method"),
        (["--query-id", 1, "--mode", "near"], "mode"),
        ([], "exactly one of --query-id, --query-row or --query-file"),
    ],
)
def test_bad_sample_arguments_exit_2_with_a_message(digits_store, args, message):
    path, _ = digits_store
    out = invoke("sample", "--store", path, *args)
    assert out.exit_code == 2
    assert message in out.output.replace("\n", " ")


def test_query_file_of_the_wrong_dimension(digits_store, tmp_path):
    path, _ = digits_store
    np.save(tmp_path / "q.npy", np.zeros((2, 5), np.float32))
    out = invoke("sample", "--store", path, "--query-file", tmp_path / "q.npy", "--radius", 3)
    assert out.exit_code == 2 and "64" in out.output and "5" in out.output


@pytest.mark.parametrize(
    ("option", "value", "name"),
    [("--lsh-k", 0, "lsh_k"), ("--lsh-tables", -1, "lsh_tables"), ("--lsh-width", 0, "lsh_width")],
)
def test_non_positive_lsh_parameters_write_nothing(prefect_server, tmp_path, option, value, name):
    store = tmp_path / "s"
    out = invoke("ingest", "digits", "--store", store, option, value)
    assert out.exit_code == 2
    assert f"'{name}'" in out.output and "positive" in out.output
    assert not store.exists() or not any(store.iterdir())


def test_bad_tables_name_the_column_or_row_and_write_nothing(prefect_server, tmp_path):
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [0.5, 0.1, 0.2], "sex": ["f", "m", "f"]})
    frame.to_csv(tmp_path / "ok.csv", index=False)
    store = tmp_path / "s"
    missing = invoke("ingest", tmp_path / "ok.csv", "--store", store, "--group-column", "gender")
    assert missing.exit_code == 2 and "gender" in missing.output
    text = frame.assign(b=["0.5", "x", "0.2"])
    text.to_csv(tmp_path / "text.csv", index=False)
    bad = invoke("ingest", tmp_path / "text.csv", "--store", store, "--group-column", "sex")
    assert bad.exit_code == 2 and "'b'" in bad.output
    (tmp_path / "empty.csv").write_text("a,b,sex\n")
    empty = invoke("ingest", tmp_path / "empty.csv", "--store", store, "--group-column", "sex")
    assert empty.exit_code == 2 and "empty" in empty.output.lower()
    assert not store.exists()  # the store a failed first ingest created is removed again


def test_not_a_store_and_a_missing_store(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("x")
    out = invoke("ingest", "digits", "--store", tmp_path / "mine")
    assert out.exit_code == 2 and "is not a fairpipe store" in out.output
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["thesis.tex"]
    info = invoke("info", "--store", tmp_path / "nothing")
    assert info.exit_code == 2 and "no fairpipe store" in info.output
