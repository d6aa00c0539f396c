"""The lineage log: one entry per operation on a store, kept in the store itself.

Each operation that changes what a store holds (ingest, append, fit, summarize, a drain's batch,
a backfill's batch, erasure from history, configure, adding checksums) appends an entry in the
commit that does it: the operation, when (UTC), its parameters, row counts and figures, and the
commit it was built on. A commit cannot hold its own id, so the entry holds a random operation
key that the commit's metadata holds too (``fairpipe_operation``); the next operation, or
``fairpipe history``, finds that commit and writes down its id. Erasure from history expires
snapshots (:mod:`fairpipe.storage.erasure`), never this log: it lives in the tip, as the receipts do.

The log is the UTF-8 JSON of the whole list in the uint8 array ``lineage/json`` (a few hundred
bytes an entry). It holds counts and settings, never an id, a row, a request's reason or anything
else that identifies a person: callers hand it counts (``record`` refuses anything but numbers,
text, booleans and None, in flat dicts), and a drain's entry says how many ids it erased, never
which.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from fairpipe.storage.arrays import open_group, read_json_array, write_json_array

LINEAGE = "lineage/json"
OPERATION_KEY = "fairpipe_operation"  # commit metadata: the operation key of the commit's entry
# Option fields that are not parameters of what the store holds (how long to wait for its lock).
NOT_PARAMETERS = ("lock_timeout", "new_store")
NOT_FLAT = "A lineage entry holds numbers, text, booleans and None; {name!r} is a {kind}."

# A snapshot's time and its entry's come from clocks that may differ a little (a writer's and
# an object store's): the walk for an entry's commit goes this much further back.
CLOCK_SLACK = timedelta(minutes=10)
_OPERATION: ContextVar[str | None] = ContextVar("fairpipe_lineage_operation", default=None)

__all__ = ["operation", "operation_name", "options_record", "read_lineage", "record",
           "resolve_commits"]  # fmt: skip


@contextlib.contextmanager
def operation(name: str) -> Iterator[None]:
    """Inside the block, entries recorded under a generic name are recorded as ``name`` (a
    backfill's batches are a drain's batches)."""
    token = _OPERATION.set(name)
    try:
        yield
    finally:
        _OPERATION.reset(token)


def operation_name(default: str) -> str:
    """The name of the operation in progress (:func:`operation`), else ``default``."""
    return _OPERATION.get() or default


def read_lineage(session) -> list[dict]:
    """The log's entries, oldest first ([] for a store without one)."""
    return read_json_array(session, LINEAGE)


def _write(root, entries: list[dict]) -> None:
    write_json_array(root, LINEAGE, entries)


def _flat(values: Mapping[str, Any] | None) -> dict:
    """``values`` with numpy scalars as Python's; anything but a scalar (a list that could hold
    ids, an array, a nested dict) is refused: the log holds no collection of values."""
    out: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if isinstance(value, np.generic):
            value = value.item()
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise TypeError(NOT_FLAT.format(name=name, kind=type(value).__name__))
        out[str(name)] = value
    return out


def options_record(options: Any, **overrides: Any) -> dict:
    """A flow's options (a dataclass or a dict) as lineage parameters: every field but the lock
    timeout and those left unset (None); a dict of settings (a generator's) flattened one level
    (``gaussian_n``); anything else that is not a scalar left out."""
    given = asdict(options) if is_dataclass(options) and not isinstance(options, type) else options
    fields: dict[str, Any] = {}
    for name, value in {**given, **overrides}.items():
        if isinstance(value, Mapping):  # a generator's settings: one level, flattened
            fields.update({f"{name}_{k}": v for k, v in value.items()})
        else:
            fields[name] = value
    return {
        k: v for k, v in fields.items()
        if k not in NOT_PARAMETERS and v is not None
        and isinstance(v.item() if isinstance(v, np.generic) else v, (bool, int, float, str))
    }  # fmt: skip


def record(txn, operation: str, parameters: Mapping[str, Any] | None = None,
           rows: Mapping[str, Any] | None = None,
           figures: Mapping[str, Any] | None = None) -> dict:  # fmt: skip
    """Append the entry of ``operation`` to the log, inside transaction ``txn`` (so in its commit,
    or nowhere if it fails); ``rows``: row counts; ``figures``: results (a loss, a utility).
    The previous entry's commit id is written down too, found from its operation key."""
    root = open_group(txn.session, mode="a")
    entries = read_lineage(txn.session)
    if entries and entries[-1].get("commit") is None:
        resolve_commits(txn.store, entries, txn.base_snapshot)
    key = uuid.uuid4().hex
    entry = {
        "operation": operation,
        "time": datetime.now(UTC).isoformat(),
        "parameters": _flat(parameters),
        "rows": _flat(rows),
        "figures": _flat(figures),
        "base": txn.base_snapshot,
        "commit": None,
        "key": key,
    }
    _write(root, entries + [entry])
    txn.metadata[OPERATION_KEY] = key
    return entry


def resolve_commits(store, entries: list[dict], tip: str | None = None) -> int:
    """Fill in the ``commit`` of the entries that lack it, from the snapshots of ``main`` (at
    ``tip``, default its tip) whose metadata holds their operation key: a walk back from the tip
    that stops at the oldest such entry's time. An entry whose commit has expired keeps None.
    Returns how many were filled in."""
    wanted = {e["key"]: e for e in entries if e.get("commit") is None and e.get("key")}
    if not wanted:
        return 0
    oldest = min(datetime.fromisoformat(e["time"]) for e in wanted.values())
    found = 0
    ancestry = store.repo.ancestry(snapshot_id=tip) if tip else store.repo.ancestry(branch="main")
    for snap in ancestry:
        key = (snap.metadata or {}).get(OPERATION_KEY)
        if key in wanted:
            wanted.pop(key)["commit"] = snap.id
            found += 1
            if not wanted:
                break
        if snap.written_at < oldest - CLOCK_SLACK:  # older than every entry still wanted: not there
            break
    return found


# The first word of a commit message -> its operation, for commits the log does not hold.
_MESSAGE_OPERATIONS = {"ingest": "ingest", "fit": "fit", "summarize": "summarize",
                       "forget": "drain", "set": "configure",
                       "add": "add-checksums"}  # fmt: skip


def operations(store) -> dict:
    """Every operation on ``store``, oldest first: the lineage log's entries (commits found
    where the snapshots still exist), preceded by the snapshots of ``main`` older than the log's
    first entry (a store written before it kept one: what their commit messages say, no
    parameters). ``complete`` says whether the log covers the store's whole life."""
    session = store.readonly_session()
    entries = read_lineage(session)
    resolve_commits(store, entries)
    started = datetime.fromisoformat(entries[0]["time"]) if entries else None
    older = []
    for snap in store.history():  # newest first
        if started is not None and datetime.fromisoformat(snap["time"]) >= started - CLOCK_SLACK:
            continue
        word = snap["message"].split(" ", 1)[0]
        if (
            snap["internal"]
            or word == "receipts"
            or snap["message"] in ("Repository initialized", "create fairpipe store")
        ):  # checkpoints, a drain's bookkeeping, the empty repository: no operation
            continue
        older.append({"operation": _MESSAGE_OPERATIONS.get(word, word), "time": snap["time"],
                      "message": snap["message"], "parameters": {}, "rows": {}, "figures": {},
                      "commit": snap["id"], "logged": False})  # fmt: skip
    logged = [{**{k: v for k, v in e.items() if k != "key"}, "logged": True} for e in entries]
    first_is_creation = bool(entries) and entries[0]["operation"] == "ingest"
    return {"operations": older[::-1] + logged, "complete": first_is_creation and not older}
