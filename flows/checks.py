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
# Work this small runs on threads in the command's process, not on a cluster of worker
# processes (which costs about 1.4 s to start and 0.5 s to close on 2 cores, more than the work):
# a fit or summary of at most SMALL_ROWS live points, a forget of at most SMALL_IDS ids with no
# other request pending (the flow itself rewrites the index of fewer than 256 rows).
SMALL_ROWS = 200_000
SMALL_IDS = 256

_checked: dict[str, dict] = {}  # the attributes a check read, for the command's next question


def existing_store(url: str, remember: bool = False):
    """(the store at ``url``, its attributes); a FairpipeInputError if there is none, or it
    holds no data. ``remember``: keep the attributes for the command's next question
    (:func:`small_store`, :func:`small_forget`), asked once."""
    from storage.store import FairpipeStore

    store = FairpipeStore.open(url)
    attrs = store.require_data()
    if remember:
        _checked[url] = attrs
    return store, attrs


def _attrs(url: str) -> dict:
    """The attributes the command's check read just before (read again if it did not)."""
    attrs = _checked.pop(url, None)
    return attrs if attrs is not None else existing_store(url)[1]


def small_store(url: str) -> bool:
    """Whether a fit or summary of the store at ``url`` is small work (see SMALL_ROWS)."""
    return int(_attrs(url)["n_alive"]) <= SMALL_ROWS


def small_forget(url: str, ids) -> bool:
    """Whether a forget of ``ids`` (None: a drain) is small work (see SMALL_IDS)."""
    from storage.queue import has_queue, pending

    _checked.pop(url, None)
    n_ids = 0 if ids is None else len(np.atleast_1d(ids))
    return n_ids <= SMALL_IDS and not (has_queue(url) and pending(url))


def check_forget(url: str, ids) -> None:
    """The store of a forget, and its ``ids`` (None: a drain): not all unknown to the store."""
    from fairpipe.datasets import NO_IDS
    from fairpipe.validation import IdLookup, as_id_array, check_ids
    from storage.queue import check_queue

    store, _ = existing_store(url, remember=True)
    check_queue(url)  # forget files its ids as a request, then drains the queue
    if ids is None:
        return
    ids = np.unique(check_ids(np.atleast_1d(as_id_array(ids)), "the ids to forget"))
    if ids.size == 0:
        raise FairpipeInputError(NO_IDS)
    tip = store.readonly_session().snapshot_id
    if not IdLookup(store.ids_at(tip)).rows(ids)[1].any():
        raise FairpipeInputError(ALL_UNKNOWN.format(n=ids.size, url=store.url, first=int(ids[0])))


def check_fit(url: str, n_clusters: int, model: str) -> None:
    """The store of a fit: the model kind, and n_clusters against its live points."""
    check_one_of(model, MODELS, "model", "fit")
    store, attrs = existing_store(url, remember=True)
    n_alive = int(attrs["n_alive"])
    if n_clusters > n_alive:
        what = f"live points of the store {store.url}"
        raise FairpipeInputError(
            K_TOO_LARGE.format(name="n_clusters", k=n_clusters, n=n_alive, what=what)
        )


def check_summarize(url: str, k: int, lower: float | None, upper: float | None,
                    bounds_file: str | None, **summary) -> None:  # fmt: skip
    """The store of a summary: the bounds against its groups (their names, and the live rows
    each holds), the summary's parameters (``summary``: FairSummary's, besides k and the
    bounds), and k against its live points; in the order the flow checks them."""
    from fairpipe.summary import FairSummary, check_bounds, resolve_bounds
    from storage.arrays import read_array

    store, attrs = existing_store(url, remember=True)
    names = list(attrs.get("group_names") or ["all"])
    lo, up = resolve_bounds(k, names, lower, upper, bounds_file)
    check_bounds(k, lo, up, names=names)  # first: its errors name the groups
    FairSummary(k=k, lower=lo, upper=up, **summary).node_params()
    n_alive = int(attrs["n_alive"])
    if k > n_alive:
        what = f"elements of the store {store.url}"
        raise FairpipeInputError(K_TOO_LARGE.format(name="k", k=k, n=n_alive, what=what))
    session = store.readonly_session()
    alive, groups = read_array(session, "alive"), read_array(session, "groups")
    check_bounds(k, lo, up, np.bincount(groups[alive], minlength=len(names)), names)
