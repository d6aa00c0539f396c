"""Erasure from history on a retention clock.

A forget commit erases rows from ``main``, but earlier snapshots still hold them. The store
setting ``erasure_retention`` (root attribute; a duration such as ``0``, ``90m``, ``24h``, ``7d``;
default ``0``) says how long they may: at the end of each drain, the snapshots written before
``now - retention`` are expired and the objects only they used garbage-collected
(:meth:`fairpipe.storage.store.FairpipeStore.purge_history`), and the receipts of the requests whose rows
thereby left every snapshot get their ``erased_at``. With the default, a drain ends with the rows
it erased in no snapshot and no stored object; a longer retention keeps a recovery window (time
travel to before a forget) and the first drain after it ends erases them.

The cost: time travel to any snapshot before the cutoff is lost.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.number_text import flaw, read_duration
from fairpipe.storage.arrays import read_rows_at
from fairpipe.storage.lineage import record
from fairpipe.storage.receipts import read_receipts, write_receipts
from fairpipe.storage.store import FairpipeStore

RETENTION_KEY = "erasure_retention"
DEFAULT_RETENTION = "0"
BAD_RETENTION = (
    "erasure_retention must be a duration >= 0 such as 0, 3600s, 90m, 24h or 7d, in ASCII "
    "without spaces; got {value!r}, which {why}."
)
# Snapshots older than the retention are found by subtracting it from now: a century keeps
# every date computable.
MAX_RETENTION = timedelta(days=36500)
LONG_RETENTION = "erasure_retention must be at most 36500d (100 years); got {value!r}."


def parse_retention(value) -> timedelta:
    """``'24h'`` -> 24 hours; a negative, unparsable or non-finite value is an error, and so is
    one not written by the rule of numbers (:func:`fairpipe.number_text.read_duration`: ASCII
    digits, no spaces)."""
    seconds = read_duration(str(value))
    if seconds is None:
        raise FairpipeInputError(BAD_RETENTION.format(value=value, why=flaw(str(value))))
    if seconds > MAX_RETENTION.total_seconds():  # (a float: inf for a number too large)
        raise FairpipeInputError(LONG_RETENTION.format(value=value))
    return timedelta(seconds=seconds)


def retention_of(attrs: dict) -> str:
    return str(attrs.get(RETENTION_KEY, DEFAULT_RETENTION))


def set_retention(store: FairpipeStore, value: str, lock_timeout: float = 0.0) -> dict:
    """Set the store's ``erasure_retention`` (one commit)."""
    parse_retention(value)
    text = str(value).strip().lower()
    before = retention_of(store.require_data())
    with store.transaction(f"set erasure_retention to {text}", lock_timeout=lock_timeout) as txn:
        from fairpipe.storage.arrays import open_group

        open_group(txn.session, mode="a").attrs[RETENTION_KEY] = text
        record(txn, "configure", {"erasure_retention": text, "before": before})
    return {"store": store.url, "erasure_retention": text, "before": before,
            "commit": txn.commit_id}  # fmt: skip


def erase_due(
    store: FairpipeStore, lock_timeout: float = 0.0, now_all: bool = False
) -> dict | None:
    """Expire and garbage-collect what the retention no longer keeps, if an applied request's
    rows are still in history and due (``now_all``: everything before ``main``'s tip, whatever
    the retention); then record ``erased_at`` in those receipts. None when nothing was due."""
    now = datetime.now(UTC)
    retention = timedelta(0) if now_all else parse_retention(retention_of(store.attrs()))
    cutoff = now - retention
    due = [
        r for r in read_receipts(store.readonly_session())
        if r["erased_at"] is None and r["applied_at"] is not None
        and datetime.fromisoformat(r["applied_at"]) <= cutoff
    ]  # fmt: skip
    if not due and not now_all:
        return None
    # Expire what is older than the newest due forget commit (that commit and later ones hold
    # the rows erased, and stay in history), or everything before the tip.
    newest = max((datetime.fromisoformat(r["applied_at"]) for r in due), default=None)
    purged = store.purge_history(lock_timeout=lock_timeout,
                                 older_than=None if now_all else newest)  # fmt: skip
    erased_before = datetime.fromisoformat(purged["cutoff"])
    stamp = datetime.now(UTC).isoformat()
    with store.transaction("receipts: erased from history", lock_timeout=lock_timeout) as txn:
        receipts = read_receipts(txn.session)
        marked = 0
        for r in receipts:
            if (r["erased_at"] is None and r["applied_at"] is not None
                    and datetime.fromisoformat(r["applied_at"]) <= erased_before):  # fmt: skip
                r["erased_at"] = stamp
                marked += 1
        if marked:
            write_receipts(txn.root, receipts)
        record(txn, "erase-history", {"erasure_retention": retention_of(store.attrs(txn.session)),
                                      "everything_before_tip": now_all},
               figures={k: purged[k] for k in ("snapshots_before", "snapshots_after",
                                               "chunks_deleted", "bytes_deleted")},
               rows={"requests_erased": marked})  # fmt: skip
    return {**purged, "receipts_erased": marked, "erased_at": stamp}


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _views(raw: bytes) -> list[bytes]:
    """``raw`` as stored, and decompressed where it holds a zstd frame (Zarr chunks, where the
    frame is followed by the chunk's 4-byte checksum; Icechunk's metadata files after a short
    header)."""
    from numcodecs import Zstd

    views = [raw]
    start = raw.find(ZSTD_MAGIC)
    if start >= 0:
        for frame in (raw[start:], raw[start:-4]):
            try:
                views.append(bytes(Zstd().decode(frame)))
                break
            except Exception:  # not a whole frame: the raw bytes are still scanned
                pass
    return views


def holds(raw: bytes, needles: list[bytes]) -> bool:
    """Whether the object ``raw``, as stored or decompressed, holds one of ``needles``."""
    views = _views(raw)
    return any(needle in v for needle in needles for v in views)


def row_needles(url: str, rows) -> list[bytes]:
    """The stored bytes of ``rows``' data as the store's tip holds them: each row's point, and
    its sketch rows when the store keeps them (:func:`files_holding`'s needles for those rows).

    A residual row whose codes are all 0 is left out: its point is its sketch's reconstruction
    to within 1/512 of a step, and its bytes are then (nearly always) the same as every such
    row's of the same range (pixels, counts, 0/1 data: one residual row for all), so finding
    them elsewhere would prove nothing; the row's point and sketch needles stay."""
    from fairpipe.storage.rows import (
        sketch_arrays,  # not at the top: status and configure import this
    )

    store = FairpipeStore.open(url)
    session = store.readonly_session()
    rows = np.asarray(rows, dtype=np.int64)
    attrs = store.attrs(session)
    needles = [x.astype("<f4").tobytes() for x in read_rows_at(session, "points", rows)]
    for name in sketch_arrays(attrs):
        values = read_rows_at(session, name, rows)
        if name == "sketch_residual":
            values = values[values[:, : int(attrs["d"])].any(axis=1)]
        needles += [x.tobytes() for x in values]
    return needles


def files_holding(folder, needles: list[bytes]) -> list[tuple[str, int]]:
    """``(file, needle)`` for each file under ``folder`` (a local store) whose bytes, as stored
    or decompressed, hold one of ``needles``: the proof that erased rows are in no stored byte
    is an empty list."""
    from pathlib import Path

    found = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        views = _views(path.read_bytes())
        found += [(str(path.relative_to(folder)), k) for k, needle in enumerate(needles)
                  if any(needle in v for v in views)]  # fmt: skip
    return found
