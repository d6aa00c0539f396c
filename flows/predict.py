"""Query time (no flow): the nearest root centroid of the store's clustering model."""

from __future__ import annotations

import numpy as np

from fairpipe.cluster import DCKMeans, nearest
from fairpipe.errors import FairpipeInputError
from fairpipe.storage.models import read_model, require_model
from fairpipe.storage.rows import read_alive_at, read_points_at, scale_points
from fairpipe.storage.store import FairpipeStore
from fairpipe.validation import check_points

DEAD_ROW = "Row {row} of the store {url} has been forgotten; it cannot be used as a query."
BAD_ROW = "Query row {row} is out of range: the store {url} holds rows 0..{last}."
ONE_QUERY = "Give exactly one of query_ids, query_rows or queries."
UNKNOWN_ID = "Id {id} given to --query-id is not in the store {url}."
FORGOTTEN_ID = "Id {id} given to --query-id has been forgotten by the store {url}."


def load_centroids(store: FairpipeStore, session=None) -> tuple[str, np.ndarray, np.ndarray]:
    """(model, centroids (k, d), masses (k,)) of the committed model (a Q-k-means model's masses
    are its last step's cluster sizes)."""
    session = session or store.readonly_session()
    kind = require_model(store.attrs(session), store.url)
    model = read_model(session, kind)
    if isinstance(model, DCKMeans):
        return kind, model.centroids_, model.masses_
    return kind, model.centroids_, model.sizes_[-1]


def rows_of_ids(store: FairpipeStore, ids, n: int) -> np.ndarray:
    """The rows of the live stored ``ids`` (only the chunks of ids that may hold them are
    read), or an error naming the first unknown or forgotten one."""
    from fairpipe.storage.rows import StoredIds
    from fairpipe.validation import as_id_array, check_ids

    ids = check_ids(np.atleast_1d(as_id_array(ids)), "--query-id")
    session = store.readonly_session()
    found, known = StoredIds(session, n).rows(ids)
    if not known.all():
        first = int(ids[np.argmin(known)])
        raise FairpipeInputError(UNKNOWN_ID.format(id=first, url=store.url))
    alive = read_alive_at(session, found)
    if not alive.all():
        raise FairpipeInputError(FORGOTTEN_ID.format(id=int(ids[np.argmin(alive)]), url=store.url))
    return found


def predict_store(store_url: str, *, query_rows=None, queries=None, query_ids=None) -> dict:
    store = FairpipeStore.open(store_url)
    attrs = store.require_data()
    kind, C, mass = load_centroids(store)
    if sum(x is not None for x in (query_rows, queries, query_ids)) != 1:
        raise FairpipeInputError(ONE_QUERY)
    if query_ids is not None:
        query_rows = rows_of_ids(store, query_ids, int(attrs["n"]))
    if query_rows is not None:
        rows = np.atleast_1d(np.asarray(query_rows, dtype=np.int64))
        n = int(attrs["n"])
        for r in rows:
            if not 0 <= r < n:
                raise FairpipeInputError(BAD_ROW.format(row=int(r), url=store.url, last=n - 1))
        session = store.readonly_session()
        alive = read_alive_at(session, rows)
        if not alive.all():
            raise FairpipeInputError(
                DEAD_ROW.format(row=int(rows[np.argmin(alive)]), url=store.url)
            )
        X = read_points_at(session, rows)
    else:
        Q = np.asarray(queries)
        X = check_points(
            Q[None, :] if Q.ndim == 1 else Q, where="the query file", n_features=int(attrs["d"])
        )
        X = scale_points(attrs, X)  # as the store's points were
    label, d2 = nearest(X, C, mass > 0)
    return {
        "store": store.url,
        "model": kind,
        "clusters": label.tolist(),
        "distances": np.sqrt(d2).tolist(),
        "centroid_masses": mass.tolist(),
    }
