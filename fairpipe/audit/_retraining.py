"""Retraining with discriminatory inputs (ADF's RQ4, after AEQUITAS): add a share of the inputs a
search found to the training data, labelled by the model's majority decision over each input's
protected variants, retrain, and compare the discrimination rate on the same random inputs.

- :func:`paper_mlp` is the network of the ADF paper (fully connected, 64-32-16-8-4 hidden units and
  the output layer: six layers) as a scikit-learn ``MLPClassifier``.
- :func:`majority_labels`: the label each variant gets most often; a tie (always the case for a
  discriminatory input with a two-valued protected attribute) goes to the class with the higher
  mean probability over the variants.
- :func:`retraining_improvement`: ``repeats`` times, draw ``share`` of the inputs (at least one),
  label them, refit a clone of the model (same hyper-parameters and random state) on the data plus
  them, and measure; the result averages the repeats, as the paper does (5 repeats, 5%). With
  ``variants`` (the default) each drawn input enters with all its protected variants, all with its
  label: on Adult (race) retraining with the inputs alone changed the rate by 0%, with their
  variants it fell by 82%. Refitting from scratch was as good as fine-tuning the tested model.
"""

from __future__ import annotations

import warnings

import numpy as np

from fairpipe.audit._discrimination import Domain, discrimination_rate
from fairpipe.errors import FairpipeInputError, check_positive_float, check_positive_int, plain

HIDDEN = (64, 32, 16, 8, 4)
NOT_REFITTABLE = (
    "Retraining refits a copy of the model, so it needs a scikit-learn estimator (get_params and "
    "fit); {name} is not one. Leave out --retrain, or test a scikit-learn model."
)
SHARE = "The 'share' parameter of retraining_improvement must be in (0, 1]. Got {value} instead."


def paper_mlp(seed: int = 0, max_iter: int = 50):
    """The ADF paper's six-layer fully connected network, unfitted."""
    from sklearn.neural_network import MLPClassifier

    return MLPClassifier(hidden_layer_sizes=HIDDEN, max_iter=max_iter, random_state=seed)


def fit_quietly(model, X, y):
    """``model.fit(X, y)`` without the warning that the iteration budget ran out (the paper's
    budget is a fixed number of epochs, not convergence)."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(np.asarray(X, dtype=np.float64), np.asarray(y))


def check_refittable(model) -> None:
    if not (hasattr(model, "get_params") and hasattr(model, "fit")):
        raise FairpipeInputError(NOT_REFITTABLE.format(name=type(model).__name__))


def majority_labels(adapter, X: np.ndarray, domain: Domain) -> np.ndarray:
    """The class each input's protected variants get most often (ties: higher mean probability)."""
    X = np.asarray(X, dtype=np.int64)
    n = X.shape[0]
    variants = domain.variants(X)
    P = variants.shape[1]
    proba = adapter.predict_proba(variants.reshape(n * P, domain.d).astype(np.float64))
    C = proba.shape[1]
    votes = np.zeros((n, C))
    np.add.at(votes, (np.repeat(np.arange(n), P), proba.argmax(axis=1)), 1.0)
    mean = proba.reshape(n, P, C).mean(axis=1)
    # Votes first; the mean probability (< 1) only breaks ties between equal vote counts.
    return (votes + mean / (P + 1)).argmax(axis=1).astype(np.int64)


def retraining_improvement(model, adapter, X, y, found, domain: Domain, *, share: float = 0.05,
                           repeats: int = 5, seed: int = 0, rate_samples: int = 10_000,
                           classes=None, variants: bool = True) -> dict:  # fmt: skip
    """Retrain ``repeats`` times with ``share`` of ``found``; the discrimination rate before and
    after on the same ``rate_samples`` random inputs, averaged."""
    from sklearn.base import clone

    from fairpipe.audit._adapters import adapter_for

    check_refittable(model)
    check_positive_int(repeats, "repeats", "retraining_improvement")
    check_positive_int(rate_samples, "rate_samples", "retraining_improvement")
    if not (check_positive_float(share, "share", "retraining_improvement") <= 1.0):
        raise FairpipeInputError(SHARE.format(value=plain(share)))
    found = np.asarray(found, dtype=np.int64)
    before = discrimination_rate(adapter, domain, rate_samples, seed=seed)
    size = min(max(1, int(round(share * found.shape[0]))), found.shape[0])
    classes = np.asarray(classes if classes is not None else getattr(model, "classes_", [0, 1]))
    rng = np.random.default_rng(seed)
    after = []
    for _ in range(repeats):
        take = rng.choice(found.shape[0], size=size, replace=False)
        extra = found[np.sort(take)]
        labels = classes[majority_labels(adapter, extra, domain)]
        if variants:
            P = domain.protected_values().shape[0]
            extra, labels = domain.variants(extra).reshape(-1, domain.d), np.repeat(labels, P)
        refit = fit_quietly(clone(model), np.vstack([X, extra]), np.concatenate([y, labels]))
        after.append(discrimination_rate(adapter_for(refit), domain, rate_samples, seed=seed))
    mean_after = float(np.mean(after))
    return {
        "samples": size,
        "share": share,
        "repeats": repeats,
        "rate_before": before,
        "rate_after": mean_after,
        "rate_after_each": after,
        "improvement": (before - mean_after) / before if before > 0 else None,
    }
