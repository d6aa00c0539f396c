"""The clustering model in the store: ``tree/`` (DC-k-means) or ``qkmeans/`` (Q-k-means).

- ``tree/level_<j>/centroids`` float64 (nodes_j, k, d) and ``tree/level_<j>/masses`` float64
  (nodes_j, k), level 0 = leaves, level ``height`` = the root; parameters in ``tree`` attributes.
- ``qkmeans/<name>`` for every array of a fitted :class:`fairpipe.q_kmeans.QKMeans` (per run and
  step: inputs, outputs, phases, sums, sizes, losses; per run: steps, losses; the seed ids),
  parameters and scalars (``best``: the model's run) in ``qkmeans`` attributes.

The root attribute ``model`` says which one the store holds (``"dc"`` or ``"q"``).
"""

from __future__ import annotations

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.q_kmeans import Q_STATE
from storage.store import _zarr, read_array

NO_MODEL = "The store {url} has no fitted model. Run 'fairpipe fit --store {url} --k K' first."


def _replace(root, name: str, values: np.ndarray) -> None:
    if name in root:
        del root[name]
    arr = root.create_array(name, shape=values.shape, dtype=values.dtype)
    if values.size:
        arr[...] = values


def write_dc_tree(root, params: dict, centroids: list[np.ndarray], masses: list[np.ndarray]):
    """Write (replacing any earlier model) a DC-k-means tree into an open store root."""
    for group in ("tree", "qkmeans"):
        if group in root:
            del root[group]
    tree = root.create_group("tree")
    tree.attrs.update(params)
    for level, (c, m) in enumerate(zip(centroids, masses)):
        _replace(root, f"tree/level_{level}/centroids", np.asarray(c, dtype=np.float64))
        _replace(root, f"tree/level_{level}/masses", np.asarray(m, dtype=np.float64))
    root.attrs["model"] = "dc"


def update_dc_nodes(root, level: int, nodes: np.ndarray, centroids, masses) -> None:
    """Overwrite some nodes of one level (a deletion batch's recomputed path)."""
    if nodes.size == 0:
        return
    c = _zarr().open_array(root.store, path=f"tree/level_{level}/centroids", mode="r+")
    m = _zarr().open_array(root.store, path=f"tree/level_{level}/masses", mode="r+")
    c[nodes] = centroids
    m[nodes] = masses


def read_dc_tree(session) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    group = _zarr().open_group(session.store, mode="r")
    params = dict(group["tree"].attrs)
    levels = int(params["height"]) + 1
    centroids = [read_array(session, f"tree/level_{j}/centroids") for j in range(levels)]
    masses = [read_array(session, f"tree/level_{j}/masses") for j in range(levels)]
    return params, centroids, masses


def write_q_model(root, params: dict, arrays: dict, extra: dict) -> None:
    for group in ("tree", "qkmeans"):
        if group in root:
            del root[group]
    q = root.create_group("qkmeans")
    q.attrs.update({**params, **extra})
    for name in Q_STATE:
        _replace(root, f"qkmeans/{name}", np.asarray(arrays[name]))
    root.attrs["model"] = "q"


def read_q_model(session) -> tuple[dict, dict]:
    group = _zarr().open_group(session.store, mode="r")
    attrs = dict(group["qkmeans"].attrs)
    arrays = {name: read_array(session, f"qkmeans/{name}") for name in Q_STATE}
    return attrs, arrays


def model_kind(attrs: dict) -> str | None:
    return attrs.get("model")


def require_model(attrs: dict, url: str) -> str:
    kind = attrs.get("model")
    if kind is None:
        raise FairpipeInputError(NO_MODEL.format(url=url))
    return kind
