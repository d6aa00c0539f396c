"""The estimators inside scikit-learn: the k-means models pass its estimator checks (but the
expected failures of fairpipe.cluster._sklearn_checks), have its KMeans attributes and
fit_predict, work in a Pipeline (whose y must never reach them as ids); every estimator clones
and round-trips its parameters."""

from __future__ import annotations

import pickle
import time
from functools import partial

import numpy as np
import pytest
import scipy.sparse
from sklearn.base import clone
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils import estimator_checks
from sklearn.utils.estimator_checks import check_estimator

from fairpipe import FairNN, FairSummary
from fairpipe.base import NotFittedError
from fairpipe.cluster import DCKMeans, QKMeans, expected_failed_checks
from fairpipe.cluster._sklearn_checks import CLUSTERING_CHECKS
from fairpipe.errors import FairpipeInputError

MODELS = [
    lambda: DCKMeans(n_clusters=3, fanout=2, height=1, max_iter=5, n_init=2, seed=1),
    lambda: QKMeans(n_clusters=3, max_iter=5, seed=1),
]


def blobs(n: int = 240, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return centres[rng.integers(3, size=n)] + rng.normal(size=(n, 2))


@pytest.mark.parametrize("make", MODELS, ids=["DCKMeans", "QKMeans"])
def test_kmeans_attributes_follow_the_held_rows(make):
    X = blobs()
    model = make()
    with pytest.raises(NotFittedError):
        model.labels_  # noqa: B018
    labels = make().fit_predict(X)
    model.fit(X)
    np.testing.assert_array_equal(labels, model.labels_)
    np.testing.assert_array_equal(model.labels_, model.predict(X))
    np.testing.assert_array_equal(model.cluster_centers_, model.centroids_)
    assert model.inertia_ == pytest.approx(model.loss(X))
    assert len(np.unique(model.labels_)) == 3  # three well-separated blobs
    model.delete([0, 5])
    assert model.labels_[0] == -1 and model.labels_[5] == -1 and (model.labels_[1:5] >= 0).all()
    keep = np.setdiff1d(np.arange(len(X)), [0, 5])
    assert model.inertia_ == pytest.approx(model.loss(X[keep]))


@pytest.mark.parametrize("make", MODELS, ids=["DCKMeans", "QKMeans"])
def test_a_pipeline_passes_y_and_the_model_ignores_it(make):
    X = blobs()
    y = np.arange(len(X))[::-1] * 7  # labels that would be wrong as ids
    pipe = make_pipeline(StandardScaler(), make()).fit(X, y)
    model = pipe[-1]
    np.testing.assert_array_equal(model.ids_, np.arange(len(X)))
    alone = make().fit(StandardScaler().fit_transform(X))
    np.testing.assert_array_equal(pipe.predict(X), alone.predict(StandardScaler().fit_transform(X)))
    copy = clone(pipe)
    assert copy[-1].get_params() == model.get_params() and not hasattr(copy[-1], "labels_")


def test_ids_are_keyword_only():
    with pytest.raises(TypeError):
        DCKMeans().fit(blobs(), None, np.arange(240))  # type: ignore[misc]


# fairpipe's estimators do not inherit from scikit-learn's BaseEstimator (importing fairpipe does
# not import scikit-learn); check_estimator warns so once per estimator, and nothing else differs.
NOT_SKLEARN_BASE = "ignore:Estimator .* does not inherit from `sklearn.base.BaseEstimator`"


@pytest.mark.filterwarnings(NOT_SKLEARN_BASE)
@pytest.mark.parametrize("model", [DCKMeans(), QKMeans()], ids=["DCKMeans", "QKMeans"])
def test_scikit_learn_estimator_checks_pass_but_the_listed_ones(model):
    """check_estimator on the default model, then the clustering checks it leaves to
    ClusterMixin's subclasses; each expected failure fails (the list cannot go stale) and
    nothing else does."""
    expected = expected_failed_checks(model)
    start = time.perf_counter()
    results = check_estimator(model, expected_failed_checks=expected, on_fail=None, on_skip=None)
    for name in CLUSTERING_CHECKS:
        check = getattr(estimator_checks, name)
        runs = (
            [check, partial(check, readonly_memmap=True)] if name == "check_clustering" else [check]
        )
        for run in runs:
            try:
                run(type(model).__name__, clone(model))
                status = "passed"
            except Exception as exc:  # noqa: BLE001  (the failure is what is checked)
                status = "xfail" if name in expected else f"failed: {exc!r}"
            results.append({"check_name": name, "status": status})
    seconds = time.perf_counter() - start
    failed = {r["check_name"]: r.get("exception") for r in results if r["status"] == "failed"}
    failed |= {r["check_name"]: r["status"] for r in results if r["status"].startswith("failed:")}
    assert not failed, failed
    assert {r["check_name"] for r in results if r["status"] == "xfail"} == set(expected)
    # the one skip: array API input, which scikit-learn checks only with SCIPY_ARRAY_API=1
    assert {r["check_name"] for r in results if r["status"] == "skipped"} <= {
        "check_array_api_input"
    }
    assert len(results) > 40 and seconds < 10, (len(results), seconds)


@pytest.mark.parametrize("make", MODELS, ids=["DCKMeans", "QKMeans"])
def test_bad_input_errors_name_the_method_and_what_was_expected(make):
    X = blobs(60)
    name = type(make()).__name__
    with pytest.raises(NotFittedError, match=f"This {name} instance is not fitted yet"):
        make().predict(X)
    with pytest.raises(SklearnNotFittedError):  # scikit-learn imported: its error too
        make().predict(X)
    try:
        make().predict(X)
    except NotFittedError as exc:  # and it pickles (a Dask worker sends it back)
        assert type(pickle.loads(pickle.dumps(exc))) is type(exc)
    with pytest.raises(FairpipeInputError, match=f"{name}.fit does not accept sparse input"):
        make().fit(scipy.sparse.csr_matrix(X))
    with pytest.raises(FairpipeInputError, match=f"Complex data not supported: {name}.fit must"):
        make().fit(X + 1j)
    with pytest.raises(FairpipeInputError, match=r"Row 3 of \w+.fit holds a NaN value in column 2"):
        make().fit(np.where(np.arange(60)[:, None] == 2, [0.0, np.nan], X))
    with pytest.raises(FairpipeInputError, match="holds an inf value"):
        make().fit(np.where(np.arange(60)[:, None] == 2, [np.inf, 0.0], X))
    with pytest.raises(FairpipeInputError, match=r"0 feature\(s\) \(shape=\(60, 0\)\)"):
        make().fit(X[:, :0])
    with pytest.raises(TypeError, match=f"{name}.fit must hold real numbers: float\\(\\) argument"):
        make().fit(np.array([[{"a": 1}, 2.0]] * 5, dtype=object))
    model = make().fit(X.astype(object))  # numbers held as objects are numbers
    np.testing.assert_array_equal(model.predict(X), make().fit(X).predict(X))
    with pytest.raises(FairpipeInputError, match=r"Got a 1-dimensional .* Reshape your data"):
        model.predict(X[0])
    with pytest.raises(
        FairpipeInputError,
        match=f"X has 1 features, but {name} is expecting 2 features as input \\({name}.predict\\)",
    ):
        model.predict(X[:, :1])


def _fair_summary():
    return FairSummary(k=6, lower=[1, 1], upper=[4, 4], fanout=3, height=1, eval_size=40, seed=4)


ALL_ESTIMATORS = [
    lambda: DCKMeans(n_clusters=4, fanout=3, max_iter=3, seed=2),
    lambda: QKMeans(n_clusters=4, epsilon=0.3, seed=2),
    lambda: FairNN(n_hashes=3, n_tables=4, bucket_width=2.0, seed=2),
    _fair_summary,
]


@pytest.mark.filterwarnings(NOT_SKLEARN_BASE)
@pytest.mark.parametrize(
    "make", ALL_ESTIMATORS, ids=["DCKMeans", "QKMeans", "FairNN", "FairSummary"]
)
def test_parameters_round_trip_and_clone_for_every_estimator(make):
    """get_params(deep=True) -> set_params on a default estimator gives the same parameters;
    clone keeps them and drops the fitted state; scikit-learn's own parameter checks pass."""
    model = make()
    params = model.get_params(deep=True)
    assert params == model.get_params(deep=False)  # no parameter is an estimator
    other = type(model)().set_params(**params)
    assert other.get_params() == params and repr(other) == repr(model)
    X = blobs(90)
    groups = np.arange(90) % 2
    fitted = model.fit(X, groups=groups) if isinstance(model, FairSummary) else model.fit(X)
    copy = clone(fitted)
    assert copy.get_params() == params and not hasattr(copy, "n_features_in_")
    for check in (
        estimator_checks.check_get_params_invariance,
        estimator_checks.check_set_params,
        estimator_checks.check_no_attributes_set_in_init,
        estimator_checks.check_parameters_default_constructible,
        estimator_checks.check_estimator_repr,
        estimator_checks.check_estimator_cloneable,
    ):
        check(type(model).__name__, make())


def test_docs_api_lists_exactly_the_expected_failures_with_their_reasons():
    """docs/reference/api.md's table of the checks the models cannot pass is the one place's
    content."""
    from pathlib import Path

    from fairpipe.cluster._sklearn_checks import EXPECTED_FAILED_CHECKS

    text = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "api.md").read_text()
    rows = {
        tuple(cell.replace("`", "").strip() for cell in cells)
        for line in map(str.strip, text.splitlines())
        if line.startswith("| `") and "| `check_" in line
        for cells in [line.strip("|").split("|")]
    }
    listed = {
        (name, check, reason)
        for name, checks in EXPECTED_FAILED_CHECKS.items()
        for check, reason in checks.items()
    }
    assert rows == listed
