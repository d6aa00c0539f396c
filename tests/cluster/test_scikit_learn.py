"""The clustering estimators inside scikit-learn: its KMeans attributes, fit_predict, a Pipeline
(whose y must never reach them as ids) and clone."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fairpipe.base import NotFittedError
from fairpipe.cluster import DCKMeans, QKMeans

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
