"""The fair summary in the store: ``summary/``.

- ``summary/<name>`` for every array of the summary tree, as :meth:`FairSummary.to_arrays`
  names them (:func:`fairpipe.summary.level_arrays` per level, leaves first, the root last):
  each node's candidates (the ids it passes to its parent, in stream order) and evaluation ids,
  int64 padded with -1, its utility ``value`` and its gain evaluations ``calls``.
- ``summary/ids`` int64: the root's summary, sorted (``summary_ids`` of
  :meth:`fairpipe.summary.FairSummary.to_arrays`). Parameters (under FairSummary's own names;
  older names are read as these: :mod:`fairpipe.storage.names`) and the summary's figures (bounds,
  counts per group, error, value) in ``summary`` attributes.

Only ids are stored: a node's points are read back from ``points`` when a deletion recomputes its
parent (:func:`stored_summary_tree`).
"""

from __future__ import annotations

import numpy as np

from fairpipe.storage.arrays import open_array, open_group, read_array, replace_array, zarr_checked
from fairpipe.storage.names import renamed
from fairpipe.storage.rows import points_and_groups_of
from fairpipe.summary import NodeOutput, SummaryParams, SummaryTree, level_arrays, nodes_from_arrays
from fairpipe.tree import level_key


def write_summary(root, attrs: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write (replacing any earlier one) a whole summary tree into an open store root:
    ``arrays`` as :meth:`FairSummary.to_arrays` names them (without the rows)."""
    if "summary" in root:
        del root["summary"]
    group = root.create_group("summary")
    group.attrs.update(attrs)
    for name, values in arrays.items():
        stored = "ids" if name == "summary_ids" else name
        replace_array(root, f"summary/{stored}", np.asarray(values))


def summary_store_attrs(params: SummaryParams, fanout: int, height: int) -> dict:
    """The summary's parameters under their stored names."""
    return {**params.as_attrs(), "fanout": int(fanout), "height": int(height)}


def summary_tree(session) -> tuple[SummaryParams, int, int, dict]:
    """(node parameters, fan-out, height, all attributes) of the stored summary."""
    attrs = summary_attrs(session)
    return SummaryParams.from_attrs(attrs), int(attrs["fanout"]), int(attrs["height"]), attrs


def update_summary(root, tree: SummaryTree, changed: list[np.ndarray]) -> None:
    """Overwrite the nodes a batch recomputed (``changed``, per level, as
    :meth:`SummaryTree.refresh` returns them) with what ``tree`` holds for them."""
    for level, nodes in enumerate(changed):
        if nodes.size == 0:
            continue
        for name, values in level_arrays(tree.read(level, nodes), tree.params).items():
            arr = open_array(root, f"summary/{level_key(level, name)}", mode="r+")
            with zarr_checked(arr, (nodes,)):  # a node's chunk is read, then written
                arr[nodes] = values


def write_root(root, attrs: dict, ids: np.ndarray) -> None:
    replace_array(root, "summary/ids", np.asarray(ids, dtype=np.int64))
    root["summary"].attrs.update(attrs)


def has_summary(session) -> bool:
    return "summary" in open_group(session)


def summary_attrs(session) -> dict:
    return renamed(dict(open_group(session)["summary"].attrs), "summary")


def read_summary_ids(session) -> np.ndarray:
    return read_array(session, "summary/ids")


def stored_summary_tree(session, lookup, d: int, params: SummaryParams, fanout: int,
                        height: int) -> SummaryTree:  # fmt: skip
    """The stored summary tree (``params``, ``fanout`` and ``height`` as :func:`summary_tree`
    read them) as the tree engine's node store: a node is read back from the store when a batch
    first needs it (its candidates and evaluation ids, then their points, only the chunks
    holding them); what the batch recomputes is held in memory, for :func:`update_summary` to
    write."""

    def load(level: int, nodes: np.ndarray) -> list[NodeOutput]:
        cand, evals = (read_array(session, f"summary/{level_key(level, name)}", nodes)
                       for name in ("candidates", "evaluation"))  # fmt: skip
        return nodes_from_arrays(
            cand, evals, lambda wanted: points_and_groups_of(session, lookup, wanted)
        )

    return SummaryTree(fanout, height, params, d, load=load)
