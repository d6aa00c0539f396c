"""Keep every model exact after a batch of changed rows: insertion is the mirror of deletion.

A batch (rows erased by the forget flow, or rows appended by the ingest flow) reaches the tree
leaves that hold its ids (a leaf is a hash of (seed, id)). Only those leaves are recomputed, from
the live rows they hold after the batch, then only their ancestors; the rest of the tree is
untouched. The DC-k-means tree and the fair summary are updated so; a Q-k-means model certifies
deletions from its metadata (retraining when one is not certified) and retrains on an append.
Every artifact then equals a fresh build on the live rows with the same seed, bit for bit.
"""

from __future__ import annotations

import numpy as np
from prefect.cache_policies import NO_CACHE

from fairpipe.cluster import QKMeans, refresh_levels, solve_leaf_group
from fairpipe.flows.dask_map import on_cluster
from fairpipe.flows.fit import fit_q_task, solve_leaves_task
from fairpipe.flows.private import task
from fairpipe.flows.summarize import summarize_leaves_task
from fairpipe.storage.models import StoredLevels, model_params, read_model, write_model
from fairpipe.storage.rows import (
    RowBlocks,
    n_features,
    read_alive,
    read_all_live,
    read_groups,
    read_ids,
    read_leaf_rows,
)
from fairpipe.storage.summary import (
    has_summary,
    stored_summary_tree,
    summary_tree,
    update_summary,
    write_root,
)
from fairpipe.summary import root_figures, summarize_leaf_group
from fairpipe.tree import reached_leaves
from fairpipe.validation import IdLookup

# Up to this many rows in the leaves a batch reaches, the leaves and their ancestors are solved
# in the flow process: a Dask round trip (task, nested shuffle) costs seconds, the kernel
# milliseconds. Larger batches go to Dask.
LOCAL_LEAF_ROWS = 200_000


def update_dc(txn, all_ids, alive_after, rows, blocks: RowBlocks, local_rows) -> dict:
    """Recompute the DC-k-means leaves holding ``rows`` (from the live rows after the batch),
    then their ancestors, in the store's tree: a refresh reads the children it needs and writes
    the nodes it recomputes, nothing else (:class:`~fairpipe.storage.models.StoredLevels`)."""
    params = model_params(txn.session, "dc")
    n_leaves = int(params["fanout"]) ** int(params["height"])
    seed, k, T = int(params["seed"]), int(params["n_clusters"]), int(params["max_iter"])
    leaves, leaf_rows = reached_leaves(all_ids, alive_after, rows, seed, n_leaves)
    if leaf_rows.size <= local_rows:
        # Same functions as the Dask path (so the same bits), without its round trips.
        d = n_features(txn.session)
        parts = read_leaf_rows(txn.session, leaf_rows, blocks, seed, n_leaves, d)
        got, c, m = solve_leaf_group(leaves, k, T, seed, d, parts)
    else:
        got, c, m = txn.reading(solve_leaves_task, blocks, params, leaves, leaf_rows)
    # Leaves left with no live row at all get no part: the refresh empties them.
    changed = refresh_levels(params, StoredLevels(txn.root), leaves, got, c, m)
    return {
        "leaves_recomputed": int(leaves.size),
        "nodes_recomputed": int(sum(n.size for n in changed)),
    }


def forget_q(session, ids_to_delete: np.ndarray) -> tuple[QKMeans, dict]:
    """(A Dask job.) Delete from the Q model (``session``: the store before the rows were
    erased, as the model was fitted on)."""
    X, ids = read_all_live(session)
    rows = {"points": X, "ids": ids, "alive": np.ones(ids.shape[0], bool)}
    model = read_model(session, "q", rows)
    assert isinstance(model, QKMeans)
    report = model.delete(ids_to_delete)
    return model, {
        "certified": report.certified,
        "certified_fraction": report.certified_fraction,
        "retrained": report.retrained,
    }


@task(name="update-q-kmeans", cache_policy=NO_CACHE)
def forget_q_task(session, ids_to_delete: np.ndarray) -> tuple[QKMeans, dict]:
    return on_cluster(forget_q, session, ids_to_delete)


def refit_q(txn) -> dict:
    """An append reaches every Q-k-means centroid: retrain it on the live rows (the model a
    fresh fit gives)."""
    params = model_params(txn.session, "q")
    model = txn.reading(lambda fork: fit_q_task.submit(fork, params).result())
    write_model(txn.root, model)
    return {"retrained": True}


def update_summary_tree(txn, all_ids, alive_after, rows, blocks: RowBlocks, local_rows) -> dict:
    """Recompute the summary nodes the changed ``rows`` reach: their leaves from the live points
    after the batch (in this process when they hold at most ``local_rows`` rows, else on Dask),
    then those leaves' ancestors. Call once the batch is written (groups and alive)."""
    if not has_summary(txn.session):
        return {}
    params, fanout, height, a = summary_tree(txn.session)
    n_leaves = fanout**height
    d = n_features(txn.session)
    leaves, leaf_rows = reached_leaves(all_ids, alive_after, rows, params.seed, n_leaves)
    if leaf_rows.size <= local_rows:  # the same functions as the Dask path, without round trips
        parts = read_leaf_rows(txn.session, leaf_rows, blocks, params.seed, n_leaves, d)
        got = dict(summarize_leaf_group(leaves, params, d, parts))
    else:
        got = txn.reading(summarize_leaves_task, blocks, params, n_leaves, leaves, leaf_rows)
    lookup = IdLookup(all_ids)
    tree = stored_summary_tree(txn.session, lookup, d, params, fanout, height)
    changed = tree.refresh(leaves, got)
    update_summary(txn.root, tree, changed)
    groups = read_groups(txn.session)
    names = list(a["group_names"])
    figures = root_figures(tree.root, params, names, lambda ids: groups[lookup.rows(ids)[0]])
    write_root(
        txn.root,
        {k: v for k, v in figures.items() if k != "ids"},
        np.asarray(figures["ids"], dtype=np.int64),
    )
    return {
        "summary_nodes_recomputed": int(sum(n.size for n in changed)),
        "summary_error": figures["error"],
    }


def update_after_append(txn, base: int, blocks: RowBlocks) -> dict:
    """Bring the store's model and summary up to date with the rows [base, blocks.n) just
    appended (in the same transaction): the leaves they fall in and their ancestors."""
    kind = txn.root.attrs.get("model")
    summary = has_summary(txn.session)
    if kind is None and not summary:
        return {}
    all_ids, alive = read_ids(txn.session), read_alive(txn.session)
    rows = np.arange(base, blocks.n, dtype=np.int64)
    out: dict = {}
    if kind == "dc":
        out.update(update_dc(txn, all_ids, alive, rows, blocks, LOCAL_LEAF_ROWS))
    elif kind == "q":
        out.update(refit_q(txn))
    if summary:
        out.update(update_summary_tree(txn, all_ids, alive, rows, blocks, LOCAL_LEAF_ROWS))
    return out
