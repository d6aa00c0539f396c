"""What a command checks against its store before it starts Prefect or Dask: that the store
exists and holds data, its attributes against the options (k against the live points, the
fairness bounds against the groups), and the ids it is given against the store's ids.

Nothing here imports Prefect or Dask (a command's bad input answers in about a second); each
check reads the store's attributes and at most one small array (the ids, 8 bytes a row; the
groups and the alive mask, 5 bytes a row). The flows check again inside the writer lock, on what
they read: these checks only answer sooner.
"""

from __future__ import annotations

import numpy as np

from fairpipe.errors import K_TOO_LARGE, FairpipeInputError, check_one_of

ALL_UNKNOWN = "None of the {n} ids to forget is in the store {url} (first: {first})."
MODELS = ("dc", "q", "auto")


def existing_store(url: str):
    """(the store at ``url``, its attributes); a FairpipeInputError if there is none, or it
    holds no data."""
    from storage.store import FairpipeStore

    store = FairpipeStore.open(url)
    return store, store.require_data()


def check_forget(url: str, ids) -> None:
    """The store of a forget, and its ``ids`` (None: a drain): not all unknown to the store."""
    from fairpipe.datasets import NO_IDS
    from fairpipe.validation import IdLookup, as_id_array, check_ids

    store, _ = existing_store(url)
    if ids is None:
        return
    ids = np.unique(check_ids(np.atleast_1d(as_id_array(ids)), "the ids to forget"))
    if ids.size == 0:
        raise FairpipeInputError(NO_IDS)
    tip = store.readonly_session().snapshot_id
    if not IdLookup(store.ids_at(tip)).rows(ids)[1].any():
        raise FairpipeInputError(ALL_UNKNOWN.format(n=ids.size, url=store.url, first=int(ids[0])))


def check_fit(url: str, k: int, model: str) -> None:
    """The store of a fit: the model kind, and k against its live points."""
    check_one_of(model, MODELS, "model", "fit")
    store, attrs = existing_store(url)
    n_alive = int(attrs["n_alive"])
    if k > n_alive:
        what = f"live points of the store {store.url}"
        raise FairpipeInputError(K_TOO_LARGE.format(name="k", k=k, n=n_alive, what=what))


def check_summarize(url: str, k: int, lower: float | None, upper: float | None,
                    bounds_file: str | None, **summary) -> None:  # fmt: skip
    """The store of a summary: the bounds against its groups (their names, and the live rows
    each holds), the summary's parameters (``summary``: FairSummary's, besides k and the
    bounds), and k against its live points; in the order the flow checks them."""
    from fairpipe.summary import FairSummary, check_bounds, resolve_bounds
    from storage.store import read_array

    store, attrs = existing_store(url)
    names = list(attrs.get("group_names") or ["all"])
    lo, up = resolve_bounds(k, names, lower, upper, bounds_file)
    FairSummary(k=k, lower=lo, upper=up, **summary).node_params()
    check_bounds(k, lo, up, names=names)
    n_alive = int(attrs["n_alive"])
    if k > n_alive:
        what = f"elements of the store {store.url}"
        raise FairpipeInputError(K_TOO_LARGE.format(name="k", k=k, n=n_alive, what=what))
    session = store.readonly_session()
    alive, groups = read_array(session, "alive"), read_array(session, "groups")
    check_bounds(k, lo, up, np.bincount(groups[alive], minlength=len(names)), names)
