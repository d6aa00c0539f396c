"""The scaler ingest fits (fairpipe.datasets._scaling, fairpipe.flows.parameters.scaled_plan): on a sample
chosen by a hash of (seed, id), so the same whatever the file's row order; the sample read once
for the scaler and the LSH width; the documented errors."""

import numpy as np
import pandas as pd
import pytest

import fairpipe.flows.parameters
from fairpipe.datasets import apply_scaler, fit_scaler, plan_source
from fairpipe.errors import FairpipeInputError
from fairpipe.flows.parameters import scaled_plan, width_sample


def table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"who": rng.permutation(10 * n)[:n], "age": rng.normal(40, 12, n),
                         "weight": rng.lognormal(12, 1, n)})  # fmt: skip


@pytest.mark.parametrize("method", ["standard", "robust"])
def test_the_scaler_follows_the_ids_not_the_file_order(tmp_path, method):
    frame = table(30_000, 1)  # more rows than the sample: the hash picks 20,000
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.sample(frac=1.0, random_state=2).to_csv(tmp_path / "b.csv", index=False)
    fitted = []
    for name in ("a.csv", "b.csv"):
        plan = plan_source(str(tmp_path / name), id_column="who")
        scaled, scaling = scaled_plan(plan, plan.ids, 0, method)
        assert scaling.method == method and scaling.fitted_rows == 20_000
        fitted.append(scaling.attrs())
    assert fitted[0] == fitted[1]  # bit for bit (JSON floats)
    assert scaled_plan(plan, plan.ids, 1, method)[1].attrs() != fitted[1]  # another seed


def test_one_read_gives_the_scaler_and_the_width_sample(tmp_path, monkeypatch):
    table(3000, 3).to_parquet(tmp_path / "t.parquet")  # a source read whole to sample it
    plan = plan_source(str(tmp_path / "t.parquet"), id_column="who")
    reads = []
    read = fairpipe.flows.parameters.read_source_sample
    monkeypatch.setattr(fairpipe.flows.parameters, "read_source_sample",
                        lambda p, rows: reads.append(rows.size) or read(p, rows))  # fmt: skip
    scaled, _ = scaled_plan(plan, plan.ids, 0, "auto")
    got = width_sample(scaled, scaled.ids, 0)
    assert reads == [3000] and got.shape == (2000, 2)
    monkeypatch.setattr(fairpipe.flows.parameters, "_SAMPLE", {})  # read again, the same rows
    assert np.array_equal(width_sample(scaled, scaled.ids, 0), got) and reads == [3000, 2000]


def test_a_constant_column_is_named():
    S = np.array([[1.0, 5.0], [2.0, 5.0], [4.0, 5.0]])
    with pytest.raises(FairpipeInputError, match=r"Column 'b' of t\.csv holds one value \(5\) "
                       r"in all 3 sampled rows; --scale standard would divide it by 0\."):  # fmt: skip
        fit_scaler(S, "standard", "t.csv", ["a", "b"], 10)
    with pytest.raises(FairpipeInputError, match=r"Column 2 of x\.npy holds one value \(5\) in "
                       r"every row; --scale robust"):  # fmt: skip
        fit_scaler(S, "robust", "x.npy", [], 3)
    center, scale = fit_scaler(S[:, :1], "robust", "x.npy", [], 3)
    got = apply_scaler(S[:, :1], center, scale)  # (x - median) / IQR, IQR = 3 - 1.5
    assert got.dtype == np.float32 and np.array_equal(
        got.ravel(), np.float32([-1 / 1.5, 0, 2 / 1.5])
    )
