"""The audit flow and command: samples re-checked with the written model, bad input."""

import json
import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression
from typer.testing import CliRunner

from fairpipe.audit import adapter_for, check_discrimination
from fairpipe.flows.audit import run_audit
from fairpipe.flows.cli import app
from fairpipe.flows.options import AuditOptions


def biased_csv(path, n=800):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.integers(0, 10, size=(n, 5)), columns=["a", "b", "c", "d", "e"])
    frame.insert(0, "sex", rng.integers(0, 2, size=n))
    frame["label"] = (frame["a"] + frame["b"] + 4 * frame["sex"] > 11).astype(int)
    frame.to_csv(path, index=False)
    return frame


class Leaning:
    """A hand-written classifier with its own gradient (an adapter in itself)."""

    n_features = 6

    def predict_proba(self, X):
        p = 1 / (1 + np.exp(-(X[:, 1] + X[:, 2] + 4 * X[:, 0] - 11.5)))
        return np.c_[1 - p, p]

    def gradient(self, X):
        p = self.predict_proba(X)[:, 1]
        return (p * (1 - p))[:, None] * np.array([4.0, 1, 1, 0, 0, 0])


def test_audit_command_with_a_given_model(prefect_server, tmp_path):
    biased_csv(tmp_path / "d.csv")
    with open(tmp_path / "m.pkl", "wb") as fh:
        pickle.dump(Leaning(), fh)
    args = ["audit", "--dataset", str(tmp_path / "d.csv"), "--protected", "sex", "--model",
            str(tmp_path / "m.pkl"), "--n-seeds", "100", "--n-local", "30", "--baseline", "aequitas",
            "--workers", "1"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output.strip().splitlines()[-1])
    assert r["model"] == "Leaning" and "random" not in r and r["aequitas"]["ids"] > 0
    # Leaning discriminates exactly where a + b lies in [8, 11): the rate is checkable.
    X = np.random.default_rng(0).integers(0, 10, size=(r["options"]["rate_samples"], 6))
    assert (
        abs(r["discrimination_rate"] - ((X[:, 1] + X[:, 2] >= 8) & (X[:, 1] + X[:, 2] < 12)).mean())
        < 0.02
    )
    both = CliRunner().invoke(app, [*args, "--no-baselines"])
    assert both.exit_code == 2
    assert both.stderr == "error: Give --baseline or --no-baselines, not both.\n"
    alone = [a for a in args if a not in ("--baseline", "aequitas")]
    res = CliRunner().invoke(app, [*alone, "--no-baselines"])
    assert res.exit_code == 0 and "ADF" in res.output and "AEQUITAS" not in res.output


def test_audit_writes_samples_that_the_written_model_confirms(prefect_server, tmp_path):
    biased_csv(tmp_path / "d.csv")
    o = AuditOptions(dataset=str(tmp_path / "d.csv"), protected=["sex"], n_seeds=150, n_local=20,
                     retrain=True, repeats=2, train_iter=200)  # fmt: skip
    r = run_audit(o, tmp_path / "out", n_workers=2)
    assert r["adf"]["ids"] > r["random"]["ids"] and r["adf"]["generated"] > 0
    assert r["adf"]["ids"] > r["aequitas"]["ids"] > 0
    assert r["adf"]["seconds_to_1000_ids"] is not None and r["adf"]["global_ids"] > 0
    assert 0.9 * r["adf"]["generated"] < r["random"]["generated"] <= r["adf"]["generated"]
    assert r["retrain"]["rate_after"] < r["retrain"]["rate_before"]
    samples = pd.read_parquet(tmp_path / "out" / "samples.parquet")
    assert (
        list(samples.columns) == ["sex", "a", "b", "c", "d", "e"]
        and len(samples) == r["adf"]["ids"]
    )
    with open(tmp_path / "out" / "model.pkl", "rb") as fh:
        model = pickle.load(fh)
    from fairpipe.datasets import load_audit_data

    domain = load_audit_data(str(tmp_path / "d.csv")).domain(["sex"])
    disc, _ = check_discrimination(adapter_for(model), samples.to_numpy(), domain)
    assert disc.all()
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["adf"]["ids"] == len(samples)
    assert (tmp_path / "out" / "ids.png").stat().st_size > 0
    # Same seed, same samples, whatever the worker count.
    again = run_audit(o, tmp_path / "out2", n_workers=1)
    assert again["adf"]["ids"] == r["adf"]["ids"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "out2" / "samples.parquet"), samples)


def test_audit_bad_input_writes_nothing(tmp_path):
    biased_csv(tmp_path / "d.csv", n=100)
    with open(tmp_path / "linear.pkl", "wb") as fh:
        pickle.dump(LinearRegression().fit(np.zeros((3, 6)), [0, 1, 0]), fh)
    with open(tmp_path / "narrow.pkl", "wb") as fh:
        from sklearn.linear_model import LogisticRegression

        pickle.dump(LogisticRegression().fit(np.arange(8).reshape(4, 2), [0, 1, 0, 1]), fh)
    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    with open(tmp_path / "adapter.pkl", "wb") as fh:  # predict_proba and gradient, but no fit
        pickle.dump(Leaning(), fh)
    d = str(tmp_path / "d.csv")
    cases = [
        (dict(protected=["race"]), "Protected attribute 'race' is not in the data"),
        (dict(protected=["sex"], model=str(tmp_path / "linear.pkl")), "has no predict_proba"),
        (dict(protected=["sex"], model=str(tmp_path / "narrow.pkl")), "expects 2 input columns; the data has 6"),
        (dict(protected=["sex"], model=str(tmp_path / "junk.pkl")), "could not be loaded"),
        (dict(protected=["sex"], model=str(tmp_path / "none.pkl")), "does not exist"),
        (dict(protected=["sex"], n_seeds=0), "'n_seeds' parameter of audit"),
        (dict(protected=["sex"], n_local=-3), "'n_local' parameter of audit"),
        (dict(protected=["sex"], model=str(tmp_path / "narrow.pkl"), train="mlp"), "either a model file"),
        (dict(protected=["sex"], train="forest"), "'train' parameter of audit must be one of 'mlp'"),
        (dict(protected=["sex"], baselines=("aequitas", "themis")), "'baselines' parameter of audit"),
        (dict(protected=["sex"], objective="margin"), "'objective' parameter of audit"),
        (dict(protected=["sex", "a", "b", "c", "d", "e"]), "Every attribute is protected"),
        (dict(protected=["sex"], retrain=True, model=str(tmp_path / "adapter.pkl")), "needs a scikit-learn estimator"),
    ]  # fmt: skip
    for kw, match in cases:
        with pytest.raises(Exception, match=match):
            run_audit(AuditOptions(dataset=d, **kw), tmp_path / "out")
        assert not (tmp_path / "out").exists()
    res = CliRunner().invoke(app, ["audit", "--dataset", d, "--protected", "race"])
    assert res.exit_code == 2 and "Protected attribute 'race'" in res.output
