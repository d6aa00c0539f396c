"""What a command checks against its store before it starts Prefect or Dask: that the store
exists and holds data (an ingest: that what its --store names is a store or nothing yet), its
attributes against the options (k against the live points, the fairness bounds against the
groups, an append's settings and dimension), and the ids it is given against the store's ids.

Nothing here imports Prefect or Dask (a command's bad input answers in about a second), and
storage only inside the checks (start-up time); each check reads the store's attributes and at
most one small array (the ids, 8 bytes a row; the groups and the alive mask, 5 bytes a row), or
the chunks of stored ids whose range may hold an appended id. The flows check again inside the
writer lock, on what they read: these checks only answer sooner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fairpipe.errors import K_TOO_LARGE, FairpipeInputError, check_one_of

if TYPE_CHECKING:
    from fairpipe.datasets import SourcePlan
    from fairpipe.flows.options import IngestOptions

DIM_MISMATCH = (
    "{where} holds {got}-dimensional points; the store {url} holds {d}-dimensional points."
)
ID_CLASH = "Id {id} of {where} is already in the store {url}; ids must be unique."


NO_GROUPS = (
    "The store {url} has groups ({names}); {where} has none. Name its group labels with "
    "--group-column (CSV, Parquet) or --groups-file (.npy)."
)
UNGROUPED_STORE = (
    "{where} has groups ({names}); the store {url} has none, so its rows could not be told "
    "apart. Ingest into a new store, or leave out --group-column / --groups-file."
)
NEW_GROUP_WITH_SUMMARY = (
    "{where} brings the group(s) {new}, which the summary of the store {url} has no bounds for. "
    "Append without them, or give every group bounds: ingest into a new store and summarize it."
)
APPEND_CONFLICT = (
    "{flag} {given} contradicts the store {url}, built with {flag} {stored}. An append keeps "
    "the store's settings: leave {flag} out, or ingest into a new store."
)
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
    from fairpipe.storage.store import FairpipeStore

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
    from fairpipe.storage.queue import has_queue, pending

    _checked.pop(url, None)
    n_ids = 0 if ids is None else len(np.atleast_1d(ids))
    return n_ids <= SMALL_IDS and not (has_queue(url) and pending(url))


def check_forget(url: str, ids) -> None:
    """The store of a forget, and its ``ids`` (None: a drain): not all unknown to the store."""
    from fairpipe.datasets import NO_IDS
    from fairpipe.storage.queue import check_queue
    from fairpipe.validation import IdLookup, as_id_array, check_ids

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
                    bounds: str | None, **summary) -> None:  # fmt: skip
    """The store of a summary: the bounds against its groups (their names, and the live rows
    each holds), the summary's parameters (``summary``: FairSummary's, besides k and the
    bounds), and k against its live points; in the order the flow checks them."""
    from fairpipe.storage.rows import live_group_counts
    from fairpipe.summary import FairSummary, check_bounds, resolve_bounds

    store, attrs = existing_store(url, remember=True)
    names = list(attrs.get("group_names") or ["all"])
    lo, up = resolve_bounds(k, names, lower, upper, bounds)
    check_bounds(k, lo, up, names=names)  # first: its errors name the groups
    FairSummary(k=k, lower=lo, upper=up, **summary).node_params()
    n_alive = int(attrs["n_alive"])
    if k > n_alive:
        what = f"elements of the store {store.url}"
        raise FairpipeInputError(K_TOO_LARGE.format(name="k", k=k, n=n_alive, what=what))
    live = live_group_counts(store.readonly_session(), len(names))
    check_bounds(k, lo, up, np.asarray(live), names)


def check_ingest(url: str, options: IngestOptions):
    """The store of an ingest: a store, or nothing yet (a folder that is no store or a file is
    refused); for an append, the settings given against the store's. Returns what an append's
    source is checked against (:func:`check_append`): (its attributes, a read-only session, its
    URL), or None for a new store (nothing at ``url``, or a store that holds no data yet)."""
    from dataclasses import replace

    from fairpipe.storage.store import FairpipeStore

    store = FairpipeStore.open_existing(url)
    if store is None:
        return None
    session = store.readonly_session()
    attrs = store.attrs(session)
    if "n" not in attrs:
        return None
    check_append_options(replace(options, scale=None), attrs, store.url)  # (scale: by the source)
    return attrs, session, store.url


def check_append(plan: SourcePlan, options: IngestOptions, attrs: dict, session, url: str) -> None:
    """An append of ``plan`` to the store at ``url`` (its attributes ``attrs``, read in
    ``session``): the store's dimension and settings, ids it does not hold yet, groups it can
    take."""
    from fairpipe.storage.rows import StoredIds
    from fairpipe.storage.summary import has_summary

    if plan.d != attrs["d"]:
        raise FairpipeInputError(
            DIM_MISMATCH.format(where=plan.where, got=plan.d, url=url, d=attrs["d"])
        )
    check_append_options(options, attrs, url, plan.kind)
    base = int(attrs["n"])
    ids = plan.ids if plan.ids is not None else np.arange(base, base + plan.n, dtype=np.int64)
    # Stored ids are unique: a binary search of the new ones in the chunks of stored ids whose
    # range may hold one (none for ids that continue the row numbers; a full read of 1M ids
    # took 0.03 s, a set intersection 0.86 s)
    clash = StoredIds(session, base).rows(ids)[1]
    if clash.any():
        first = int(ids[np.argmax(clash)])  # the first in the source's order
        raise FairpipeInputError(ID_CLASH.format(id=first, where=plan.where, url=url))
    stored = list(attrs.get("group_names", []))
    check_append_groups(plan, stored, url, has_summary(session))


def check_append_options(options: IngestOptions, attrs: dict, url: str, kind: str = "") -> None:
    """Refuse settings given for an append that differ from the store's (``kind``: the
    source's, which resolves a ``scale`` of ``auto``)."""
    from fairpipe.datasets import resolve_scale
    from fairpipe.storage.rows import scale_method

    stored = {
        "--scale": scale_method(attrs),
        "--seed": attrs["seed"],
        "--n-hashes": attrs["lsh"]["n_hashes"],
        "--n-tables": attrs["lsh"]["n_tables"],
        "--bucket-width": attrs["lsh"]["bucket_width"],
        "--radius": attrs["lsh"].get("radius", attrs.get("suggested_radius")),
        "--recall": attrs["lsh"].get("recall_target"),
        "--max-radius": attrs["lsh"].get("max_radius"),
        "--chunk-rows": attrs["chunk_rows"],
    }
    given = {
        "--seed": options.seed,
        "--n-hashes": options.n_hashes,
        "--n-tables": options.n_tables,
        "--bucket-width": options.bucket_width,
        "--radius": options.radius,
        "--recall": options.recall,
        "--max-radius": options.max_radius,
        "--chunk-rows": options.chunk_rows,
        "--scale": None if options.scale is None else resolve_scale(options.scale, kind),
    }
    for flag, value in given.items():
        if value is not None and value != stored[flag]:
            shown = "none" if stored[flag] is None else stored[flag]
            raise FairpipeInputError(
                APPEND_CONFLICT.format(flag=flag, given=value, url=url, stored=shown)
            )


def check_append_groups(plan: SourcePlan, stored: list[str], url: str, summary: bool) -> None:
    """A source without groups into a grouped store (or the reverse) is refused; so is a new
    group when the store has a summary (its bounds name every group)."""
    if stored and not plan.group_names:
        raise FairpipeInputError(NO_GROUPS.format(url=url, names=", ".join(stored),
                                                  where=plan.where))  # fmt: skip
    if plan.group_names and not stored:
        raise FairpipeInputError(
            UNGROUPED_STORE.format(where=plan.where, names=", ".join(plan.group_names), url=url)
        )
    new = [name for name in plan.group_names if name not in stored]
    if new and summary:
        raise FairpipeInputError(NEW_GROUP_WITH_SUMMARY.format(where=plan.where, new=new, url=url))
