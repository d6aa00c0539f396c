"""The ``fairpipe`` command line, end to end: real flows, a real store, the user's error messages;
every command once, its result on stdout and nothing else there."""

import json
import pickle

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fairpipe.flows.cli import app
from fairpipe.neighbors import lsh_recall
from fairpipe.storage import open_store

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_sample_info_and_json_on_the_digits_store(digits_store):
    path, _ = digits_store
    out = invoke("sample", "--store", path, "--query-id", 42, "--radius", 25, "--n-samples", 30,
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
            "sample", "--store", path, "--query-id", 42, "--radius", 25, "--n-samples", 30, "--json"
        ).stdout  # fmt: skip
    )
    assert again["queries"][0]["ids"] == q["ids"]  # same seed, same samples
    other = invoke("sample", "--store", path, "--query-row", 42, "--radius", 25, "--n-samples", 30,
                   "--sampler", "rank", "--json")  # fmt: skip
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
                 "--n-samples", 5, "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert [len(q["ids"]) for q in json.loads(out.stdout)["queries"]] == [5, 5]


def test_sample_says_how_many_it_drew_and_why_fewer(digits_store, tmp_path, monkeypatch):
    """Every query reports asked, drawn, why and how it drew (--json); a query given fewer
    samples than asked gets one line saying why: an empty neighbourhood, or draws that reached
    their limit (made tiny here)."""
    import fairpipe.neighbors._degree_sampling as kernel

    path, _ = digits_store
    X = open_store(str(path)).read("points")
    np.save(tmp_path / "q.npy", np.vstack([X[3], np.full(64, 1e4, np.float32)]))
    args = ["sample", "--store", path, "--query-file", tmp_path / "q.npy", "--radius", 30]
    res = json.loads(invoke(*args, "--n-samples", 3000, "--json").stdout)
    near, far = res["queries"]
    assert {k: near[k] for k in ("asked", "drawn", "why", "path")} == {
        "asked": 3000, "drawn": 3000, "why": None, "path": "enumerate"}  # fmt: skip
    assert (far["asked"], far["drawn"], far["why"], far["ids"]) == (3000, 0, "empty", [])
    text = invoke(*args, "--n-samples", 5).stdout.splitlines()
    assert text[-2] == "query 1: 0 of 5 samples drawn: its neighbourhood M(q) is empty"
    assert text[-1] == (
        "query 1: its neighbourhood within r=30 is empty; its LSH buckets hold no point, so no "
        "radius helps here; a store ingested with a larger --radius has fuller buckets"
    )
    assert not any(line.startswith("query 0: 0 of") for line in text)
    monkeypatch.setattr(kernel, "MAX_DRAWS", 500)
    out = invoke("sample", "--store", path, "--query-id", 42, "--radius", 25, "--n-samples", 3000,
                 "--sampler", "approx")  # fmt: skip
    last = out.stdout.splitlines()[-1]
    assert (
        out.exit_code == 0
        and last.startswith("query 0: ")
        and " of 3,000 samples drawn: its draws reached their limit (500 draws" in last
    ), last


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--query-id", 999999], "999999"),
        (["--query-row", 5000], "5000"),
        (["--query-id", 1, "--radius", 0], "radius"),
        (["--query-id", 1, "--radius", -2], "radius"),
        (["--query-id", 1, "--n-samples", 0], "--n-samples"),
        (["--query-id", 1, "--sampler", "fastest"], "--sampler"),
        (["--query-id", 1, "--mode", "near"], "mode"),
        ([], "exactly one of --query-id, --query-ids-file, --query-row or --query-file"),
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
    [
        ("--n-hashes", 0, "n_hashes"),
        ("--n-tables", -1, "n_tables"),
        ("--bucket-width", 0, "bucket_width"),
    ],
)
def test_non_positive_lsh_parameters_write_nothing(prefect_server, tmp_path, option, value, name):
    store = tmp_path / "s"
    out = invoke("ingest", "digits", "--store", store, option, value)
    assert out.exit_code == 2
    said = f"The {option} option of fairpipe ingest must be "
    assert said + "a positive" in out.output or said + "an integer from 1 to" in out.output
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


def test_a_store_from_ingest_to_forget(dask_address, tmp_path):
    """ingest, fit, predict, summarize, forget and info on one small store, on one shared cluster."""
    store = tmp_path / "s"
    on_cluster = ["--dask-address", dask_address]
    made = invoke("ingest", "gaussian", "--store", store, "--gaussian-n", 400, "--gaussian-d", 4,
                  "--gaussian-clusters", 3, "--gaussian-groups", 2, "--n-hashes", 4, "--n-tables", 5,
                  *on_cluster, "--json")  # fmt: skip
    assert made.exit_code == 0 and made.stderr == "", made.output
    ingested = json.loads(made.stdout)  # one object, nothing else on stdout
    assert ingested["n"] == 400 and ingested["d"] == 4 and set(ingested["groups"]) == {"g0", "g1"}

    fit = invoke("fit", "--store", store, "--n-clusters", 3, "--fanout", 2, "--height", 1,
                 *on_cluster)  # fmt: skip
    assert fit.exit_code == 0 and fit.stderr == "", fit.output
    assert fit.stdout.startswith("fitted dc n_clusters=3 on 400 points (2 leaves, 3 nodes)")
    assert "cluster masses: " in fit.stdout

    predicted = invoke("predict", "--store", store, "--query-row", 7, "--json")
    assert predicted.exit_code == 0 and predicted.stderr == ""
    cluster = json.loads(predicted.stdout)["clusters"]
    np.save(tmp_path / "q.npy", open_store(str(store)).read("points", slice(7, 8)))
    text = invoke("predict", "--store", store, "--query-file", tmp_path / "q.npy")
    assert text.exit_code == 0 and text.stderr == ""
    assert text.stdout.startswith(f"cluster {cluster[0]}  distance ")

    summary = invoke("summarize", "--store", store, "--k", 4, "--lower", 0.25, "--upper", 0.75,
                     "--fanout", 2, "--height", 1, *on_cluster, "--json")  # fmt: skip
    assert summary.exit_code == 0 and summary.stderr == "", summary.output
    chosen = json.loads(summary.stdout)
    assert len(chosen["ids"]) == 4 and all(1 <= c <= 3 for c in chosen["counts"].values())

    gone = chosen["ids"][0]
    forgot = invoke("forget", "--store", store, "--ids", f"{gone},99999", *on_cluster)
    assert forgot.exit_code == 0 and forgot.stderr == "", forgot.output
    lines = forgot.stdout.splitlines()
    assert lines[0].startswith("forgot 1 ids (1 unknown, 0 already forgotten); commit ")
    assert "tree: " in forgot.stdout and "summary: " in forgot.stdout
    assert "unknown ids: [99999]" in lines and lines[-1].startswith("erased from history: 1 ")

    shown = invoke("info", "--store", store)
    assert shown.exit_code == 0 and shown.stderr == ""
    assert shown.stdout.startswith(f"{store}: 400 points (399 alive) x 4 dims")
    assert "fair summary: 4 of k=4" in shown.stdout and "forget 2 ids" in shown.stdout
    assert (
        gone not in json.loads(invoke("info", "--store", store, "--json").stdout)["summary"]["ids"]
    )


def test_sample_prints_its_result_on_stdout(digits_store):
    path, _ = digits_store
    out = invoke("sample", "--store", path, "--query-id", 42, "--radius", 25, "--n-samples", 7)
    assert out.exit_code == 0 and out.stderr == ""
    # (its tables given, one scale: its range ends at its radius, below 25)
    outside, promise, header, ids = out.stdout.splitlines()
    recall = json.loads(invoke("info", "--store", path, "--json").stdout)["lsh"]
    assert recall["max_radius"] == recall["radius"] < 25 and "scales" not in recall
    expected = lsh_recall(25, recall["n_hashes"], recall["n_tables"], recall["bucket_width"])
    assert outside.startswith(
        f"r=25 is outside the store's radius range (its recall target "
        f"holds up to {recall['radius']:.4g}): expected recall {expected:.3f}"
    )
    assert promise.startswith(f"expected recall {expected:.3f} at r=25: ")
    assert header.startswith("query 0: |M(q)| = ") and "(exact mode, exact sampler)" in header
    assert len(ids.split()) == 7
    as_json = json.loads(invoke("sample", "--store", path, "--query-id", 42, "--radius", 25,
                                "--json").stdout)  # fmt: skip
    assert as_json["expected_recall"] == pytest.approx(expected)


def test_rerank_command(dask_address, tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"list": np.repeat(["a", "b", "c"], 8), "score": rng.random(24),
                          "group": rng.choice(["f", "m"], 24)})  # fmt: skip
    frame.to_csv(tmp_path / "c.csv", index=False)
    args = ["rerank", tmp_path / "c.csv", "--k", 4, "--dask-address", dask_address]
    out = invoke(*args, "--out", tmp_path / "top.csv", "--json")
    assert out.exit_code == 0 and out.stderr == "", out.output
    r = json.loads(out.stdout)
    assert r["lists"] == 3 and r["rows_out"] == 12 and len(pd.read_csv(tmp_path / "top.csv")) == 12
    text = invoke(*args, "--out", tmp_path / "top.parquet")
    assert text.exit_code == 0 and text.stderr == ""
    assert text.stdout.startswith("re-ranked 3 lists (24 candidates) with detconstsort, top 4")
    assert "lists infeasible" in text.stdout


def test_audit_command(dask_address, tmp_path):
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.integers(0, 5, size=(200, 3)), columns=["a", "b", "c"])
    frame.insert(0, "sex", rng.integers(0, 2, size=200))
    frame["label"] = (frame["a"] + 3 * frame["sex"] > 4).astype(int)
    frame.to_csv(tmp_path / "d.csv", index=False)
    X, y = frame.drop(columns="label").to_numpy(), frame["label"].to_numpy()
    with open(tmp_path / "m.pkl", "wb") as fh:
        pickle.dump(LogisticRegression().fit(X, y), fh)
    args = ["audit", "--dataset", tmp_path / "d.csv", "--protected", "sex", "--model",
            tmp_path / "m.pkl", "--n-seeds", 10, "--n-local", 10, "--no-baselines",
            "--dask-address", dask_address]  # fmt: skip
    out = invoke(*args, "--json")
    assert out.exit_code == 0 and out.stderr == "", out.output  # no progress bar with --json
    r = json.loads(out.stdout)
    assert r["model"] == "LogisticRegression" and "aequitas" not in r and r["adf"]["ids"] >= 0
    text = invoke(*args)
    assert text.exit_code == 0, text.output
    assert "discrimination rate" in text.stdout and "ADF" in text.stdout
    assert "discrimination rate" not in text.stderr  # the progress bar only


def test_demo_command_prints_progress_on_stderr_and_the_report_on_stdout(monkeypatch, tmp_path):
    """The command around the demo (the demo itself runs end to end in tests/flows/test_demo.py)."""
    import fairpipe.flows.demo

    def demo(store, n_queries, seed, plot, log):
        log(f"[1/6] ingest digits into {store}")
        methods = {m: {"tv": 0.1, "ratio_to_floor": 1.5, "tv_ball": 0.2, "ball_ratio_to_floor": 3.0,
                       "samples_per_s": 1e5} for m in ("exact", "uniform")}  # fmt: skip
        evaluation = {"queries": n_queries, "neighbourhood_sizes": [3, 9], "noise_floor": 0.05,
                      "ball_sizes": [4, 10], "mean_coverage": 0.85, "min_coverage": 0.75,
                      "methods": methods}  # fmt: skip
        return {"store": store, "plot": plot, "seconds": 1.0, "evaluation": evaluation}

    monkeypatch.setattr(fairpipe.flows.demo, "run_demo", demo)
    args = ["demo", "--store", tmp_path / "d", "--queries", 4, "--plot", tmp_path / "tv.png"]
    out = invoke(*args)
    assert out.exit_code == 0
    assert out.stderr == f"[1/6] ingest digits into {tmp_path / 'd'}\n"
    assert out.stdout.startswith(
        "M(q), the points the index finds (|M(q)| 3-9), holds 85.0% of the true ball B(q, r) "
        "(|B(q, r)| 4-10) on average; the worst query 75.0%\n"
    )
    assert "TV to uniform: 4 queries, noise floor 0.0500" in out.stdout
    assert out.stdout.endswith(
        f"plot: {tmp_path / 'tv.png'}\nstore: {tmp_path / 'd'}\ntotal 1.0 s\n"
    )
    quiet = invoke(*args, "--json")
    assert quiet.stderr == "" and json.loads(quiet.stdout)["evaluation"]["queries"] == 4


def test_every_command_is_registered_in_order():
    names = [c.name or c.callback.__name__ for c in app.registered_commands]  # type: ignore[union-attr]
    assert names == ["ingest", "show", "sample", "fit", "rerank", "audit", "forget",
                     "request_deletion", "receipts", "status", "configure", "backfill", "summarize",
                     "predict", "info", "history", "verify", "demo"]  # fmt: skip


def test_read_only_commands_as_the_program_end_with_their_whole_result(digits_store):
    """Run as the ``fairpipe`` program, a query ends as soon as its result is out (no interpreter
    teardown): the output is complete and the same as in-process, the exit code 0; a failure
    still exits 2 with its message."""
    import os
    import subprocess
    import sys

    path, _ = digits_store
    exe = sys.executable.replace("python", "fairpipe")
    env = {**os.environ, "PREFECT_HOME": os.environ.get("PREFECT_HOME", "")}
    for args in (["sample", "--store", path, "--query-id", 42, "--radius", 25, "--n-samples", 30],
                 ["info", "--store", path], ["status", "--store", path],
                 ["receipts", "--store", path]):  # fmt: skip
        for fmt in ([], ["--json"]):
            argv = [str(a) for a in args + fmt]
            got = subprocess.run([exe, *argv], capture_output=True, text=True, env=env,
                                 timeout=120)  # fmt: skip
            want = invoke(*argv)
            assert got.returncode == 0 == want.exit_code, got.stderr
            if fmt:  # the same result but for the run's own timings
                mine, theirs = json.loads(got.stdout), json.loads(want.stdout)
                assert {**mine, "timings": 0} == {**theirs, "timings": 0}
            else:
                assert got.stdout == want.stdout
    bad = subprocess.run([exe, "sample", "--store", str(path), "--query-row", "99999"],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "99999" in bad.stderr and bad.stdout == ""


def test_ingest_chooses_lsh_parameters_for_a_recall_and_info_shows_it(dask_address, tmp_path):
    """A new store's k, L and w are those ``choose_scales`` gives (one choice per scale) on the same data for
    the same recall; the expected recall is printed, stored, shown by info, kept by an append,
    and the store's radius is the sample command's default."""
    from fairpipe.neighbors import DEFAULT_RECALL, choose_scales, lsh_recall

    rng = np.random.default_rng(4)
    centres = 5 * rng.normal(size=(3, 8))
    X = (rng.normal(size=(3000, 8)) + centres[rng.integers(3, size=3000)]).astype(np.float32)
    np.save(tmp_path / "x.npy", X[:2500])
    np.save(tmp_path / "more.npy", X[2500:])
    np.save(tmp_path / "more_ids.npy", np.arange(2500, 3000))
    on_cluster = ["--dask-address", dask_address]
    store = tmp_path / "s"
    made = invoke("ingest", tmp_path / "x.npy", "--store", store, "--recall", 0.9, *on_cluster,
                  "--json")  # fmt: skip
    assert made.exit_code == 0, made.output
    res = json.loads(made.stdout)
    lsh = res["lsh"]
    choices = choose_scales(X[:2500], recall=0.9)  # r, 2 r, 4 r
    choice = choices[0]
    assert (lsh["n_hashes"], lsh["n_tables"], lsh["bucket_width"]) == (
        choice.n_hashes, sum(c.n_tables for c in choices), choice.bucket_width)  # fmt: skip
    assert lsh["scales"] == [[c.radius, c.bucket_width, c.n_tables] for c in choices]
    assert lsh["max_radius"] == choices[-1].radius == pytest.approx(4 * choice.radius)
    assert lsh["recall_target"] == 0.9 and lsh["expected_recall"] == choice.expected_recall >= 0.9
    assert lsh["radius"] == res["suggested_radius"] == choice.radius
    assert lsh["expected_candidates"] == pytest.approx(choice.expected_candidates)
    text = invoke("info", "--store", store).stdout
    line = f"chosen for recall 0.9: expected recall {choice.expected_recall:.4g} at radius"
    assert line in text
    assert json.loads(invoke("info", "--store", store, "--json").stdout)["lsh"] == lsh
    sampled = json.loads(invoke("sample", "--store", store, "--query-row", 3, "--json").stdout)
    assert sampled["radius"] == choice.radius
    # An append keeps the store's parameters and their record; another recall is refused.
    clash = invoke("ingest", tmp_path / "more.npy", "--store", store, "--ids-file",
                   tmp_path / "more_ids.npy", "--recall", 0.8, *on_cluster)  # fmt: skip
    assert clash.exit_code == 2
    assert (
        "--recall 0.8 contradicts the store" in clash.stderr and "with --recall 0.9" in clash.stderr
    )
    more = invoke("ingest", tmp_path / "more.npy", "--store", store, "--ids-file",
                  tmp_path / "more_ids.npy", "--recall", 0.9, *on_cluster, "--json")  # fmt: skip
    assert more.exit_code == 0, more.output
    assert {k: v for k, v in json.loads(more.stdout)["lsh"].items() if k in lsh} == lsh

    # Given k, L and w: the recall they give at --radius is printed and stored, no target.
    given = invoke("ingest", tmp_path / "x.npy", "--store", tmp_path / "g", "--n-hashes", 6,
                   "--n-tables", 10, "--bucket-width", 4.0, "--radius", 1.5, *on_cluster)  # fmt: skip
    assert given.exit_code == 0, given.output
    recall = lsh_recall(1.5, 6, 10, 4.0)
    assert (
        f"LSH: n_hashes=6 n_tables=10 bucket_width=4, given: expected recall {recall:.4g} at radius 1.5;"
        in given.stdout
    )
    attrs = open_store(str(tmp_path / "g")).attrs()
    assert attrs["lsh"]["recall_target"] is None and attrs["lsh"]["expected_recall"] == recall
    assert attrs["suggested_radius"] == 1.5
    # Given k only: the chooser fills in L and w.
    partial = invoke("ingest", tmp_path / "x.npy", "--store", tmp_path / "p", "--n-hashes", 3,
                     *on_cluster, "--json")  # fmt: skip
    assert partial.exit_code == 0, partial.output
    lsh = json.loads(partial.stdout)["lsh"]
    assert lsh["n_hashes"] == 3 and lsh["recall_target"] == DEFAULT_RECALL == 0.98
    assert lsh["expected_recall"] >= 0.98 and len(lsh["scales"]) == 3


def test_version_prints_the_installed_version():
    import importlib.metadata

    out = invoke("--version")
    assert (
        out.exit_code == 0 and out.stdout == f"fairpipe {importlib.metadata.version('fairpipe')}\n"
    )
