"""Stores written before the refactor (store format 1) open and give the same results (today's forget flow on them: tests/flows/test_format1_forget.py).

``tests/data/format1`` holds two small stores written by the release before the sub-packages
(``fairpipe ingest gaussian``, ``fit`` and ``summarize``; a DC tree with a summary, and a
Q-k-means model). Their arrays must be exactly what today's estimators compute in memory from the
same rows, and today's forget flow must update them as it updates a store it wrote itself (its
first write upgrades the index to format 2's segments).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from fairpipe import DCKMeans, FairNN, FairSummary, QKMeans
from fairpipe.datasets import load_gaussian
from fairpipe.flows.predict import predict_store
from fairpipe.storage.arrays import read_array
from fairpipe.storage.index import load_sampler
from fairpipe.storage.layers import load_lsh
from fairpipe.storage.models import read_model
from fairpipe.storage.store import FairpipeStore
from fairpipe.storage.summary import summary_tree

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "format1"


def fresh_summary(session, X, ids, groups) -> tuple[FairSummary, int]:
    """A FairSummary with the stored summary's parameters, fitted in memory; its height."""
    params, fanout, height, _ = summary_tree(session)
    summary = FairSummary(
        k=params.k, lower=params.lower, upper=params.upper, utility=params.utility,
        fanout=fanout, height=height, eval_size=params.eval_size, rule=params.rule,
        factor=params.factor, gamma=params.gamma, seed=params.seed,
    ).fit(X, ids=ids, groups=groups)  # fmt: skip
    return summary, height


def open_copy(tmp_path, name):
    path = tmp_path / name
    shutil.copytree(FIXTURES / name, path)
    store = FairpipeStore.open(str(path))
    session = store.readonly_session()
    return path, store, session, store.attrs(session)


def stored_summary(session, height: int) -> dict:
    out = {"summary_ids": read_array(session, "summary/ids")}
    for j in range(height + 1):
        for name in ("candidates", "evaluation", "value", "calls"):
            out[f"level_{j}/{name}"] = read_array(session, f"summary/level_{j}/{name}")
    return out


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=True), name


def test_a_format_1_store_holds_what_todays_estimators_compute(tmp_path):
    path, store, session, attrs = open_copy(tmp_path, "dc")
    X, ids, groups = (store.read(n) for n in ("points", "ids", "groups"))
    assert np.array_equal(X, load_gaussian(n=500, d=4, groups=3, seed=2).points)
    # The hash functions give the stored keys; the stored index is a fresh FairNN's.
    lsh = load_lsh(session, attrs)
    assert np.array_equal(lsh.hash(X), store.read("lsh/keys"))
    nn, fresh_nn = load_sampler(session, attrs), FairNN(**lsh.get_params()).fit(X, ids=ids)
    for name in ("bucket_keys", "starts", "members"):
        assert np.array_equal(getattr(nn.index_, name), getattr(fresh_nn.index_, name)), name
    model = read_model(session, "dc")
    assert isinstance(model, DCKMeans) and model.get_params()["fanout"] == 3
    same(model.to_arrays(data=False),
         DCKMeans(**model.get_params()).fit(X, ids=ids).to_arrays(data=False))  # fmt: skip
    summary, height = fresh_summary(session, X, ids, groups)
    same(stored_summary(session, height), summary.to_arrays(data=False))


def test_a_format_1_q_model_predicts_as_todays_estimator(tmp_path):
    path, store, session, _ = open_copy(tmp_path, "q")
    X, ids = store.read("points"), store.read("ids")
    model = read_model(session, "q")
    fresh = QKMeans(**model.get_params()).fit(X, ids=ids)
    same(model.to_arrays(data=False), fresh.to_arrays(data=False))
    assert predict_store(str(path), queries=X[:40])["clusters"] == fresh.predict(X[:40]).tolist()
