"""What ``fairpipe status`` reports: a store's rows, its deletion queue, its last commit and
whether each artifact is present and current."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from fairpipe.storage.erasure import retention_of
from fairpipe.storage.queue import (
    abandoned,
    filed_at,
    pending,
    quarantine_path,
    quarantined,
    unlistable,
    unrecognised,
)
from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.rows import read_alive, read_ids
from fairpipe.storage.store import FairpipeStore
from fairpipe.storage.summary import has_summary, read_summary_ids


def store_status(url: str) -> dict:
    st = FairpipeStore.open(url)
    attrs = st.require_data()
    session = st.readonly_session()
    receipts = read_receipts(session)
    applied = {r["request"] for r in receipts}
    waiting = [rid for rid in pending(url) if rid not in applied]
    oldest = None
    if waiting:
        oldest = (datetime.now(UTC) - filed_at(waiting[0])).total_seconds()
    last = next(h for h in st.history() if not h["internal"])
    n_alive = int(attrs["n_alive"])
    artifacts = {"rows": {"exists": True, "current": True},
                 "lsh_index": {"exists": True, "current": True}}  # fmt: skip
    kind = attrs.get("model")
    if kind is not None:
        from fairpipe.cluster import DCKMeans
        from fairpipe.storage.models import read_model

        model = read_model(session, kind)
        # Current: the model holds exactly the live rows (its masses or sizes add up to n_alive).
        mass = model.masses_ if isinstance(model, DCKMeans) else model.sizes_[-1]
        held = int(np.asarray(mass).sum())
        artifacts[f"model ({kind})"] = {"exists": True, "current": held == n_alive}
    else:
        artifacts["model"] = {"exists": False, "current": False}
    if has_summary(session):
        ids = read_summary_ids(session)
        alive_ids = read_ids(session)[read_alive(session)]
        # Current: every summary element is a live row.
        artifacts["summary"] = {"exists": True, "current": bool(np.isin(ids, alive_ids).all())}
    else:
        artifacts["summary"] = {"exists": False, "current": False}
    return {
        "store": st.url,
        "n": int(attrs["n"]),
        "n_alive": n_alive,
        "pending_requests": {
            "count": len(waiting),
            "oldest": waiting[0] if waiting else None,
            "oldest_age_seconds": oldest,
            "abandoned": abandoned(url),  # files of producers killed before filing
            "unrecognised": len(unrecognised(url)),  # the next drain sets them aside
        },  # fmt: skip
        "set_aside": set_aside_of(url),
        "last_commit": {k: last[k] for k in ("id", "time", "message")},
        "artifacts": artifacts,
        "erasure_retention": retention_of(attrs),
        "not_yet_erased": sum(1 for r in receipts if r["erased_at"] is None),
        "layout": layout_of(attrs),
    }


def set_aside_of(url: str) -> dict:
    """The queue objects a drain set aside as not being requests: never applied, kept for the
    store's owner to look at (and delete)."""
    from fairpipe.storage.queue import has_queue

    if not has_queue(url):
        return {"count": 0, "where": None, "objects": [], "unlistable": []}
    notes = quarantined(url)
    return {"count": len(notes), "where": quarantine_path(url), "objects": notes,
            "unlistable": unlistable(url)}  # fmt: skip


def layout_of(attrs: dict) -> dict:
    """What the store's layout has of what later versions write: the key definition (stores
    before the exact one keep float32 keys), the point sketch and its residual (a cold query
    reads more without them); ``current`` when it has all, else re-ingesting into a new store
    gives them."""
    from fairpipe.storage.formats import store_format
    from fairpipe.storage.layers import key_projection
    from fairpipe.storage.rows import has_residual, has_sketch

    out = {"format": store_format(attrs),
           "keys": key_projection(attrs),
           "sketch": has_sketch(attrs), "sketch_residual": has_residual(attrs)}  # fmt: skip
    out["current"] = out["keys"] == "exact" and out["sketch"] and out["sketch_residual"]
    return out
