"""The clustering model in the store: ``tree/`` (DC-k-means) or ``qkmeans/`` (Q-k-means).

A model is written as its estimator's ``to_arrays(data=False)`` (the rows are the store's own
``points``, ``ids`` and ``alive``) and its parameters, and read back with ``from_arrays``:

- ``tree/<name>`` for every array of a DC-k-means tree, as the estimator names them
  (:func:`fairpipe.cluster.tree_array_names`: each level's centroids and masses, leaves first);
- ``qkmeans/<name>`` for every array of a fitted Q-k-means model (per run and step: inputs,
  outputs, phases, sums, sizes, losses; per run: steps, losses; the seed ids);
- the parameters in the group's attributes, under the estimator's own names, with ``model``;
  Q-k-means also keeps ``n_fit`` and ``best`` there (older names are read as these:
  :mod:`fairpipe.storage.names`).

The root attribute ``model`` says which one the store holds (``"dc"`` or ``"q"``).
"""

from __future__ import annotations

import numpy as np

from fairpipe.cluster import Q_STATE, DCKMeans, QKMeans, level_arrays, tree_array_names
from fairpipe.errors import FairpipeInputError
from fairpipe.storage.arrays import open_array, open_group, read_array, replace_array, zarr_checked
from fairpipe.storage.names import renamed

NO_MODEL = "The store {url} has no fitted model. Run 'fairpipe fit --store {url}' first."
# The estimators' parameters, kept under their own names in the model group's attributes.
PARAMS = {
    "dc": ("n_clusters", "fanout", "height", "max_iter", "n_init", "seed"),
    "q": ("n_clusters", "epsilon", "balance", "max_iter", "n_init", "seed"),
}
GROUP = {"dc": "tree", "q": "qkmeans"}
ESTIMATOR: dict[str, type[DCKMeans] | type[QKMeans]] = {"dc": DCKMeans, "q": QKMeans}


def kind_of(model) -> str:
    return "dc" if isinstance(model, DCKMeans) else "q"


def store_params(kind: str, params: dict) -> dict:
    """The estimator parameters the store keeps."""
    return {name: params[name] for name in PARAMS[kind]}


def library_params(kind: str, attrs: dict) -> dict:
    """The estimator's parameters from the model group's attributes (older names too)."""
    attrs = renamed(attrs, GROUP[kind])
    return {name: attrs[name] for name in PARAMS[kind]}


def write_model(root, model: DCKMeans | QKMeans) -> None:
    """Write (replacing any earlier model) a fitted model into an open store root."""
    kind = kind_of(model)
    for group in GROUP.values():
        if group in root:
            del root[group]
    group = root.create_group(GROUP[kind])
    attrs = {"model": kind, **store_params(kind, model.get_params())}
    if isinstance(model, QKMeans):
        attrs.update(n_fit=int(model.n_fit_), best=int(model.best_))
    group.attrs.update(attrs)
    for name, values in model.to_arrays(data=False).items():
        replace_array(root, f"{GROUP[kind]}/{name}", np.asarray(values))
    root.attrs["model"] = kind


class StoredLevels:
    """The stored DC-k-means tree as a node store (:class:`fairpipe.tree.NodeStore`): a refresh
    (:func:`fairpipe.cluster.refresh_levels`) reads the children it needs and writes the nodes it
    recomputes, each level's arrays named as the estimator names them
    (:func:`fairpipe.cluster.level_arrays`); nothing else of the tree is read. ``root``: the root
    group of a writable session (a transaction's)."""

    def __init__(self, root):
        self.root = root
        self._opened: dict[int, list] = {}  # each level's arrays, opened once

    def _arrays(self, level: int):
        if level not in self._opened:
            self._opened[level] = [open_array(self.root, f"{GROUP['dc']}/{name}", mode="r+")
                                   for name in level_arrays(level)]  # fmt: skip
        return self._opened[level]

    def read(self, level: int, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = []
        for arr in self._arrays(level):
            sel = (np.asarray(nodes, np.int64),) + (slice(None),) * (arr.ndim - 1)
            with zarr_checked(arr, sel):
                out.append(np.asarray(arr.get_orthogonal_selection(sel)))
        return out[0], out[1]

    def write(self, level: int, nodes: np.ndarray, batch: tuple[np.ndarray, np.ndarray]) -> None:
        for arr, values in zip(self._arrays(level), batch):
            with zarr_checked(arr, (nodes,)):  # a node's chunk is read, then written
                arr[np.asarray(nodes, np.int64)] = values

    def empty(self, level: int, nodes: np.ndarray) -> None:
        for arr in self._arrays(level):
            with zarr_checked(arr, (nodes,)):
                arr[np.asarray(nodes, np.int64)] = 0.0


def require_model(attrs: dict, url: str) -> str:
    kind = attrs.get("model")
    if kind is None:
        raise FairpipeInputError(NO_MODEL.format(url=url))
    return kind


def model_params(session, kind: str) -> dict:
    """The stored model's estimator parameters."""
    return library_params(kind, dict(open_group(session)[GROUP[kind]].attrs))


def read_model(session, kind: str, rows: dict | None = None) -> DCKMeans | QKMeans:
    """The stored model as its estimator; ``rows`` (``points``, ``ids``, ``alive``) makes it
    able to delete."""
    params = model_params(session, kind)
    if kind == "dc":
        names = tree_array_names(int(params["height"]))
    else:
        names = list(Q_STATE)
    arrays = {name: read_array(session, f"{GROUP[kind]}/{name}") for name in names}
    return ESTIMATOR[kind].from_arrays({**arrays, **(rows or {})}, **params)
