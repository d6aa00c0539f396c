"""Query time (no flow): stored rows by id, and what became of the forgotten ones.

A few ids cost a few chunks, whatever the store's size: their rows are found by reading only the
chunks of ``ids`` whose range may hold them (:class:`fairpipe.storage.rows.StoredIds`), then only the
chunks of ``alive``, ``groups`` and ``points`` holding those rows. A forgotten row's data is
erased: it is shown by its id, when it was forgotten and the receipt of the request that did it
(:func:`fairpipe.storage.receipts.receipts_of_rows`), never by anything that was stored of it.
"""

from __future__ import annotations

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.storage.receipts import read_receipts, receipts_of_rows
from fairpipe.storage.rows import (
    StoredIds,
    feature_names,
    read_alive_at,
    read_groups_at,
    read_points_at,
    scale_method,
    unscale_points,
)
from fairpipe.storage.store import FairpipeStore

UNKNOWN_IDS = "Id {id} is not in the store {url}{more}."
# A receipt as show prints it: what the request was, never the other ids it named.
RECEIPT_FIELDS = ("request", "n_ids", "reason", "requested_at", "applied_at", "commit",
                  "erased_at")  # fmt: skip


def show_rows(store_url: str, ids: np.ndarray) -> dict:
    """The rows of ``ids`` (in the order given, each once): id, group and features of a live
    row; id, ``forgotten_at`` and ``receipt`` of a forgotten one. An unknown id is an error
    naming it."""
    store = FairpipeStore.open(store_url)
    attrs = store.require_data()
    session = store.readonly_session()
    ids = np.asarray(list(dict.fromkeys(np.asarray(ids, dtype=np.int64).tolist())), np.int64)
    found, known = StoredIds(session, int(attrs["n"])).rows(ids)
    if not known.all():
        missing = ids[~known]
        more = f" (nor are {missing.size - 1} more of the ids given)" if missing.size > 1 else ""
        raise FairpipeInputError(UNKNOWN_IDS.format(id=int(missing[0]), url=store.url, more=more))
    order = np.argsort(found, kind="stable")  # each chunk read once, in row order
    rows = found[order]
    alive = np.empty(rows.size, bool)
    alive[order] = read_alive_at(session, rows)
    live_rows = found[alive]
    names = list(attrs.get("group_names") or ["all"])
    points = read_points_at(session, live_rows) if live_rows.size else None
    if points is not None:
        points = unscale_points(attrs, points)  # in the source's units, as the user gave them
    groups = read_groups_at(session, live_rows) if live_rows.size else None
    gone = found[~alive]
    receipts = read_receipts(session) if gone.size else []
    which = receipts_of_rows(session, gone)
    out: list[dict] = []
    live_at = {int(r): i for i, r in enumerate(live_rows)}
    gone_at = {int(r): i for i, r in enumerate(gone)}
    for i, row in zip(ids.tolist(), found.tolist()):
        if row in live_at:
            j = live_at[row]
            assert points is not None and groups is not None
            out.append({"id": i, "row": row, "forgotten": False, "group": names[int(groups[j])],
                        "features": points[j].astype(float).tolist()})  # fmt: skip
            continue
        w = int(which[gone_at[row]])
        receipt = (
            {k: receipts[w].get(k) for k in RECEIPT_FIELDS} if 0 <= w < len(receipts) else None
        )
        out.append({"id": i, "row": row, "forgotten": True,
                    "forgotten_at": receipt["applied_at"] if receipt else None,
                    "receipt": receipt})  # fmt: skip
    return {"store": store.url, "d": int(attrs["d"]), "feature_names": feature_names(attrs),
            "scale": scale_method(attrs), "rows": out}  # fmt: skip
