"""Results a user can read: ``show``, ``history`` (the lineage log, kept through erasure), the
fit's objective, the summary's reference utilities, ``info``'s parameters, ``predict
--query-id``; on one small store that lives through ingest, fit, summarize and a drain."""

import json
import re
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from fairpipe.flows.cli import app
from fairpipe.storage import open_store

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def run_json(*args: object) -> dict:
    out = invoke(*args, "--json")
    assert out.exit_code == 0 and out.stderr == "", out.output
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def lived(dask_address, tmp_path_factory):
    """A store ingested, fitted, summarized, then one of its summary's ids forgotten (default
    retention: the drain expires every earlier snapshot)."""
    store = tmp_path_factory.mktemp("results") / "s"
    on_cluster = ["--dask-address", dask_address]
    run = {}
    run["ingest"] = run_json("ingest", "gaussian", "--store", store, "--gaussian-n", 400,
                             "--gaussian-d", 4, "--gaussian-clusters", 3, "--gaussian-groups", 2,
                             "--lsh-k", 4, "--lsh-tables", 5, *on_cluster)  # fmt: skip
    run["fit"] = run_json("fit", "--store", store, "--k", 3, "--tree-width", 2, "--tree-height",
                          1, *on_cluster)  # fmt: skip
    run["summarize"] = run_json("summarize", "--store", store, "--k", 4, "--lower", 0.25,
                                "--upper", 0.75, "--tree-width", 2, "--tree-height", 1,
                                *on_cluster)  # fmt: skip
    run["points"] = open_store(str(store)).read("points").astype(np.float64)  # all alive
    gone = run["summarize"]["ids"][:2]
    # Ids unlike the history's other numbers (counts, clock fields), so that finding one there
    # would mean an id leaked (the data and the summary are the same at every run).
    assert all(i > 60 and i not in (396, 397, 398, 399, 400) for i in gone), gone
    run["forget"] = run_json("forget", "--store", store, "--ids", ",".join(map(str, gone)),
                             "--reason", "asked by mail", *on_cluster)  # fmt: skip
    return store, gone, run


def test_fit_reports_the_k_means_objective(lived, capsys):
    store, gone, run = lived
    fit = run["fit"]
    X = run["points"]  # as they were fitted
    C = np.asarray(fit["centroids"])[np.asarray(fit["masses"]) > 0]
    expected = ((X[:, None, :] - C[None]) ** 2).sum(axis=2).min(axis=1)
    assert fit["inertia"] == pytest.approx(expected.sum(), rel=1e-6)
    assert fit["mean_squared_distance"] == pytest.approx(expected.sum() / 400, rel=1e-6)
    from fairpipe.flows.cli.fit import _render

    _render(fit)
    assert f"k-means cost (inertia, the sum of squared distances to the nearest centroid) " \
           f"{fit['inertia']:.6g}; " in capsys.readouterr().out  # fmt: skip


def test_the_summary_utility_is_printed_beside_references(lived, capsys):
    _, _, run = lived
    s = run["summarize"]
    ref = s["reference"]
    assert ref["random"]["draws"] == 5 and 0 < ref["random"]["value"] < s["value"]
    assert ref["unconstrained"]["value"] >= 0.9 * s["value"]
    from fairpipe.flows.cli.summarize import _render

    _render(s)
    text = capsys.readouterr().out
    assert (
        f"references from the same evaluation points: {ref['random']['value']:.4g} for a random "
        f"selection of 4 within the same bounds (mean of 5)" in text
    )
    assert f"{s['value'] / ref['random']['value']:.2f}x" in text
    assert "without the bounds (the bounds cost " in text


def test_show_prints_live_rows_and_forgotten_ids_with_their_receipt(lived):
    store, gone, _ = lived
    st = open_store(str(store))
    ids, alive = st.read("ids"), st.read("alive")
    live = [int(i) for i in ids[alive][[5, 0]]]  # not in row order
    res = run_json("show", "--store", store, "--ids", ",".join(map(str, [*live, gone[0]])))
    first, second, forgotten = res["rows"]
    assert [first["id"], second["id"], forgotten["id"]] == [live[0], live[1], gone[0]]
    row = int(np.flatnonzero(ids == live[0])[0])
    assert first["features"] == pytest.approx(st.read("points")[row].tolist())
    assert first["group"] in ("g0", "g1") and first["forgotten"] is False
    receipts = run_json("receipts", "--store", store)
    receipt = forgotten["receipt"]
    assert forgotten["forgotten"] is True and set(forgotten) == {
        "id", "row", "forgotten", "forgotten_at", "receipt"}  # fmt: skip
    assert receipt["request"] in json.dumps(receipts) and receipt["reason"] == "asked by mail"
    assert forgotten["forgotten_at"] == receipt["applied_at"] is not None
    assert receipt["erased_at"] is not None  # the default retention: erased when the drain ends
    text = invoke("show", "--store", store, "--ids", f"{live[0]},{gone[1]}")
    assert text.exit_code == 0 and str(live[0]) in text.stdout
    assert f"id {gone[1]}: forgotten at {receipt['applied_at']} by request " in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ids", "5,987654,987655"], "Id 987654 is not in the store"),
        (["--ids", "x"], "--ids"),
        ([], "Give exactly one of --ids or --ids-file."),
    ],
)
def test_show_bad_input_exits_2(lived, args, message):
    store, _, _ = lived
    out = invoke("show", "--store", store, *args)
    assert out.exit_code == 2 and message in out.stderr and out.stdout == ""


def test_history_lists_every_operation_through_erasure_and_no_id(lived):
    store, gone, run = lived
    res = run_json("history", "--store", store)
    ops = res["operations"]
    assert [op["operation"] for op in ops] == ["ingest", "fit", "summarize", "drain",
                                              "erase-history"]  # fmt: skip
    assert res["complete"] is True and all(op["logged"] for op in ops)
    # The snapshots of the ingest, the fit and the summary are expired; their commits stay.
    st = open_store(str(store))
    kept = {h["id"] for h in st.history()}
    assert run["fit"]["commit"] not in kept
    for name in ("ingest", "fit", "summarize"):
        assert next(op for op in ops if op["operation"] == name)["commit"] == run[name]["commit"]
    fit = ops[1]
    assert fit["parameters"]["n_clusters"] == 3 and fit["parameters"]["model"] == "dc"
    assert fit["figures"]["inertia"] == pytest.approx(run["fit"]["inertia"])
    assert ops[0]["rows"] == {"added": 400, "n": 400, "n_alive": 400, "d": 4}
    assert ops[3]["rows"]["erased"] == 2 and ops[3]["rows"]["n_alive"] == 398
    # No id of the drain in the output, nor in the stored log; not its reason either: no
    # number standing alone (not part of a commit id, an operation key or a decimal) is one.
    from fairpipe.storage.lineage import LINEAGE

    raw = bytes(st.read(LINEAGE)).decode()
    text = invoke("history", "--store", store).stdout
    for where in (json.dumps(res), raw, text):
        assert "asked by mail" not in where
        numbers = set(re.findall(r"(?<![0-9A-Za-z.])[0-9]+(?![0-9A-Za-z.])", where))
        assert numbers.isdisjoint(map(str, gone)), numbers
    assert "  drain  commit " in text and "  erase-history  commit " in text
    assert "    results: inertia=" in text


def test_history_names_a_backfill_and_a_configure(lived, dask_address, tmp_path):
    store, _, _ = lived
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    ids = open_store(str(copy)).read("ids")[open_store(str(copy)).read("alive")]
    assert invoke("configure", "--store", copy, "--erasure-retention", "24h").exit_code == 0
    (tmp_path / "backlog.txt").write_text(f"{ids[0]}\n{ids[1]}\n")
    out = invoke("backfill", "--store", copy, "--ids-file", tmp_path / "backlog.txt",
                 "--dask-address", dask_address)  # fmt: skip
    assert out.exit_code == 0, out.output
    ops = run_json("history", "--store", copy)["operations"]
    assert [op["operation"] for op in ops[-2:]] == ["configure", "backfill"]
    assert ops[-2]["parameters"] == {"erasure_retention": "24h", "before": "0"}
    assert ops[-1]["rows"]["erased"] == 2 and ops[-2]["commit"] is not None


def test_history_of_a_store_without_a_lineage_log_shows_its_commits(lived, tmp_path):
    store, _, _ = lived
    old = tmp_path / "old"
    shutil.copytree(store, old)
    st = open_store(str(old))
    with st.transaction("drop the log") as txn:
        del txn.root["lineage"]
    res = run_json("history", "--store", old)
    assert res["complete"] is False and not any(op["logged"] for op in res["operations"])
    assert [op["operation"] for op in res["operations"]][-1] == "drop"
    text = invoke("history", "--store", old).stdout
    assert "does not cover its whole life" in text


def test_history_and_show_on_a_folder_that_is_not_a_store(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    for args in (["history"], ["show", "--ids", "1"]):
        out = invoke(*args, "--store", tmp_path / "mine")
        assert out.exit_code == 2 and "is not a fairpipe store" in out.stderr


def test_predict_by_query_id_and_info_shows_the_parameters(lived):
    store, gone, run = lived
    st = open_store(str(store))
    ids, alive = st.read("ids"), st.read("alive")
    row = int(np.flatnonzero(alive)[7])
    by_id = run_json("predict", "--store", store, "--query-id", int(ids[row]))
    by_row = run_json("predict", "--store", store, "--query-row", row)
    assert by_id["clusters"] == by_row["clusters"] and by_id["distances"] == by_row["distances"]
    for bad, message in ((gone[0], "has been forgotten"), (987654, "is not in the store")):
        out = invoke("predict", "--store", store, "--query-id", bad)
        assert out.exit_code == 2 and message in out.stderr and str(bad) in out.stderr
    info = run_json("info", "--store", store)
    assert info["clustering"]["parameters"] == {"n_clusters": 3, "fanout": 2, "height": 1,
                                                "max_iter": 10, "n_init": 10, "seed": 0}  # fmt: skip
    assert info["clustering"]["fitted"]["inertia"] == pytest.approx(run["fit"]["inertia"])
    assert info["summary"]["parameters"]["k"] == 4
    text = invoke("info", "--store", store).stdout
    assert "model: dc (n_clusters=3, fanout=2, height=1, max_iter=10, n_init=10, seed=0)" in text
    assert "summary parameters: k=4, lower=[1, 1], upper=[3, 3], utility=exemplar" in text


def test_show_never_cuts_an_id_or_a_group_to_fit_the_features(capsys):
    from fairpipe.flows.cli.show import _render

    big = 2**62 + 12345
    rows = [{"id": big, "row": 0, "forgotten": False, "group": "a rather long group name",
             "features": [-1234.5678] * 64}]  # fmt: skip
    _render({"store": "s", "d": 64, "feature_names": [f"x{j}" for j in range(64)],
             "scale": "none", "rows": rows})  # fmt: skip
    text = capsys.readouterr().out
    assert str(big) in text and "a rather long group name" in text and "…" not in text
    assert max(map(len, text.splitlines())) <= 80
    shown = text.splitlines()[-1]
    assert shown.startswith("(the first ") and shown.endswith(" of 64 features; --json has all)")
