"""The contract every estimator of fairpipe keeps, after scikit-learn's.

- Keyword-only constructor parameters; ``__init__`` only stores them (no validation, no work), so
  ``get_params`` and ``set_params`` are derived from the signature and ``type(m)(**m.get_params())``
  is an unfitted copy.
- ``fit(X, ids=None, ...)`` validates its input and returns ``self``; learned state ends in ``_``;
  a method that needs a fitted estimator raises :class:`NotFittedError` before it.
- ``delete(ids)`` forgets rows by id and returns a :class:`DeletionReport`; the model afterwards is
  the one a fit on the remaining rows gives (each estimator documents how exactly).
- ``to_arrays()`` gives the learned state as a flat mapping of names to numpy arrays and
  ``from_arrays(arrays, **params)`` rebuilds the estimator from it: the one way a model is
  persisted (``storage`` writes these arrays into a store and reads them back). With
  ``data=False`` the mapping leaves out the rows (``points``, ``ids``, ``alive``, ``groups``): a
  model rebuilt without them predicts but cannot delete.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.validation import IdLookup, as_id_array, check_ids, deletion_request

NOT_FITTED = "This {owner} instance is not fitted yet. Call 'fit' or 'from_arrays' first."
NO_DATA = (
    "This {owner} instance was rebuilt without its rows (from_arrays without 'points'); "
    "it can predict but not {action}."
)
UNKNOWN_PARAMETER = "{owner} has no parameter {name!r}; its parameters are {names}."
DATA_ARRAYS = ("points", "ids", "alive", "groups")


class NotFittedError(FairpipeInputError, AttributeError):
    """A method that needs a fitted estimator was called before ``fit`` or ``from_arrays``.

    An ``AttributeError`` too, so ``hasattr(model, "centroids_")`` is False before fitting; and
    scikit-learn's ``NotFittedError`` when scikit-learn is imported (see :func:`not_fitted`).
    """


def not_fitted(message: str) -> NotFittedError:
    """The error to raise: a :class:`NotFittedError`, and also scikit-learn's ``NotFittedError``
    once scikit-learn is imported. Whoever catches scikit-learn's error has imported it; fairpipe
    itself never imports scikit-learn to raise (importing it costs 0.65 s, more than a whole
    cold command's budget)."""
    if "sklearn.exceptions" in sys.modules:
        return _sklearn_not_fitted_error()(message)
    return NotFittedError(message)


def _sklearn_not_fitted_error() -> type[NotFittedError]:
    """The subclass that is scikit-learn's error too, made once, on first use."""
    cls = globals().get("_SklearnNotFittedError")
    if cls is None:
        from sklearn.exceptions import NotFittedError as SklearnNotFittedError

        cls = type("_SklearnNotFittedError", (NotFittedError, SklearnNotFittedError),
                   {"__module__": __name__, "__doc__": NotFittedError.__doc__})  # fmt: skip
        globals()["_SklearnNotFittedError"] = cls
    return cls


def __getattr__(name: str):
    # pickle finds the subclass by name, in a process that has not raised it yet
    if name == "_SklearnNotFittedError":
        return _sklearn_not_fitted_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class DeletionReport:
    """What ``delete(ids)`` did: the ids removed, those unknown, those deleted before (a no-op),
    and, for the tree models, the nodes recomputed per level (level 0: leaves)."""

    deleted: np.ndarray
    unknown: np.ndarray
    already_deleted: np.ndarray
    changed: list[np.ndarray] = field(default_factory=list)
    certified: int | None = None  # QKMeans: deletions answered from the training metadata
    retrained: bool | None = None  # QKMeans: whether the batch needed a retrain

    @property
    def leaves_recomputed(self) -> int:
        return int(self.changed[0].shape[0]) if self.changed else 0

    @property
    def nodes_recomputed(self) -> int:
        return int(sum(c.shape[0] for c in self.changed))

    @property
    def certified_fraction(self) -> float:
        return (self.certified or 0) / max(self.deleted.shape[0], 1)


class BaseEstimator:
    """Parameters from the signature, the fitted check, and the rows an estimator keeps.

    Subclasses name the attribute ``fit`` sets in ``_fitted_attribute``.
    """

    _fitted_attribute = "n_features_in_"
    _estimator_type: str | None = None  # scikit-learn's kind: "clusterer" for the k-means models

    def __sklearn_tags__(self):
        """scikit-learn's tags, so that its Pipeline, clone and checks accept the estimator
        (scikit-learn is imported here, on use: importing fairpipe does not import it)."""
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=self._estimator_type, target_tags=TargetTags(required=False),
                    transformer_tags=None, regressor_tags=None, classifier_tags=None)  # fmt: skip

    @classmethod
    def _param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return [p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters, as given (scikit-learn's contract: with ``deep``, a
        parameter that is itself an estimator adds its own as ``name__param``)."""
        params = {name: getattr(self, name) for name in self._param_names()}
        if deep:
            for name, value in list(params.items()):
                if hasattr(value, "get_params") and not isinstance(value, type):
                    params.update((f"{name}__{k}", v) for k, v in value.get_params().items())
        return params

    def set_params(self, **params: Any):
        """Set constructor parameters (checked at the next ``fit``; ``name__param`` sets a
        parameter of a parameter that is an estimator); returns ``self``."""
        names = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in names:
                raise FairpipeInputError(
                    UNKNOWN_PARAMETER.format(owner=type(self).__name__, name=key, names=names)
                )
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, sub_params in nested.items():
            getattr(self, name).set_params(**sub_params)
        return self

    def __repr__(self) -> str:
        defaults = {
            p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()
        }
        changed = [
            f"{k}={v!r}" for k, v in self.get_params().items() if not _same(v, defaults.get(k))
        ]
        return f"{type(self).__name__}({', '.join(changed)})"

    def check_params(self):
        """Validate the parameters as ``fit`` does first (raises the documented error); returns
        ``self``. Flows call it before they start any work."""
        self._check_params()
        return self

    def _check_params(self) -> object:
        raise NotImplementedError

    def _check_fitted(self) -> None:
        if self._fitted_attribute not in self.__dict__:
            raise not_fitted(NOT_FITTED.format(owner=type(self).__name__))

    # -- the rows a deletable estimator keeps -----------------------------------------------------
    def _set_rows(self, points: np.ndarray, ids: np.ndarray, alive: np.ndarray | None = None):
        self.points_ = points
        self.ids_ = np.asarray(ids, dtype=np.int64)
        n = self.ids_.shape[0]
        self.alive_ = np.ones(n, bool) if alive is None else np.asarray(alive, bool).copy()
        self._lookup = IdLookup(self.ids_)

    def rows_of(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(rows holding the known ``ids``, which of ``ids`` are known), by binary search."""
        self._check_fitted()
        return self._lookup.rows(check_ids(np.atleast_1d(as_id_array(ids)), "the ids"))

    def _row_arrays(self, data: bool) -> dict[str, np.ndarray]:
        if not data or "points_" not in self.__dict__:
            return {}
        return {"points": self.points_, "ids": self.ids_, "alive": self.alive_}

    def _start_deletion(self, ids) -> tuple[DeletionReport, np.ndarray]:
        """The report of a deletion request and the rows it removes (still alive), marked dead."""
        self._check_fitted()
        if "points_" not in self.__dict__:
            raise not_fitted(NO_DATA.format(owner=type(self).__name__, action="delete"))
        ids, known, rows, live = deletion_request(ids, self._lookup, self.alive_)
        report = DeletionReport(
            deleted=ids[known][live], unknown=ids[~known], already_deleted=ids[known][~live]
        )
        rows = rows[live]
        self.alive_[rows] = False
        return report, rows


def rows_from_arrays(arrays: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The data arrays of a ``to_arrays`` mapping (None if it has no ``points``)."""
    if "points" not in arrays:
        return None
    return {name: np.asarray(arrays[name]) for name in DATA_ARRAYS if name in arrays}


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError):
        return False
