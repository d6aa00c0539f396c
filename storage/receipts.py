"""Receipts of deletion requests, kept in the store's arrays.

One receipt per applied request: its request id, the number of ids it named, the ids the store
never had, its reason, when it was filed and applied, the commit that applied it, and when the
erased rows left history (``erased_at``: None while an earlier snapshot still holds them).
Receipts hold ids and times, never the erased data. They are written in the commit that applies
their request (that is what makes a rerun after a crash skip it), as the UTF-8 JSON of the whole
list in the uint8 array ``receipts/json``.
"""

from __future__ import annotations

import json

import numpy as np

from storage.store import create_array, open_group, read_array

RECEIPTS = "receipts/json"
REQUESTS_KEY = "fairpipe_requests"  # commit metadata: the request ids a commit applied


def read_receipts(session) -> list[dict]:
    group = open_group(session)
    if "receipts" not in group or "json" not in group["receipts"]:
        return []
    return json.loads(read_array(session, RECEIPTS).tobytes().decode())


def write_receipts(root, receipts: list[dict]) -> None:
    data = np.frombuffer(json.dumps(receipts).encode(), dtype=np.uint8)
    if "receipts" in root and "json" in root["receipts"]:
        del root[RECEIPTS]
    create_array(root, RECEIPTS, shape=data.shape, dtype="uint8")[...] = data
