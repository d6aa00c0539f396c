"""summarize / forget flows on real Prefect + Dask, against the in-memory summary tree."""

import json

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from typer.testing import CliRunner

from fairpipe.flows.cli import app
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import IngestOptions, SummarizeOptions
from fairpipe.flows.summarize import run_summarize
from fairpipe.storage.arrays import read_array
from fairpipe.storage.store import FairpipeStore
from fairpipe.summary import FairSummary

NAMES = ["a", "b", "c", "rare"]
TREE = dict(fanout=4, height=2, eval_size=300, seed=2)  # the flow's options
MODEL = dict(fanout=4, height=2, eval_size=300, seed=2)  # the same tree in memory


def grouped_store(tmp_path, n=1600):
    X, _ = make_blobs(n_samples=n, n_features=5, centers=6, random_state=4)
    X = X.astype(np.float32)
    rng = np.random.default_rng(0)
    labels = np.array(["a", "b", "c"], dtype="<U4")[rng.integers(0, 3, size=n)]
    labels[rng.choice(n, size=9, replace=False)] = "rare"
    ids = np.arange(n, dtype=np.int64) * 3 + 7
    for name, arr in (("X", X), ("groups", labels), ("ids", ids)):
        np.save(tmp_path / f"{name}.npy", arr)
    opts = IngestOptions(
        n_hashes=4, n_tables=4, chunk_rows=400, ids_file=str(tmp_path / "ids.npy"),
        groups_file=str(tmp_path / "groups.npy"),
    )  # fmt: skip
    run_ingest(str(tmp_path / "X.npy"), str(tmp_path / "store"), opts)
    groups_of_rows = np.searchsorted(NAMES, labels)
    return tmp_path / "store", X, groups_of_rows, ids


def summary_arrays(path) -> dict:
    st = FairpipeStore.open(str(path))
    s = st.readonly_session()
    out = {"ids": read_array(s, "summary/ids")}
    for level in range(TREE["height"] + 1):
        for name in ("candidates", "evaluation", "value", "calls"):
            out[f"{level}/{name}"] = read_array(s, f"summary/level_{level}/{name}")
    return out


def test_summarize_and_forget_equal_the_in_memory_tree(prefect_server, tmp_path):
    path, X, groups_of_rows, ids = grouped_store(tmp_path)
    bounds = tmp_path / "bounds.json"
    bounds.write_text(json.dumps({"a": [2, 5], "b": [2, 5], "c": {"lower": 2, "upper": 5},
                                  "rare": [2, 5]}))  # fmt: skip
    opts = SummarizeOptions(k=12, bounds=str(bounds), **TREE)
    res = run_summarize(str(path), opts, n_workers=2)
    model = FairSummary(k=12, lower=[2] * 4, upper=[5] * 4, **MODEL).fit(
        X, ids=ids, groups=groups_of_rows
    )
    assert res["ids"] == model.summary_ids_.tolist() and res["value"] == model.value_
    assert res["error"] == 0 and res["counts"] == dict(zip(NAMES, model.counts_.tolist()))
    assert res["bounds"]["rare"] == [2, 5] and res["oracle_calls"] == model.oracle_calls_

    # Forget summary members and most of the rare group (4 of 9 left): only their paths change.
    gone = np.concatenate([model.summary_ids_[:2], ids[groups_of_rows == 3][:5]])
    out = run_forget(str(path), gone, n_workers=2)
    model.delete(gone)
    assert out["summary_error"] == 0
    assert 0 < out["summary_nodes_recomputed"] < 16 + 4 + 1
    after = summary_arrays(path)
    assert after["ids"].tolist() == model.summary_ids_.tolist()
    assert not np.isin(after["ids"], gone).any()
    # Deletion equivalence: a fresh summarize of the remaining points gives the same arrays.
    run_summarize(str(path), opts, n_workers=2)
    fresh = summary_arrays(path)
    for name, values in after.items():
        assert np.array_equal(values, fresh[name]), name


def test_summarize_bad_input_writes_nothing(prefect_server, tmp_path):
    path, *_ = grouped_store(tmp_path, n=400)
    st = FairpipeStore.open(str(path))
    before = st.repo.lookup_branch("main")
    cases = [
        (SummarizeOptions(k=40, lower=0.25, upper=0.5),
         "Group rare has 9 elements in the data but its lower bound is 10"),
        (SummarizeOptions(k=12), "No fairness bounds"),
        (SummarizeOptions(k=12, lower=0.1, bounds="b.json"), "either --lower/--upper or"),
        (SummarizeOptions(k=12, lower=1.5), "--lower must be a fraction of k between 0 and 1"),
        (SummarizeOptions(k=12, lower=0.4, upper=0.2), "Group a has lower bound 4 above its upper"),
        (SummarizeOptions(k=1000, lower=0.0, upper=1.0), "k = 1000 is larger than the 400 elements"),
        (SummarizeOptions(k=12, lower=0.1, upper=0.5, utility="coverage"), "'utility' parameter"),
        (SummarizeOptions(k=12, lower=0.1, upper=0.5, height=-1), "'height' parameter"),
    ]  # fmt: skip
    for opts, match in cases:
        with pytest.raises(Exception, match=match):
            run_summarize(str(path), opts, n_workers=1)
    for spec, match in [
        ({"a": [1, 3], "b": [1, 3], "c": [1, 3], "rare": [1, 3], "d": [0, 1]}, "names group 'd'"),
        ({"a": [1, 3], "b": [1, 3], "c": [1, 3]}, "gives no bounds for group 'rare'"),
        ({"a": [1, 3], "b": [1, 3], "c": [1, 3], "rare": "x"}, "group 'rare' has 'x'"),
    ]:
        f = tmp_path / "bounds.json"
        f.write_text(json.dumps(spec))
        with pytest.raises(Exception, match=match):
            run_summarize(str(path), SummarizeOptions(k=12, bounds=str(f)), n_workers=1)
    assert st.repo.lookup_branch("main") == before


def test_summarize_command_line(prefect_server, tmp_path):
    path, *_ = grouped_store(tmp_path, n=500)
    runner = CliRunner()
    args = ["summarize", "--store", str(path), "--k", "8", "--lower", "0.125", "--upper", "0.5",
            "--fanout", "2", "--height", "1", "--workers", "1"]  # fmt: skip
    out = runner.invoke(app, [*args, "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert len(res["ids"]) <= 8 and res["error"] == 0 and set(res["counts"]) == set(NAMES)
    assert all(1 <= c <= 4 for c in res["counts"].values())
    text = runner.invoke(app, [*args, "--utility", "facility", "--rule", "ck"])
    assert text.exit_code == 0 and "error(S) = 0" in text.stdout and "rare" in text.stdout
    bad = runner.invoke(app, ["summarize", "--store", str(path), "--k", "8"])
    assert bad.exit_code == 2 and "No fairness bounds" in bad.output


def test_the_random_reference_is_drawn_within_the_bounds_and_measured_on_other_points(
    monkeypatch,
):
    """The random reference draws from the root's evaluation points, tops up a group short of
    its lower bound with live rows read from the store (only those), and measures each draw on
    the evaluation points it did not draw: here, a reference computed by hand."""
    import fairpipe.flows.summarize as summarize
    from fairpipe.summary import NodeOutput, SummaryParams, Utility, random_feasible_rows
    from fairpipe.validation import IdLookup

    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3))
    groups = np.r_[np.zeros(150, int), np.ones(148, int), [2, 2]]  # group 2: rows 298, 299
    alive = np.ones(300, bool)
    alive[5] = False
    evaluation = np.r_[0:40, 150:190]  # ids = rows; group 2 has no evaluation point
    z = np.zeros(0, np.int64)
    root = NodeOutput(z, np.zeros((0, 3)), z, evaluation, X[evaluation])
    params = SummaryParams(k=6, lower=(1, 1, 2), upper=(3, 3, 2), seed=4)
    read = []

    def read_points_at(session, rows):
        read.append(rows.tolist())
        return X[rows]

    monkeypatch.setattr(summarize, "read_points_at", read_points_at)
    got = summarize.reference_utilities(None, root, params, groups, alive, IdLookup(np.arange(300)))
    assert read == [[298, 299]] and "unconstrained" not in got  # no candidates here
    # By hand: the same generator, the same pool (evaluation rows, then the group's top-up).
    rng = np.random.default_rng(4)
    rng.choice(np.array([298, 299]), size=2, replace=False)  # the top-up's draw
    pool = np.r_[evaluation, 298, 299]
    values = []
    for _ in range(summarize.REFERENCE_DRAWS):
        drawn = random_feasible_rows(groups[pool], params.lower, params.upper, 6, rng)
        assert np.bincount(groups[pool[drawn]], minlength=3).tolist()[2] == 2
        others = np.setdiff1d(evaluation, pool[drawn])
        values.append(Utility("exemplar", X[others]).value(X[pool[drawn]]))
    assert got["random"]["value"] == pytest.approx(np.mean(values))
