"""The deletion queue: one immutable object per request, beside the store's repository.

A producer files a request (ids to forget, a reason) as a new object ``queue/<request id>.json``
beside the store's repository: in its folder (written whole under a temporary name, flushed to
disk, then linked to its final name only if that name is absent), or under its prefix in an S3,
GCS or Azure bucket (one conditional put, ``If-None-Match: *``, through obstore). A reader never
sees half a request, many producers file at once without a lock, and no shared object is ever
read, modified and written.
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
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError
from storage.urls import parse_store_url, s3_endpoint

QUEUE_DIR = "queue"
NO_QUEUE = (
    "A deletion queue is kept beside a store in a local folder or in an S3, GCS or Azure "
    "bucket; {url} is neither (its requests can only be applied at once: 'fairpipe forget --ids')."
)
BAD_REQUEST = "The request object {path} is not a fairpipe deletion request ({why})."
# A producer writes a request under a temporary name and links it to its own within
# milliseconds; a temporary file older than this was left by a producer killed before its
# request was filed (it holds ids, so the next drain deletes it).
ABANDONED_AFTER_SECONDS = 3600.0


class _Folder:
    """Request objects in ``<store folder>/queue``: written whole under a temporary name,
    flushed, then linked to their name (which fails if it exists), then the folder flushed."""

    def __init__(self, folder: Path):
        self.folder = folder

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def create(self, name: str, body: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.folder / name)  # raises FileExistsError if the name exists
        finally:
            tmp.unlink()
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)  # the new name itself is durable
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return [p.name for p in self.folder.glob("*.json")]

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)

    def abandoned(self, now: float) -> list[Path]:
        """Temporary request files older than ABANDONED_AFTER_SECONDS (their producer died
        before linking them: they were never filed)."""
        if not self.folder.is_dir():
            return []
        old = []
        for p in self.folder.glob(".*.json.*.tmp"):
            try:
                if now - p.stat().st_mtime > ABANDONED_AFTER_SECONDS:
                    old.append(p)
            except FileNotFoundError:  # linked and removed by its producer meanwhile
                continue
        return old


class _Bucket:
    """Request objects under ``<store prefix>/queue/`` in the store's bucket, created with a
    conditional put (``If-None-Match: *``): a name is written once, whole, or not at all."""

    def __init__(self, url: str, store):
        self.url, self.store = url.rstrip("/"), store

    def where(self, name: str) -> str:
        return f"{self.url}/{QUEUE_DIR}/{name}"

    def create(self, name: str, body: bytes) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        try:
            obstore.put(self.store, name, body, mode="create")
        except AlreadyExistsError:
            raise FileExistsError(self.where(name)) from None

    def names(self) -> list[str]:
        import obstore

        return [m["path"] for batch in obstore.list(self.store) for m in batch
                if m["path"].endswith(".json")]  # fmt: skip

    def read(self, name: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store, name).bytes())

    def delete(self, name: str) -> None:
        import obstore

        obstore.delete(self.store, name)


def _backend(url: str) -> _Folder | _Bucket | None:
    spec = parse_store_url(url)
    if spec.local_dir is not None:
        return _Folder(spec.local_dir / QUEUE_DIR)
    if spec.scheme not in ("s3", "gcs", "azure"):
        return None
    from obstore.store import AzureStore, GCSStore, S3Store

    k = spec.kwargs
    prefix = "/".join(p for p in (k.get("prefix", ""), QUEUE_DIR) if p)
    if spec.scheme == "s3":
        endpoint = s3_endpoint()
        plain_http = bool(endpoint and endpoint.startswith("http://"))
        return _Bucket(url, S3Store(k["bucket"], prefix=prefix,
                                    client_options={"allow_http": plain_http}))  # fmt: skip
    if spec.scheme == "gcs":
        return _Bucket(url, GCSStore(k["bucket"], prefix=prefix))
    return _Bucket(url, AzureStore(k["container"], prefix=prefix, account_name=k["account"]))


def has_queue(url: str) -> bool:
    """Whether requests can be filed beside the store at ``url``."""
    return parse_store_url(url).scheme in ("file", "s3", "gcs", "azure")


def _queue(url: str) -> _Folder | _Bucket:
    backend = _backend(url)
    if backend is None:
        raise FairpipeInputError(NO_QUEUE.format(url=url))
    return backend


@dataclass(frozen=True)
class Request:
    request_id: str
    ids: np.ndarray
    reason: str
    requested_at: str  # ISO 8601, UTC


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
    request = new_request(ids, reason, tag)
    body = json.dumps({"request": request.request_id, "ids": request.ids.tolist(),
                       "reason": reason, "requested_at": request.requested_at})  # fmt: skip
    _queue(url).create(f"{request.request_id}.json", body.encode())
    return request


def pending(url: str) -> list[str]:
    """Ids of the request objects in the queue, oldest first (applied ones not yet deleted
    included: the receipts tell them apart). A store without a queue has none."""
    backend = _backend(url)
    if backend is None:
        return []
    return sorted(name.removesuffix(".json") for name in backend.names())


def read_request(url: str, request_id: str) -> Request:
    backend = _queue(url)
    name = f"{request_id}.json"
    try:
        body = json.loads(backend.read(name))
        ids = np.asarray(body["ids"], dtype=np.int64)
        return Request(str(body["request"]), ids, str(body.get("reason", "")),
                       str(body["requested_at"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FairpipeInputError(BAD_REQUEST.format(path=backend.where(name), why=e)) from None


def _abandoned_files(url: str) -> list[Path]:
    """Temporary request files of producers killed before filing (a local queue only: a bucket
    is written with one conditional put, which leaves nothing behind)."""
    backend = _backend(url)
    return backend.abandoned(time.time()) if isinstance(backend, _Folder) else []


def abandoned(url: str) -> int:
    """How many :func:`_abandoned_files` the queue holds."""
    return len(_abandoned_files(url))


def sweep_abandoned(url: str) -> int:
    """Delete the :func:`_abandoned_files` (they hold ids); returns how many were deleted."""
    old = _abandoned_files(url)
    for p in old:
        p.unlink(missing_ok=True)
    return len(old)


def delete_requests(url: str, request_ids) -> None:
    """Delete applied request objects (the last copy of their ids outside the arrays)."""
    if not request_ids:
        return
    backend = _queue(url)
    for rid in request_ids:
        backend.delete(f"{rid}.json")
