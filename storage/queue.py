"""The deletion queue: one immutable object per request, beside the store's repository.

A producer files a request (ids to forget, a reason) as a new object ``queue/<request id>.json``
in the store's folder. The object is written whole under a temporary name, flushed to disk, then
linked to its final name only if that name is absent: a reader never sees half a request, many
producers file at once without a lock, and no shared file is ever read, modified and written.
Request ids sort by filing time (``20261124T120000123456Z-1a2b3c4d``).

A drain (:mod:`flows.forget`) applies pending requests in batches; each batch's commit records
the applied request ids in the store's receipts (:mod:`storage.receipts`), so a rerun after a
crash skips them, and the drain then deletes their objects. The ids in a request live only in
its object (deleted once applied) and in array values erasure rewrites: never in a commit
message, commit metadata, or a branch or tag name.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError
from storage.urls import parse_store_url

QUEUE_DIR = "queue"
OBJECT_STORE_QUEUE = (
    "Deletion requests are kept beside a store in a local folder; {url} is an object store "
    "URL, which the queue does not support yet."
)
BAD_REQUEST = "The request object {path} is not a fairpipe deletion request ({why})."


@dataclass(frozen=True)
class Request:
    request_id: str
    ids: np.ndarray
    reason: str
    requested_at: str  # ISO 8601, UTC


def queue_folder(url: str) -> Path:
    """The queue folder of the store at ``url`` (local stores only)."""
    local = parse_store_url(url).local_dir
    if local is None:
        raise FairpipeInputError(OBJECT_STORE_QUEUE.format(url=url))
    return local / QUEUE_DIR


ID_TIME = "%Y%m%dT%H%M%S%fZ"  # a request id starts with its filing time, UTC


def new_request(ids: np.ndarray, reason: str = "", tag: str | None = None) -> Request:
    """A request filed now (not yet written anywhere); its id ends with ``tag`` (default: a
    random one), which lets a backfill find its own parts again."""
    now = datetime.now(UTC)
    rid = f"{now.strftime(ID_TIME)}-{tag or uuid.uuid4().hex[:8]}"
    return Request(rid, np.asarray(ids, dtype=np.int64), reason, now.isoformat())


def filed_at(request_id: str) -> datetime:
    """When the request ``request_id`` was filed."""
    return datetime.strptime(request_id.split("-")[0], ID_TIME).replace(tzinfo=UTC)


def file_request(url: str, ids: np.ndarray, reason: str = "", tag: str | None = None) -> Request:
    """Write a new request object; durable when this returns."""
    folder = queue_folder(url)
    folder.mkdir(parents=True, exist_ok=True)
    request = new_request(ids, reason, tag)
    body = json.dumps({"request": request.request_id, "ids": request.ids.tolist(),
                       "reason": reason, "requested_at": request.requested_at})  # fmt: skip
    tmp = folder / f".{request.request_id}.tmp"
    with open(tmp, "w") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, folder / f"{request.request_id}.json")  # fails if the name exists
    finally:
        tmp.unlink()
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)  # the new name itself is durable
    finally:
        os.close(fd)
    return request


def pending(url: str) -> list[str]:
    """Ids of the request objects in the queue, oldest first (applied ones not yet deleted
    included: the receipts tell them apart)."""
    local = parse_store_url(url).local_dir
    if local is None:
        return []
    folder = local / QUEUE_DIR
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json"))


def read_request(url: str, request_id: str) -> Request:
    path = queue_folder(url) / f"{request_id}.json"
    try:
        body = json.loads(path.read_text())
        ids = np.asarray(body["ids"], dtype=np.int64)
        return Request(str(body["request"]), ids, str(body.get("reason", "")),
                       str(body["requested_at"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FairpipeInputError(BAD_REQUEST.format(path=path, why=e)) from None


def delete_requests(url: str, request_ids) -> None:
    """Delete applied request objects (the last copy of their ids outside the arrays)."""
    if not request_ids:
        return
    folder = queue_folder(url)
    for rid in request_ids:
        (folder / f"{rid}.json").unlink(missing_ok=True)
