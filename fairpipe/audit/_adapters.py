"""Model adapters for fairness testing: probabilities and input gradients, for a batch.

An adapter gives ``predict_proba(X)`` (n, classes), ``predict(X)`` (n,) and ``gradient(X, target)``
(n, d): the gradient with respect to the input of the probability of class ``target[i]`` for row i
(by default the last class, the positive one of a binary classifier). ADF's objective, the loss
against the model's own decision, is built from it (:func:`fairpipe.audit._discrimination.objective_gradient`);
a hand-written adapter of a binary classifier needs only ``gradient(X)``.

- :class:`MLPAdapter` wraps a fitted scikit-learn ``MLPClassifier`` and differentiates its forward
  pass analytically in numpy (any of its hidden activations; logistic or softmax output).
- :class:`FiniteDifferenceAdapter` wraps any classifier with ``predict_proba``: central differences
  (2 d extra predictions per row, batched into one call).
- :class:`TorchAdapter` wraps a PyTorch module (if torch is installed) that maps a batch to logits
  (or probabilities); gradients by autograd.
- :func:`adapter_for` picks one; :func:`load_model` reads a pickled model (or a ``torch.save`` file).

>>> from sklearn.neural_network import MLPClassifier
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 3)); y = (X[:, 0] + X[:, 1] > 0).astype(int)
>>> mlp = MLPClassifier(hidden_layer_sizes=(8,), max_iter=2000, random_state=0).fit(X, y)
>>> a = MLPAdapter(mlp)
>>> bool(np.allclose(a.predict_proba(X), mlp.predict_proba(X)))
True
>>> bool(np.allclose(a.gradient(X[:5]), FiniteDifferenceAdapter(mlp).gradient(X[:5]), atol=1e-5))
True
"""

from __future__ import annotations

import numpy as np

from fairpipe.errors import FairpipeInputError, plain

NO_PROBA = (
    "The model {name} has no predict_proba; fairness testing needs class probabilities "
    "(wrap it, or use a classifier that has them)."
)
WRONG_WIDTH = "The model expects {expected} input columns; the data has {got}."
NOT_MLP = "MLPAdapter needs a fitted sklearn.neural_network.MLPClassifier. Got {name}."
NO_MODEL_FILE = "The model file {path} does not exist."
BAD_MODEL_FILE = "The model file {path} could not be loaded: {why}."
TORCH_OUTPUT = "The 'output' parameter of TorchAdapter must be 'logits' or 'probabilities'. Got {value} instead."
TORCH_WIDTH = (
    "TorchAdapter could not tell the module's input width (no Linear layer first); pass n_features."
)


def _act(name: str, z: np.ndarray) -> np.ndarray:
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "tanh":
        return np.tanh(z)
    if name == "logistic":
        return 1.0 / (1.0 + np.exp(-z))
    return z  # identity


def _act_grad(name: str, a: np.ndarray) -> np.ndarray:
    """Derivative of the activation, from its output ``a``."""
    if name == "relu":
        return (a > 0).astype(a.dtype)
    if name == "tanh":
        return 1.0 - a * a
    if name == "logistic":
        return a * (1.0 - a)
    return np.ones_like(a)


class MLPAdapter:
    """Analytic probabilities and input gradients of a fitted ``MLPClassifier``."""

    def __init__(self, mlp):
        if not (hasattr(mlp, "coefs_") and hasattr(mlp, "out_activation_")):
            raise FairpipeInputError(NOT_MLP.format(name=type(mlp).__name__))
        self.mlp = mlp
        self.weights = [np.asarray(w, dtype=np.float64) for w in mlp.coefs_]
        self.biases = [np.asarray(b, dtype=np.float64) for b in mlp.intercepts_]
        self.hidden = mlp.activation
        self.output = mlp.out_activation_
        self.n_features = self.weights[0].shape[0]
        self.classes_ = mlp.classes_

    def _forward(self, X: np.ndarray) -> list[np.ndarray]:
        a = [np.asarray(X, dtype=np.float64)]
        for j, (W, b) in enumerate(zip(self.weights, self.biases)):
            z = a[-1] @ W + b
            last = j == len(self.weights) - 1
            if not last:
                a.append(_act(self.hidden, z))
            elif self.output == "softmax":
                e = np.exp(z - z.max(axis=1, keepdims=True))
                a.append(e / e.sum(axis=1, keepdims=True))
            else:
                a.append(_act(self.output, z))
        return a

    def predict_proba(self, X) -> np.ndarray:
        out = self._forward(X)[-1]
        return np.hstack([1.0 - out, out]) if out.shape[1] == 1 else out

    def predict(self, X) -> np.ndarray:
        return self.predict_proba(X).argmax(axis=1)

    def gradient(self, X, target=None) -> np.ndarray:
        """d P(class target[i]) / d x for every row i (default: the last class)."""
        a = self._forward(X)
        out = a[-1]
        n = out.shape[0]
        if self.output == "softmax":  # d p_c / d z = p_c (e_c - p)
            c = np.full(n, out.shape[1] - 1) if target is None else np.asarray(target)
            rows = np.arange(n)
            delta = -out[rows, c][:, None] * out
            delta[rows, c] += out[rows, c]
        else:  # one output, the probability of class 1; class 0's is its complement
            delta = _act_grad(self.output, out)
            if target is not None:
                delta = delta * np.where(np.asarray(target) == 0, -1.0, 1.0)[:, None]
        for j in range(len(self.weights) - 1, -1, -1):
            delta = delta @ self.weights[j].T
            if j > 0:
                delta = delta * _act_grad(self.hidden, a[j])
        return delta


class FiniteDifferenceAdapter:
    """Gradients of any classifier with ``predict_proba``, by central differences."""

    def __init__(self, model, eps: float = 1e-4):
        if not hasattr(model, "predict_proba"):
            raise FairpipeInputError(NO_PROBA.format(name=type(model).__name__))
        self.model = model
        self.eps = eps
        self.n_features = getattr(model, "n_features_in_", None)
        self.classes_ = getattr(model, "classes_", None)

    def predict_proba(self, X) -> np.ndarray:
        return np.asarray(self.model.predict_proba(np.asarray(X, dtype=np.float64)))

    def predict(self, X) -> np.ndarray:
        return self.predict_proba(X).argmax(axis=1)

    def gradient(self, X, target=None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        steps = np.eye(d) * self.eps
        probe = np.concatenate([X[:, None, :] + steps, X[:, None, :] - steps], axis=1)
        proba = self.predict_proba(probe.reshape(-1, d))
        c = np.full(n, proba.shape[1] - 1) if target is None else np.asarray(target)
        p = proba.reshape(n, 2 * d, -1)[np.arange(n), :, c]
        return (p[:, :d] - p[:, d:]) / (2 * self.eps)


class TorchAdapter:
    """A ``torch.nn.Module`` mapping a float batch (n, d) to logits (n, C) (softmax; C = 1 means one
    sigmoid output for the positive class) or to probabilities; gradients by autograd.

    The module is evaluated in eval mode, in its own parameters' dtype; results are float64 numpy.
    """

    def __init__(self, module, n_features: int | None = None, output: str = "logits"):
        import torch

        if output not in ("logits", "probabilities"):
            raise FairpipeInputError(TORCH_OUTPUT.format(value=plain(output)))
        self.module = module
        self.output = output
        self._torch = torch
        params = list(module.parameters())
        self._dtype = params[0].dtype if params else torch.float32
        if n_features is None:
            first = next((m for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
            if first is None:
                raise FairpipeInputError(TORCH_WIDTH)
            n_features = int(first.in_features)
        self.n_features = n_features

    def _proba(self, X):
        out = self.module(X)
        if out.ndim == 1:
            out = out[:, None]
        if self.output == "probabilities":
            p = out
        elif out.shape[1] == 1:
            p = self._torch.sigmoid(out)
        else:
            return self._torch.softmax(out, dim=1)
        return self._torch.cat([1 - p, p], dim=1) if p.shape[1] == 1 else p

    def _tensor(self, X):
        return self._torch.as_tensor(np.asarray(X, dtype=np.float64), dtype=self._dtype)

    def predict_proba(self, X) -> np.ndarray:
        self.module.eval()
        with self._torch.no_grad():
            return self._proba(self._tensor(X)).double().numpy()

    def predict(self, X) -> np.ndarray:
        return self.predict_proba(X).argmax(axis=1)

    def gradient(self, X, target=None) -> np.ndarray:
        """d P(class target[i]) / d x for every row i (rows are independent: one backward pass)."""
        self.module.eval()
        t = self._tensor(X).requires_grad_(True)
        proba = self._proba(t)
        if target is None:
            picked = proba[:, -1]
        else:
            index = self._torch.as_tensor(np.asarray(target, dtype=np.int64))
            picked = proba.gather(1, index[:, None])[:, 0]
        picked.sum().backward()
        assert t.grad is not None
        return t.grad.double().numpy()


def _is_torch_module(model) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def load_model(path) -> object:
    """A classifier from a pickle file, or from a ``torch.save`` file when torch is installed."""
    import pickle
    import zipfile
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(NO_MODEL_FILE.format(path=path))
    try:
        if zipfile.is_zipfile(p):  # torch.save's format
            import torch

            return torch.load(p, weights_only=False)
        with open(p, "rb") as fh:
            return pickle.load(fh)
    except Exception as exc:  # noqa: BLE001 - any loading failure is the user's file
        raise FairpipeInputError(BAD_MODEL_FILE.format(path=path, why=exc)) from None


def adapter_for(model, n_features: int | None = None):
    """The best adapter for ``model`` (analytic for an MLPClassifier, autograd for a torch module),
    checked against the data's width."""
    if hasattr(model, "gradient") and hasattr(model, "predict_proba"):
        adapter = model
    elif _is_torch_module(model):
        adapter = TorchAdapter(model)
    elif hasattr(model, "coefs_") and hasattr(model, "out_activation_"):
        adapter = MLPAdapter(model)
    else:
        adapter = FiniteDifferenceAdapter(model)
    width = getattr(adapter, "n_features", None)
    if n_features is not None and width is not None and int(width) != n_features:
        raise FairpipeInputError(WRONG_WIDTH.format(expected=int(width), got=n_features))
    return adapter
