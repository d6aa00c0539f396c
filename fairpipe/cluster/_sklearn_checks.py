"""scikit-learn's estimator checks and the k-means models: the checks each model cannot pass,
with the reason, kept in this one place. The tests hand them to
``sklearn.utils.estimator_checks.check_estimator(model, expected_failed_checks=...)``, and
docs/reference/api.md lists them.

``check_estimator`` runs its clustering checks only on subclasses of scikit-learn's
``ClusterMixin``. fairpipe's estimators do not inherit from scikit-learn's classes (importing
fairpipe does not import scikit-learn: 0.65 s that every command would pay), so
:data:`CLUSTERING_CHECKS` names those checks and the tests run them too, with the same
expected failures.

>>> expected_failed_checks(QKMeans())
{}
>>> sorted(expected_failed_checks(DCKMeans()))
['check_non_transformer_estimators_n_iter']
"""

from __future__ import annotations

from fairpipe.cluster._dc_kmeans import DCKMeans
from fairpipe.cluster._q_kmeans import QKMeans

EXPECTED_FAILED_CHECKS: dict[str, dict[str, str]] = {
    "DCKMeans": {
        "check_non_transformer_estimators_n_iter": (
            "DC-k-means runs up to max_iter Lloyd steps in every node of its tree, each its own "
            "k-means problem; no one iteration count n_iter_ describes the model"
        ),
    },
    "QKMeans": {},
}

# scikit-learn's clustering checks (its _yield_clustering_checks) that check_estimator skips for
# an estimator outside ClusterMixin; the partial-fit check is left out: neither model has one.
CLUSTERING_CHECKS = (
    "check_clusterer_compute_labels_predict",
    "check_clustering",
    "check_non_transformer_estimators_n_iter",
)


def expected_failed_checks(estimator: DCKMeans | QKMeans) -> dict[str, str]:
    """The scikit-learn checks ``estimator`` cannot pass, each with its reason (the argument
    ``expected_failed_checks`` of ``check_estimator``)."""
    return dict(EXPECTED_FAILED_CHECKS.get(type(estimator).__name__, {}))
