"""The deletion queue: one immutable object per request, beside the store's repository.

A producer files a request (ids to forget, a reason) as a new object ``queue/<request id>.json``
beside the store's repository: in its folder (written whole under a temporary name, flushed to
disk, then linked to its final name only if that name is absent), or under its prefix in an S3,
GCS or Azure bucket (one conditional put, ``If-None-Match: *``, through obstore). A reader never
sees half a request, many producers file at once without a lock, and no shared object is ever
read, modified and written.
Request ids sort by filing time (``20261124T120000123456Z-1a2b3c4d``).

The queue reads only what it wrote: a request's identity is its object's name. An object whose
name is not ``<request id>.json``, that is not a regular file, is larger than
``MAX_REQUEST_BYTES``, does not parse, or whose content disagrees with its name (another request
id, ids that are not integers in [0, 2^63), a reason that is not text...) is never applied: the
drain moves it to ``quarantine/`` beside the queue, with a note of why, and goes on; ``fairpipe
status`` and ``receipts`` report it.

A drain (:mod:`fairpipe.flows.forget`) applies pending requests in batches; each batch's commit records
the applied request ids in the store's receipts (:mod:`fairpipe.storage.receipts`), so a rerun after a
crash skips them, and the drain then deletes their objects. The ids in a request live only in
its object (deleted once applied) and in array values erasure rewrites: never in a commit
message, commit metadata, or a branch or tag name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.jsontext import JSONTextError, parse_json
from fairpipe.settings import MAX_REASON_CHARS, MAX_REQUEST_IDS, REASON
from fairpipe.storage.paths import own_folder
from fairpipe.storage.urls import object_store, parse_store_url

QUEUE_DIR = "queue"
QUARANTINE_DIR = "quarantine"
NO_QUEUE = (
    "A deletion queue is kept beside a store in a local folder or in an S3, GCS or Azure "
    "bucket; {url} is neither (its requests can only be applied at once: 'fairpipe forget --ids')."
)
# What a request object may hold. A request is filed by request-deletion, forget --ids or a
# backfill part (50,000 ids by default); a larger backlog is a backfill's many parts.
MAX_REQUEST_BYTES = 32 * 1024 * 1024  # 1M ids of 19 digits and a separator, and the reason
TOO_MANY_IDS = (
    "A deletion request holds at most {limit:,} ids; got {n:,}. File a larger backlog with "
    "'fairpipe backfill', which files it in parts."
)
UNLISTABLE = (
    "The deletion queue at {where} holds objects whose keys are not valid object paths ({keys}: "
    "a '.' or '..' segment, or an empty one), which stop every listing of it. Delete them with "
    "the bucket's own tools (for example 'aws s3 rm'), then drain again."
)
MALFORMED = "The request object {path} is not a fairpipe deletion request ({why})."
# A note of the drain's names an object, where it went, why and when: a few hundred bytes.
MAX_NOTE_BYTES = 64 * 1024
_NOTE_FIELDS = ("object", "moved_to", "why", "at")
REQUEST_ID = re.compile(r"[0-9]{8}T[0-9]{12}Z-[0-9a-z]{1,40}")
# A producer writes a request under a temporary name and links it to its own within
# milliseconds; a temporary file older than this was left by a producer killed before its
# request was filed (it holds ids, so the next drain deletes it).
ABANDONED_AFTER_SECONDS = 3600.0
_TEMPORARY = re.compile(r"\..+\.json\.[0-9a-f]{6}\.tmp")


class MalformedRequest(FairpipeInputError):
    """A queue object that is not a request this queue wrote (see the module's docstring)."""


class _Folder:
    """Request objects in ``<store folder>/queue``: written whole under a temporary name,
    flushed, then linked to their name (which fails if it exists), then the folder flushed."""

    def __init__(self, store_dir: Path):
        self.folder = store_dir / QUEUE_DIR
        self.quarantine = store_dir / QUARANTINE_DIR
        # Anything else under their names would make every listing find nothing and every
        # filing or drain fail (a file, a dangling link), or write requests where the link
        # leads, outside the store (a link to a folder).
        own_folder(self.folder, "the store's deletion requests")
        own_folder(self.quarantine, "the queue objects a drain sets aside")

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def create(self, name: str, body: bytes) -> None:
        made = not self.folder.exists()
        self.folder.mkdir(exist_ok=True)  # in the store's folder, which must exist
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, self.folder / name)  # raises FileExistsError if the name exists
        except BaseException:
            tmp.unlink(missing_ok=True)  # (it holds ids)
            if made:  # a request not filed leaves the store as it was (unless another came)
                with contextlib.suppress(OSError):
                    self.folder.rmdir()
            raise
        tmp.unlink()
        _sync_folder(self.folder)  # the new name itself is durable

    def names(self) -> list[str]:
        """Every entry of the queue but producers' temporary files."""
        if not self.folder.is_dir():
            return []
        return [n for n in os.listdir(self.folder) if not _TEMPORARY.fullmatch(n)]

    def read(self, name: str, limit: int) -> bytes:
        """The bytes of a regular file (never through a link), at most ``limit`` of them."""
        return _read_regular_file(self.folder / name, limit)

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)

    def set_aside(self, name: str, target: str, note: bytes) -> None:
        self.quarantine.mkdir(exist_ok=True)
        with open(self.quarantine / f"{target}.why.json", "wb") as f:
            f.write(note)
        os.rename(self.folder / name, self.quarantine / target)  # a folder or link is moved as is
        _sync_folder(self.quarantine)

    def notes(self) -> list[bytes]:
        """The notes' bytes; a note that is not a regular file of at most MAX_NOTE_BYTES is
        none of the drain's, and left out."""
        if not self.quarantine.is_dir():
            return []
        notes = []
        for path in sorted(self.quarantine.glob("*.why.json")):
            with contextlib.suppress(OSError, MalformedRequest):
                notes.append(_read_regular_file(path, MAX_NOTE_BYTES))
        return notes

    def abandoned(self, now: float) -> list[Path]:
        """Temporary request files older than ABANDONED_AFTER_SECONDS (their producer died
        before linking them: they were never filed)."""
        if not self.folder.is_dir():
            return []
        old = []
        for name in os.listdir(self.folder):
            if not _TEMPORARY.fullmatch(name):
                continue
            try:
                if now - (self.folder / name).lstat().st_mtime > ABANDONED_AFTER_SECONDS:
                    old.append(self.folder / name)
            except FileNotFoundError:  # linked and removed by its producer meanwhile
                continue
        return old


def _read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (never through a link, and a pipe is never waited
    on), at most ``limit`` of them; :class:`MalformedRequest` saying why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MalformedRequest("it is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MalformedRequest("it is not a regular file")
        if st.st_size > limit:
            raise MalformedRequest(f"it holds {st.st_size:,} bytes, over {limit:,}")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Bucket:
    """Request objects under ``<store prefix>/queue/`` in the store's bucket, created with a
    conditional put (``If-None-Match: *``): a name is written once, whole, or not at all."""

    def __init__(self, url: str, store):
        self.url, self.store = url.rstrip("/"), store  # the store: rooted at the store's prefix

    def where(self, name: str) -> str:
        return f"{self.url}/{QUEUE_DIR}/{name}"

    def create(self, name: str, body: bytes) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        try:
            obstore.put(self.store, f"{QUEUE_DIR}/{name}", body, mode="create")
        except AlreadyExistsError:
            raise FileExistsError(self.where(name)) from None

    def names(self) -> list[str]:
        """Every object under the queue's prefix. A key that is no valid object path (a '.' or
        '..' segment, an empty one: S3 accepts them, obstore cannot list, read or move them)
        stops a listing: then only the keys from ``queue/2`` on are listed (request ids start
        with the year), so such a key sorting before them ('.', '..', '/' do) stops no drain;
        the keys that stop listings are in :attr:`unlistable`, for the store's owner to delete."""
        from obstore.exceptions import InvalidPathError

        self.unlistable: list[str] = []
        for offset in (None, f"{QUEUE_DIR}/1"):
            try:
                return self._list(offset)
            except InvalidPathError as e:
                found = re.search(r'Error parsing Path "(.*?)"', str(e))
                self.unlistable.append(found.group(1) if found else str(e).splitlines()[0])
        raise FairpipeInputError(UNLISTABLE.format(where=self.where(""), keys=self.unlistable))

    def _list(self, offset: str | None) -> list[str]:
        import obstore

        at = len(QUEUE_DIR) + 1
        pages = obstore.list(self.store, prefix=f"{QUEUE_DIR}/", offset=offset)
        return [m["path"][at:] for batch in pages for m in batch]

    def read(self, name: str, limit: int) -> bytes:
        import obstore

        with _gone_as_file_not_found(self.where(name)):
            size = int(obstore.head(self.store, f"{QUEUE_DIR}/{name}")["size"])
            if size > limit:
                raise MalformedRequest(f"it holds {size:,} bytes, over {limit:,}")
            return bytes(obstore.get(self.store, f"{QUEUE_DIR}/{name}").bytes())

    def delete(self, name: str) -> None:
        import obstore

        obstore.delete(self.store, f"{QUEUE_DIR}/{name}")

    def set_aside(self, name: str, target: str, note: bytes) -> None:
        import obstore

        with _gone_as_file_not_found(self.where(name)):
            obstore.copy(self.store, f"{QUEUE_DIR}/{name}", f"{QUARANTINE_DIR}/{target}")
        obstore.put(self.store, f"{QUARANTINE_DIR}/{target}.why.json", note)
        obstore.delete(self.store, f"{QUEUE_DIR}/{name}")

    def notes(self) -> list[bytes]:
        import obstore

        paths = sorted(m["path"] for batch in obstore.list(self.store, prefix=f"{QUARANTINE_DIR}/")
                       for m in batch if m["path"].endswith(".why.json")
                       and int(m["size"]) <= MAX_NOTE_BYTES)  # fmt: skip
        return [bytes(obstore.get(self.store, p).bytes()) for p in paths]


@contextlib.contextmanager
def _gone_as_file_not_found(where: str):
    """obstore's NotFoundError as the FileNotFoundError a folder's queue raises."""
    from obstore.exceptions import NotFoundError

    try:
        yield
    except NotFoundError:
        raise FileNotFoundError(where) from None


def _backend(url: str) -> _Folder | _Bucket | None:
    spec = parse_store_url(url)
    if spec.local_dir is not None:
        return _Folder(spec.local_dir)
    store = object_store(spec)
    return None if store is None else _Bucket(url, store)


def has_queue(url: str) -> bool:
    """Whether requests can be filed beside the store at ``url``."""
    return parse_store_url(url).scheme in ("file", "s3", "gcs", "azure")


def check_queue(url: str) -> None:
    """Before a command files or drains requests: a FairpipeInputError naming the path where
    the store's queue or quarantine is something else than a folder."""
    if has_queue(url):
        _backend(url)


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


def check_request_size(n_ids: int, reason: str) -> None:
    """A request of ``n_ids`` ids for ``reason`` within what one request holds."""
    if n_ids > MAX_REQUEST_IDS:
        raise FairpipeInputError(TOO_MANY_IDS.format(limit=MAX_REQUEST_IDS, n=n_ids))
    REASON.check(reason, "a deletion request")


def new_request(ids: np.ndarray, reason: str = "", tag: str | None = None) -> Request:
    """A request filed now (not yet written anywhere); its id ends with ``tag`` (default: a
    random one), which lets a backfill find its own parts again."""
    ids = np.asarray(ids, dtype=np.int64)
    check_request_size(ids.size, reason)
    now = datetime.now(UTC)
    rid = f"{now.strftime(ID_TIME)}-{tag or uuid.uuid4().hex[:8]}"
    assert REQUEST_ID.fullmatch(rid), rid
    return Request(rid, ids, reason, now.isoformat())


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


def request_id_of(name: str) -> str | None:
    """The request id an object's name gives, or None if the name is not one this queue
    writes (``<request id>.json``)."""
    rid = name.removesuffix(".json")
    return rid if name.endswith(".json") and REQUEST_ID.fullmatch(rid) else None


def pending(url: str) -> list[str]:
    """Ids of the request objects in the queue, oldest first (applied ones not yet deleted
    included: the receipts tell them apart; objects of other names are not requests: see
    :func:`unrecognised`). A store without a queue has none."""
    return sorted(rid for name in _names(url) if (rid := request_id_of(name)) is not None)


def unrecognised(url: str) -> list[str]:
    """Names of queue objects that cannot be requests (the next drain sets them aside)."""
    return sorted(name for name in _names(url) if request_id_of(name) is None)


def _names(url: str) -> list[str]:
    """The names of the objects in the store's queue (none without a queue)."""
    backend = _backend(url)
    return [] if backend is None else list(backend.names())


def unlistable(url: str) -> list[str]:
    """Keys of a bucket's queue that obstore cannot list (see :meth:`_Bucket.names`)."""
    backend = _backend(url)
    if not isinstance(backend, _Bucket):
        return []
    backend.names()
    return list(backend.unlistable)


def parse_request(request_id: str, data: bytes) -> Request:
    """The request in the bytes of object ``<request_id>.json``; :class:`MalformedRequest`
    saying what is wrong unless it is exactly what :func:`file_request` writes for that id."""
    try:
        body = parse_json(data, max_bytes=MAX_REQUEST_BYTES)
    except JSONTextError as e:  # not UTF-8, not JSON, too large, or nested too deep
        raise MalformedRequest(str(e)) from None
    if not isinstance(body, dict):
        raise MalformedRequest(f"it holds a JSON {type(body).__name__}, not an object")
    if body.get("request") != request_id:
        raise MalformedRequest("its 'request' field is not its own name")
    ids, reason, at = body.get("ids"), body.get("reason", ""), body.get("requested_at")
    if not isinstance(ids, list) or not ids:
        raise MalformedRequest("its 'ids' field is not a list of ids")
    if len(ids) > MAX_REQUEST_IDS:
        raise MalformedRequest(f"it holds {len(ids):,} ids, over {MAX_REQUEST_IDS:,}")
    if not all(type(i) is int and 0 <= i < 2**63 for i in ids):
        raise MalformedRequest("an id in it is not an integer in [0, 2^63)")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise MalformedRequest(
            f"its 'reason' is not text of at most {MAX_REASON_CHARS:,} characters"
        )
    try:
        datetime.fromisoformat(at)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise MalformedRequest("its 'requested_at' is not an ISO 8601 time") from None
    return Request(request_id, np.asarray(ids, dtype=np.int64), reason, at)  # type: ignore[arg-type]


def read_request(url: str, request_id: str) -> Request:
    """The request ``request_id`` of the queue (:class:`MalformedRequest` if its object is not
    one; FileNotFoundError if it is gone)."""
    backend = _queue(url)
    name = f"{request_id}.json"
    try:
        if REQUEST_ID.fullmatch(request_id) is None:
            raise MalformedRequest("its name is not '<request id>.json'")
        return parse_request(request_id, backend.read(name, MAX_REQUEST_BYTES))
    except MalformedRequest as e:
        raise MalformedRequest(MALFORMED.format(path=backend.where(name), why=e)) from None


def set_aside(url: str, name: str, why: str) -> None:
    """Move the queue object ``name`` to the quarantine, with a note of why (its name, never
    its content). Quarantined objects are kept for the store's owner to look at; they may hold
    ids, like any request."""
    backend = _queue(url)
    now = datetime.now(UTC)
    target = f"{now.strftime(ID_TIME)}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    note = {"object": name, "moved_to": target, "why": why, "at": now.isoformat()}
    backend.set_aside(name, target, json.dumps(note).encode())


def quarantined(url: str) -> list[dict]:
    """The notes of the objects set aside (object, moved_to, why, at), oldest first."""
    backend = _backend(url)
    if backend is None:
        return []
    notes = []
    for data in backend.notes():
        try:
            note = parse_json(data, max_bytes=MAX_NOTE_BYTES)
        except JSONTextError:  # a note cut short by a crash: the object is still set aside
            continue
        if isinstance(note, dict) and all(isinstance(note.get(f), str) for f in _NOTE_FIELDS):
            notes.append(note)  # (anything else under a note's name is none of the drain's)
    return notes


def quarantine_path(url: str) -> str:
    """Where set-aside objects are kept."""
    backend = _queue(url)
    if isinstance(backend, _Folder):
        return str(backend.quarantine)
    return f"{backend.url}/{QUARANTINE_DIR}/"


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
