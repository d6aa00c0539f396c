"""The shared estimator checks, run over every estimator (after river's ``checks`` and
scikit-learn's ``parametrize_with_checks``).

Each estimator is described once (how to build it, fit it, delete from it, and compare two of its
states); every check below runs over all of them: same seed gives the same model; row order does
not matter; inputs are not mutated; pickling; NotFittedError before fit; get_params/set_params;
deletion equals a refit on the remaining rows; to_arrays/from_arrays; bad parameters raise their
documented message before anything is done.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from fairpipe import (
    E2LSH,
    DCKMeans,
    FairNN,
    FairpipeInputError,
    FairSummary,
    NotFittedError,
    QKMeans,
)
from fairpipe.base import BaseEstimator, DeletionReport

N, D = 300, 4


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(3, D))
    X = (centres[rng.integers(0, 3, size=N)] + rng.normal(size=(N, D))).astype(np.float32)
    ids = rng.permutation(N * 7)[:N].astype(np.int64) + 1000
    groups = rng.integers(0, 3, size=N)
    groups[:3] = [0, 1, 2]
    return X, ids, groups


def exact(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(np.asarray(a[name]), np.asarray(b[name]), equal_nan=True), name


def buckets_by_id(nn: FairNN) -> dict:
    """The index of a FairNN with row numbers replaced by ids: independent of row order."""
    idx = nn.index_
    sizes = np.diff(idx.starts)
    buckets = {
        int(key): sorted(nn.ids_[idx.members[a : a + s]].tolist())
        for key, a, s in zip(idx.bucket_keys, idx.starts[:-1], sizes)
    }
    live = np.flatnonzero(nn.alive_)
    keys = {int(nn.ids_[r]): nn.keys_[r].tolist() for r in live}
    return {"buckets": buckets, "keys": keys, **nn.lsh_.to_arrays()}


def compare_fair_nn(a: FairNN, b: FairNN) -> None:
    A, B = buckets_by_id(a), buckets_by_id(b)
    assert A["buckets"] == B["buckets"] and A["keys"] == B["keys"]
    exact({k: A[k] for k in ("projections", "offsets", "multipliers")},
          {k: B[k] for k in ("projections", "offsets", "multipliers")})  # fmt: skip


def compare_model(a: BaseEstimator, b: BaseEstimator) -> None:
    exact(a.to_arrays(data=False), b.to_arrays(data=False))  # type: ignore[attr-defined]


@dataclass
class Spec:
    make: Callable[..., BaseEstimator]  # make(**overrides)
    compare: Callable[[Any, Any], None]  # raises unless the two fitted states are the same
    behave: Callable[[Any, np.ndarray], Any]  # what a user gets from a fitted model
    bad: list[tuple[dict, str]]  # constructor overrides -> the message fit raises
    needs_fit: list[str]  # methods that need a fitted model
    deletes: bool = True
    uses_groups: bool = False
    seed_matters: bool = True
    extra: dict = field(default_factory=dict)

    def fit(self, model, X, ids, groups):
        if self.uses_groups:
            return model.fit(X, ids=ids, groups=groups)
        return model.fit(X, ids=ids)

    @property
    def name(self) -> str:
        return type(self.make()).__name__


def maker(estimator, **defaults):
    """``make(**overrides)``: the estimator with these defaults, some overridden."""
    return lambda **overrides: estimator(**{**defaults, **overrides})


def sample_ids(nn: FairNN, X: np.ndarray):
    return nn.sample(X[:3], radius=3.0, n_samples=20, seed=4).ids


SPECS = [
    Spec(
        make=maker(E2LSH, n_hashes=4, n_tables=6, bucket_width=2.0, seed=3),
        compare=compare_model,
        behave=lambda m, X: m.hash(X),
        bad=[
            ({"n_hashes": 0}, "'n_hashes' parameter of E2LSH must be a positive integer"),
            ({"bucket_width": -1.0}, "'bucket_width' parameter of E2LSH must be a positive float"),
            (
                {"n_tables": 70000},
                "'n_tables' parameter of E2LSH must be an integer from 1 to 65535",
            ),
            ({"seed": 1.5}, "'seed' parameter of E2LSH must be an integer"),
        ],
        needs_fit=["hash", "to_arrays"],
        deletes=False,
    ),
    Spec(
        make=maker(FairNN, n_hashes=3, n_tables=8, bucket_width=3.0, seed=3),
        compare=compare_fair_nn,
        behave=sample_ids,
        bad=[
            ({"n_tables": 0}, "'n_tables' parameter of E2LSH must be an integer from 1 to 65535"),
            ({"bucket_width": 0.0}, "'bucket_width' parameter of E2LSH must be a positive float"),
        ],
        needs_fit=["sample", "neighbourhood", "delete", "to_arrays"],
    ),
    Spec(
        make=maker(DCKMeans, n_clusters=3, fanout=3, height=2, max_iter=5, n_init=2, seed=1),
        compare=compare_model,
        behave=lambda m, X: m.predict(X),
        bad=[
            ({"n_clusters": 0}, "'n_clusters' parameter of DCKMeans must be a positive integer"),
            ({"fanout": -1}, "'fanout' parameter of DCKMeans must be an integer >= 2. Got -1"),
            ({"max_iter": 0}, "'max_iter' parameter of DCKMeans must be a positive integer"),
            ({"fanout": 10000, "height": 3}, "10000 \\*\\* 3|fanout \\*\\* height = 1000000000000"),
            ({"n_clusters": 500}, "n_clusters = 500 is larger than the 300 points"),
        ],
        needs_fit=["predict", "loss", "delete", "to_arrays"],
    ),
    Spec(
        make=maker(QKMeans, n_clusters=3, epsilon=0.5, max_iter=6, seed=2),
        compare=compare_model,
        behave=lambda m, X: m.predict(X),
        bad=[
            ({"balance": 1.0}, "'balance' parameter of QKMeans must be in \\(0, 1\\)"),
            ({"epsilon": 0.0}, "'epsilon' parameter of QKMeans must be a positive float"),
            ({"n_init": 0}, "'n_init' parameter of QKMeans must be an integer from 1 to 1000"),
            ({"n_clusters": 400}, "n_clusters = 400 is larger than the 300 points"),
        ],
        needs_fit=["predict", "loss", "delete", "to_arrays", "certification_rate"],
    ),
    Spec(
        make=maker(
            FairSummary,
            k=6,
            lower=[1, 1, 1],
            upper=[3, 3, 3],
            fanout=3,
            height=2,
            eval_size=60,
            seed=4,
        ),  # fmt: skip  # fmt: skip
        compare=compare_model,
        behave=lambda m, X: m.summary_ids_,
        bad=[
            ({"k": 0}, "'k' parameter of the summary must be a positive integer"),
            ({"lower": [3, 3, 3]}, "The lower bounds add up to 9 .* more than k = 6"),
            ({"rule": "best"}, "'rule' parameter of FairSummary must be one of"),
            ({"height": -1}, "'height' parameter of FairSummary must be a non-negative integer"),
            ({"k": 400, "upper": [400] * 3}, "k = 400 is larger than the 300 elements"),
        ],
        needs_fit=["delete", "to_arrays"],
        uses_groups=True,
    ),
]
ids_of_specs = [spec.name for spec in SPECS]
each = pytest.mark.parametrize("spec", SPECS, ids=ids_of_specs)
# E2LSH holds hash functions only, no rows: it has nothing to delete.
each_deleting = pytest.mark.parametrize(
    "spec", [s for s in SPECS if s.deletes], ids=[s.name for s in SPECS if s.deletes]
)


@each
def test_same_seed_same_model_other_seed_other_model(spec):
    X, ids, groups = data()
    a = spec.fit(spec.make(), X, ids, groups)
    b = spec.fit(spec.make(), X, ids, groups)
    spec.compare(a, b)
    assert np.array_equal(spec.behave(a, X), spec.behave(b, X))
    other = spec.fit(spec.make(seed=99), X, ids, groups)
    with pytest.raises(AssertionError):
        spec.compare(a, other)


@each
def test_row_order_does_not_matter(spec):
    X, ids, groups = data(1)
    perm = np.random.default_rng(5).permutation(N)
    a = spec.fit(spec.make(), X, ids, groups)
    b = spec.fit(spec.make(), X[perm], ids[perm], groups[perm])
    spec.compare(a, b)


@each
def test_inputs_are_not_mutated(spec):
    X, ids, groups = data(2)
    copies = X.copy(), ids.copy(), groups.copy()
    model = spec.fit(spec.make(), X, ids, groups)
    for given, kept in zip((X, ids, groups), copies):
        assert np.array_equal(given, kept)
    if spec.deletes:
        gone = ids[:5].copy()
        model.delete(gone)
        assert np.array_equal(gone, ids[:5])


@each
def test_pickle_round_trip(spec):
    X, ids, groups = data(3)
    model = spec.fit(spec.make(), X, ids, groups)
    again = pickle.loads(pickle.dumps(model))
    spec.compare(model, again)
    assert np.array_equal(spec.behave(model, X), spec.behave(again, X))
    unfitted = pickle.loads(pickle.dumps(spec.make()))
    assert unfitted.get_params() == spec.make().get_params()


@each
def test_not_fitted_error_before_fit(spec):
    model = spec.make()
    for method in spec.needs_fit:
        with pytest.raises(NotFittedError, match=f"This {spec.name} instance is not fitted yet"):
            fn = getattr(model, method)
            if method in ("sample", "neighbourhood"):
                fn(query_rows=[0], radius=1.0)
            elif method in ("hash", "predict", "loss"):
                fn(np.zeros((2, D)))
            elif method == "delete":
                fn([1])
            else:
                fn()
    assert not hasattr(model, "n_features_in_")  # an AttributeError too, as scikit-learn's


@each
def test_constructor_is_keyword_only_and_get_params_round_trips(spec):
    model = spec.make()
    params = model.get_params()
    assert params == type(model)(**params).get_params()
    with pytest.raises(TypeError):
        type(model)(*params.values())
    # __init__ stores and does nothing else: bad values are accepted until fit.
    first = next(iter(params))
    type(model)(**{**params, first: "not a number"})
    assert model.set_params(seed=7) is model and model.get_params()["seed"] == 7
    with pytest.raises(FairpipeInputError, match=f"{spec.name} has no parameter 'colour'"):
        model.set_params(colour=1)
    assert repr(model).startswith(f"{spec.name}(") and "seed=7" in repr(model)


@each
def test_scikit_learn_clone_gives_an_unfitted_copy_with_the_same_parameters(spec):
    from sklearn.base import clone

    model = spec.make().set_params(seed=3)
    copy = clone(model)
    assert type(copy) is type(model) and copy is not model
    assert copy.get_params() == model.get_params() == model.get_params(deep=False)
    fitted = spec.fit(spec.make(), *data())
    again = clone(fitted)
    assert not hasattr(again, "n_features_in_") and again.get_params() == fitted.get_params()


@each_deleting
def test_delete_equals_a_refit_on_the_remaining_rows(spec):
    X, ids, groups = data(4)
    model = spec.fit(spec.make(), X, ids, groups)
    gone = ids[[3, 50, 51, 200]]
    if isinstance(model, QKMeans):
        # A k-means++ seed among them: the batch retrains, to exactly a fresh fit. (Certified
        # deletions equal a replay from the same seeds: tests/cluster/test_q_kmeans.py.)
        gone = np.append(gone, model.seed_ids_[0])
    with pytest.raises(
        FairpipeInputError, match=r"Id -5 in row \d of the ids to delete is negative"
    ):
        model.delete(np.append(gone, [-5]))  # no id at all: refused, nothing deleted
    report = model.delete(np.append(gone, [10**15]))
    assert isinstance(report, DeletionReport)
    assert sorted(report.deleted.tolist()) == sorted(gone.tolist())
    assert report.unknown.tolist() == [10**15] and report.already_deleted.size == 0
    keep = ~np.isin(ids, gone)
    fresh = spec.fit(spec.make(), X[keep], ids[keep], groups[keep])
    spec.compare(model, fresh)
    again = model.delete(gone[:2])
    assert again.deleted.size == 0 and sorted(again.already_deleted.tolist()) == sorted(gone[:2])


@each
def test_to_arrays_from_arrays_round_trip(spec):
    X, ids, groups = data(5)
    model = spec.fit(spec.make(), X, ids, groups)
    arrays = model.to_arrays()
    assert all(isinstance(v, np.ndarray) for v in arrays.values())
    rebuilt = type(model).from_arrays(arrays, **model.get_params())
    spec.compare(model, rebuilt)
    assert np.array_equal(spec.behave(model, X), spec.behave(rebuilt, X))
    if spec.deletes:  # the whole state is in the arrays: both forget alike
        model.delete(ids[10:20])
        rebuilt.delete(ids[10:20])
        spec.compare(model, rebuilt)


@each
def test_bad_parameters_raise_the_documented_message(spec):
    X, ids, groups = data(6)
    for overrides, match in spec.bad:
        with pytest.raises(FairpipeInputError, match=match):
            spec.fit(spec.make(**overrides), X, ids, groups)


def test_models_rebuilt_without_their_rows_predict_but_cannot_delete():
    X, ids, _ = data(7)
    for model in (DCKMeans(n_clusters=3, fanout=3, height=1).fit(X, ids=ids),
                  QKMeans(n_clusters=3, epsilon=0.5).fit(X, ids=ids)):  # fmt: skip
        light = type(model).from_arrays(model.to_arrays(data=False), **model.get_params())
        assert np.array_equal(light.predict(X), model.predict(X))
        with pytest.raises(NotFittedError, match="rebuilt without its rows"):
            light.delete(ids[:1])


def test_the_top_level_names_are_the_sub_packages_and_load_nothing_until_used():
    """``from fairpipe import X`` gives the sub-package's object; importing a small module (as the
    command line does before it knows its command) does not load every capability."""
    import subprocess
    import sys

    import fairpipe

    assert sorted(fairpipe.__all__) == sorted(fairpipe._EXPORTS)
    for name in fairpipe.__all__:
        module = __import__(fairpipe._EXPORTS[name], fromlist=[name])
        assert getattr(fairpipe, name) is getattr(module, name)
    code = "import sys, fairpipe.errors; print('fairpipe.cluster' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
