"""The rerank flow and command: per list equal to the kernels, Dask == in process, bad input."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fairpipe.flows.cli import app
from fairpipe.flows.options import RerankOptions
from fairpipe.flows.rerank import run_rerank
from fairpipe.ranking import infeasible_index, rerank


def candidates(path, n_lists=40, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_lists):
        n = int(rng.integers(5, 60))
        for j in range(n):
            rows.append({"query": f"q{i}", "person": i * 1000 + j, "relevance": rng.random(),
                         "sex": "f" if rng.random() < 0.3 else "m"})  # fmt: skip
    frame = pd.DataFrame(rows).sample(frac=1.0, random_state=1)  # lists interleaved
    frame.to_csv(path, index=False)
    return frame


OPTS = dict(list_column="query", score_column="relevance", group_column="sex", k=20)


def test_rerank_flow_equals_the_kernel_per_list_and_dask_equals_local(prefect_server, tmp_path):
    frame = candidates(tmp_path / "c.csv")
    desired = tmp_path / "p.json"
    desired.write_text(json.dumps({"f": 0.5, "m": 0.5}))
    o = RerankOptions(algorithm="detconstsort", desired=str(desired), **OPTS)
    local = run_rerank(tmp_path / "c.csv", tmp_path / "top.csv", o)
    out = pd.read_csv(tmp_path / "top.csv")
    assert set(out.columns) == set(frame.columns) | {"rank"}
    for q, sub in frame.groupby("query", sort=False):
        got = out[out["query"] == q]
        assert got["rank"].tolist() == list(range(1, min(20, len(sub)) + 1))
        codes = (sub["sex"] == "m").astype(int).to_numpy()
        want = rerank(sub["relevance"].to_numpy()[None], codes[None], [0.5, 0.5], 20)[0]
        want = sub["person"].to_numpy()[want[want >= 0]]
        assert got["person"].tolist() == want.tolist()
        ranked = (got["sex"] == "m").astype(int).to_numpy()[None]
        if min((codes == 0).sum(), (codes == 1).sum()) >= 10:  # enough of each group
            assert infeasible_index(ranked, [0.5, 0.5])[0] == 0
    metrics = pd.read_csv(tmp_path / "top.metrics.csv")
    assert len(metrics) == 40 and (metrics["ndcg_before"] == 1.0).all()
    assert local["mean"]["after"]["ndkl"] < local["mean"]["before"]["ndkl"]
    # The same through Dask tasks (4 batches of lists) and to Parquet.
    o2 = RerankOptions(algorithm="detconstsort", desired=str(desired), partitions=4, **OPTS)
    run_rerank(tmp_path / "c.csv", tmp_path / "top.parquet", o2, n_workers=2)
    dask_out = pd.read_parquet(tmp_path / "top.parquet")
    pd.testing.assert_frame_equal(dask_out, out, check_dtype=False)
    assert pd.read_csv(tmp_path / "top.metrics.csv").equals(metrics)


def test_population_and_every_algorithm_from_the_command_line(prefect_server, tmp_path):
    candidates(tmp_path / "c.csv", n_lists=10)
    runner = CliRunner()
    for algorithm in ("detgreedy", "detcons", "detrelaxed", "detconstsort"):
        res = runner.invoke(app, ["rerank", str(tmp_path / "c.csv"), "--out",
                                  str(tmp_path / f"{algorithm}.csv"), "--algorithm", algorithm,
                                  "--list-column", "query", "--score-column", "relevance",
                                  "--group-column", "sex", "--k", "10", "--workers", "1",
                                  "--json"])  # fmt: skip
        assert res.exit_code == 0, res.output
        r = json.loads(res.stdout)
        assert r["lists"] == 10 and r["groups"] == ["f", "m"]
        assert r["mean"]["after"]["infeasible_index"] <= r["mean"]["before"]["infeasible_index"]
    text = runner.invoke(app, ["rerank", str(tmp_path / "c.csv"), "--out", str(tmp_path / "t.csv"),
                               "--list-column", "query", "--score-column", "relevance",
                               "--group-column", "sex", "--workers", "1"])  # fmt: skip
    assert text.exit_code == 0 and "lists infeasible" in text.stdout


def test_bad_input_is_named_and_nothing_is_written(tmp_path):
    frame = candidates(tmp_path / "c.csv", n_lists=3)
    good = tmp_path / "p.json"
    good.write_text(json.dumps({"f": 0.5, "m": 0.5}))
    nan = frame.copy()
    nan.iloc[4, nan.columns.get_loc("relevance")] = np.nan
    nan.to_csv(tmp_path / "nan.csv", index=False)
    (tmp_path / "empty.csv").write_text("query,relevance,sex\n")
    files = {}
    for name, spec in (("sum", {"f": 0.5, "m": 0.6}), ("neg", {"f": 1.2, "m": -0.2}),
                       ("few", {"f": 1.0}), ("extra", {"f": 0.4, "m": 0.4, "x": 0.2})):  # fmt: skip
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(spec))
    cases = [
        ("c.csv", dict(desired=str(files["sum"])), "the shares sum to 1.1, not 1"),
        ("c.csv", dict(desired=str(files["neg"])), "group 'm' has the negative share -0.2"),
        ("c.csv", dict(desired=str(files["few"])), "has group 'm', which the desired distribution"),
        ("c.csv", dict(desired=str(files["extra"])), "names group 'x', which no row"),
        ("nan.csv", dict(desired=str(good)), "Line 6 of nan.csv has no number in the score column 'relevance'"),
        ("empty.csv", dict(desired=str(good)), "holds no rows"),
        ("c.csv", dict(desired=str(good), group_column="gender"), "Column 'gender' \\(--group-column\\) is not in"),
        ("c.csv", dict(desired=str(good), k=0), "'k' parameter of rerank"),
        ("c.csv", dict(desired=str(good), algorithm="fair"), "'algorithm' parameter of rerank"),
        ("missing.csv", dict(desired=str(good)), "does not exist"),
    ]  # fmt: skip
    for source, kw, match in cases:
        o = RerankOptions(**{**OPTS, **kw})
        with pytest.raises(Exception, match=match):
            run_rerank(tmp_path / source, tmp_path / "out.csv", o)
        assert not (tmp_path / "out.csv").exists() and not (tmp_path / "out.metrics.csv").exists()
