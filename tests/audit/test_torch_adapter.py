"""The PyTorch adapter: the same network as an sklearn MLP gives the same probabilities and input
gradients; gradients match finite differences; ADF through it finds inputs the module confirms."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

from fairpipe.audit import (
    Domain,
    FiniteDifferenceAdapter,
    MLPAdapter,
    TorchAdapter,
    adapter_for,
    adf_search,
    check_discrimination,
    cluster_seeds,
    load_model,
)
from fairpipe.errors import FairpipeInputError


def sklearn_mlp(n_classes=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 10, size=(1500, 5)).astype(float)
    X[:, 0] = rng.integers(0, 2, size=1500)
    y = np.digitize(X[:, 1] + X[:, 2] + 3 * X[:, 0], [8, 12][: n_classes - 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPClassifier(hidden_layer_sizes=(12, 6), random_state=0, max_iter=200).fit(X, y)
    return X, mlp


def torch_twin(mlp) -> torch.nn.Module:
    """The sklearn network's weights in a float64 torch module that outputs logits."""
    layers: list[torch.nn.Module] = []
    for j, (W, b) in enumerate(zip(mlp.coefs_, mlp.intercepts_)):
        lin = torch.nn.Linear(W.shape[0], W.shape[1]).double()
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W.T))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if j < len(mlp.coefs_) - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_torch_twin_equals_the_sklearn_network(n_classes):
    X, mlp = sklearn_mlp(n_classes)
    module = torch_twin(mlp)
    a = adapter_for(module, n_features=5)
    assert isinstance(a, TorchAdapter) and a.n_features == 5
    ref = MLPAdapter(mlp)
    assert np.allclose(a.predict_proba(X), ref.predict_proba(X), atol=1e-12)
    assert np.allclose(a.gradient(X[:50]), ref.gradient(X[:50]), atol=1e-10)
    fd = FiniteDifferenceAdapter(a, eps=1e-6)
    fd.n_features = 5
    assert np.allclose(a.gradient(X[:20]), fd.gradient(X[:20]), atol=1e-6)


def test_probability_output_and_float32_modules():
    torch.manual_seed(0)
    logits = torch.nn.Sequential(torch.nn.Linear(3, 1))
    probs = torch.nn.Sequential(logits, torch.nn.Sigmoid())
    X = np.random.default_rng(0).normal(size=(30, 3))
    a, b = TorchAdapter(logits), TorchAdapter(probs, output="probabilities")
    assert a.predict_proba(X).dtype == np.float64
    assert np.allclose(a.predict_proba(X), b.predict_proba(X), atol=1e-6)
    assert np.allclose(a.gradient(X), b.gradient(X), atol=1e-6)
    assert np.allclose(a.predict_proba(X).sum(axis=1), 1.0)
    with pytest.raises(FairpipeInputError, match="'output' parameter of TorchAdapter"):
        TorchAdapter(logits, output="scores")
    with pytest.raises(FairpipeInputError, match="could not tell the module's input width"):
        TorchAdapter(torch.nn.ReLU())
    with pytest.raises(FairpipeInputError, match="expects 3 input columns; the data has 4"):
        adapter_for(logits, n_features=4)


def test_adf_through_a_torch_module_and_a_saved_file(tmp_path):
    X, mlp = sklearn_mlp()
    module = torch_twin(mlp)
    domain = Domain.make(["sex", "a", "b", "c", "d"], [0] * 5, [1, 9, 9, 9, 9], ["sex"])
    res = adf_search(adapter_for(module), cluster_seeds(X.astype(np.int64), 30), domain, 40)
    assert res.discriminatory.shape[0] > 10
    # Checked with the module itself, one protected value at a time.
    rows = torch.from_numpy(res.discriminatory.astype(np.float64))
    with torch.no_grad():
        decisions = [module(torch.cat([torch.full((len(rows), 1), float(v)), rows[:, 1:]], 1))
                     for v in (0, 1)]  # fmt: skip
    assert ((decisions[0] > 0) != (decisions[1] > 0)).all()
    torch.save(module, tmp_path / "model.pt")
    loaded = load_model(tmp_path / "model.pt")
    disc, _ = check_discrimination(adapter_for(loaded), res.discriminatory, domain)
    assert disc.all()
