"""The fair summary in the store: ``summary/``.

- ``summary/level_<j>/candidates`` int64 (nodes_j, k + sum l): each node's candidates (the ids it
  passes to its parent, in stream order), padded with -1; level 0 = leaves, the last = the root.
- ``summary/level_<j>/evaluation`` int64 (nodes_j, eval_size): each node's evaluation ids, padded.
- ``summary/level_<j>/value`` float64 and ``calls`` int64 (nodes_j,): the node's utility and its
  gain evaluations.
- ``summary/ids`` int64: the root's summary, sorted (``summary_ids`` of
  :meth:`fairpipe.summary.FairSummary.to_arrays`). Parameters (under FairSummary's own names;
  older names are read as these: :mod:`storage.names`) and the summary's figures (bounds,
  counts per group, error, value) in ``summary`` attributes.

Only ids are stored: a node's points are read back from ``points`` when a deletion recomputes its
parent (:func:`node_loader`).
"""

from __future__ import annotations

import numpy as np

from fairpipe.summary import NodeOutput, SummaryParams, nodes_from_arrays
from storage.index import points_and_groups_of
from storage.names import renamed
from storage.store import open_array, open_group, read_array, replace_array, zarr_checked

NO_SUMMARY = (
    "The store {url} has no summary. Run 'fairpipe summarize --store {url} --k K --lower L "
    "--upper U' first."
)


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


def update_summary(root, level: int, nodes: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
    """Overwrite some nodes of one level (a deletion batch's recomputed path)."""
    for name, values in arrays.items():
        arr = open_array(root, f"summary/level_{level}/{name}", mode="r+")
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


def node_loader(session, lookup):
    """``load(level, nodes)`` for :func:`fairpipe.summary.merge_ancestors`: stored nodes with
    their candidates' and evaluation points read back (only the chunks holding them)."""

    def load(level: int, nodes: np.ndarray) -> list[NodeOutput]:
        cand = read_array(session, f"summary/level_{level}/candidates", nodes)
        evals = read_array(session, f"summary/level_{level}/evaluation", nodes)
        return nodes_from_arrays(
            cand, evals, lambda wanted: points_and_groups_of(session, lookup, wanted)
        )

    return load
