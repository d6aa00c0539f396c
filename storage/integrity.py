"""Checking a store against what was written: its chunks against their checksums, its snapshots
and manifests against what their commits recorded; and giving checksums to arrays without.

Every array a store creates ends its codec chain with a crc32c checksum of the encoded chunk
(:func:`fairpipe.storage.chunks.checksummed`): a stored chunk whose bytes change no longer matches it, and
reading it raises :class:`fairpipe.storage.damage.CorruptChunkError` (on the direct chunk path, and through
zarr where :func:`fairpipe.storage.arrays.zarr_checked` wraps the read). This module finds damaged chunks
without decoding them: :func:`verify_store` checks every chunk of every array of a snapshot
(``fairpipe verify``; :mod:`fairpipe.storage.chunk_checks` fetches and checks an array's chunks, and
finds the first damaged one a failed zarr read covered), and :func:`add_checksums` gives a checksum to the arrays of a store written before they had one.

:func:`verify_store` first checks every snapshot of the history, newest first, against what its
commit recorded (:func:`fairpipe.storage.snapshot_checks.verify_history`: the snapshot can be read, names
itself as its child names it, and its arrays' metadata and chunks as their manifests list them
are what its commit wrote), so a chunk a damaged manifest no longer lists is reported, not
skipped.

An array without a checksum cannot be verified: a damaged chunk of an uncompressed array still
decodes, to wrong numbers. :func:`verify_store` decodes such an array's chunks (a damaged
compressed chunk may fail to decompress, and a chunk of the wrong length never passes) and
reports the array as unverifiable; :func:`add_checksums` appends to each of its chunks the checksum of
the bytes it holds (the data are not re-encoded: every other byte stays as stored), after
decoding it, so the checksum never seals a chunk that is already unreadable.

Memory follows the chunk size: chunks are listed and fetched as a stream, at most
``READ_CONCURRENCY`` at once, and each is dropped once checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from icechunk import IcechunkError

from fairpipe.storage.arrays import open_group
from fairpipe.storage.chunk_checks import _Checker, _each_chunk, has_checksum
from fairpipe.storage.chunks import (
    _metadata_read,
    crc32c_of,
    on_zarr_loop,
    zarr_api,
)
from fairpipe.storage.damage import icechunk_reason
from fairpipe.storage.store import FairpipeStore

# The most damaged chunks a report lists (it counts them all).
LISTED_CORRUPT = 1000
UNREADABLE = "Icechunk cannot read its object ({error})"
NO_CHUNK_LIST = "Icechunk cannot read the array's list of chunks, its manifest ({error})"
CANNOT_ADD = (
    "Array '{array}' of {url} has codecs {codecs}: a checksum cannot be added to it here. "
    "Ingest the store's source again to get a store whose every array has one."
)


def store_arrays(session, checked: bool = True) -> list[tuple[str, Any]]:
    """(path, zarr array) of every array of a session's store, by path (``checked``: its
    groups' metadata checked first, :func:`fairpipe.storage.arrays.open_group`)."""
    with _metadata_read("a node"):
        root = open_group(session) if checked else zarr_api().open_group(session.store, mode="r")
        found = [(name, node) for name, node in root.members(max_depth=None)
                 if not hasattr(node, "members")]  # fmt: skip
    return sorted(found, key=lambda pair: pair[0])


def verify_store(store: FairpipeStore, snapshot: str | None = None,
                 progress: Callable[[str, int, int, int], None] | None = None) -> dict:  # fmt: skip
    """Check every snapshot from ``snapshot`` (default: the tip of ``main``) back against what
    its commit recorded, then every stored chunk of every array of ``snapshot``.

    Returns ``{"store", "snapshot", "snapshots", "unrecorded", "damaged": [{"snapshot",
    "array", "what", "why"}, ...], "arrays", "chunks", "bytes", "corrupt": [{"array", "chunk",
    "why"}, ...] (at most LISTED_CORRUPT), "n_corrupt", "unverifiable": [{"array", "chunks",
    "decoded"}, ...]}``: ``damaged`` lists the snapshots, manifests and metadata that are not
    what their commits wrote (:func:`fairpipe.storage.snapshot_checks.verify_history`; ``unrecorded`` counts
    the snapshots written before commits recorded it, whose manifests are only counted against
    Icechunk's own count). Arrays with a checksum are checked against it; arrays without are
    decoded and listed as unverifiable. A chunk whose object Icechunk cannot read is corrupt
    too, and so is an array whose list of chunks it cannot read (``chunk`` None).
    ``progress(array, arrays done, arrays, chunks checked)`` is called as each array starts and
    every 64 chunks."""

    from fairpipe.storage.snapshot_checks import verify_history

    with store.named():
        tip = snapshot if snapshot is not None else store.repo.lookup_branch("main")
        history = verify_history(store, tip)
        # (unchecked: what is damaged in it is listed above, and its chunks are still read)
        session = store.repo.readonly_session(snapshot_id=tip)
    try:
        arrays = store_arrays(session, checked=False)
    except Exception:
        if not any(d["snapshot"] == tip for d in history["damaged"]):
            raise
        arrays = []  # its metadata, which zarr cannot read: listed above
    report: dict[str, Any] = {"store": store.url, "snapshot": tip, **history,
                              "arrays": len(arrays), "chunks": 0, "bytes": 0, "corrupt": [],
                              "n_corrupt": 0, "unverifiable": []}  # fmt: skip

    def found(path: str, chunk: list[int] | None, why: str) -> None:
        report["n_corrupt"] += 1
        if len(report["corrupt"]) < LISTED_CORRUPT:
            report["corrupt"].append({"array": path, "chunk": chunk, "why": why})

    for done, (path, arr) in enumerate(arrays):
        if progress is not None:
            progress(path, done, len(arrays), report["chunks"])
        checker = _Checker(arr)
        before = report["chunks"]

        async def handle(coords, key, data, checker=checker, path=path, done=done) -> bool:
            report["chunks"] += 1
            report["bytes"] += int(data.size)
            bad = checker.check(coords, data) if checker.able else None
            if bad is not None:
                found(path, list(coords), bad.why)
            if progress is not None and report["chunks"] % 64 == 0:
                progress(path, done, len(arrays), report["chunks"])
            return False

        def unreadable(coords, error, path=path) -> None:
            report["chunks"] += 1
            found(path, list(coords), UNREADABLE.format(error=icechunk_reason(error)))

        try:
            on_zarr_loop(_each_chunk(arr, lambda coords: True, handle, unreadable))
        except IcechunkError as e:  # the array's list of chunks (its manifest) is unreadable
            found(path, None, NO_CHUNK_LIST.format(error=icechunk_reason(e)))
        if not checker.checksum:
            report["unverifiable"].append({"array": path, "chunks": report["chunks"] - before,
                                           "decoded": checker.able})  # fmt: skip
    report["corrupt"].sort(key=lambda c: (c["array"], c["chunk"] or []))
    if progress is not None:
        progress("", len(arrays), len(arrays), report["chunks"])
    return report


def add_checksums(store: FairpipeStore, lock_timeout: float = 0.0) -> dict:
    """Give every array of ``main``'s tip that has no checksum one, in one commit: each stored
    chunk becomes its bytes followed by their crc32c (what zarr's Crc32cCodec appends to the
    encoded chunk), the array's codecs gain the checksum last, and nothing else changes (the
    data are not re-encoded). Each chunk is decoded first: a chunk that does not decode stops
    it with a :class:`CorruptChunkError` before anything is published. Returns ``{"arrays":
    [paths], "chunks": n, "commit": id}``."""
    import dataclasses

    from zarr.buffer import default_buffer_prototype
    from zarr.codecs import Crc32cCodec

    from fairpipe.errors import FairpipeInputError

    base = store.readonly_session()
    todo = [path for path, arr in store_arrays(base) if not has_checksum(arr)]
    for path, arr in store_arrays(base):  # before the lock: an array it cannot change
        if path in todo and _Checker(arr).plain is None:
            codecs = [c.to_dict()["name"] for c in arr.metadata.codecs]
            raise FairpipeInputError(CANNOT_ADD.format(array=path, url=store.url, codecs=codecs))
    if not todo:
        return {"arrays": [], "chunks": 0, "commit": base.snapshot_id}
    proto = default_buffer_prototype()
    chunks = 0
    with store.transaction("add chunk checksums", lock_timeout=lock_timeout) as txn:
        arrays = dict(store_arrays(store.readonly_session(txn.base_snapshot)))
        target = txn.session.store
        for path in todo:
            arr, checker = arrays[path], _Checker(arrays[path])
            meta = dataclasses.replace(arr.metadata, codecs=(*arr.metadata.codecs, Crc32cCodec()))
            for key, value in meta.to_buffer_dict(proto).items():
                on_zarr_loop(target.set(f"{path}/{key}", value))

            async def handle(coords, key, data, checker=checker) -> bool:
                nonlocal chunks
                bad = checker.check(coords, data)
                if bad is not None:
                    raise bad.with_store(store.url)
                sealed = b"".join((data, crc32c_of(data).to_bytes(4, "little")))
                await target.set(key, proto.buffer.from_bytes(sealed))
                chunks += 1
                return False

            on_zarr_loop(_each_chunk(arr, lambda coords: True, handle))
        from fairpipe.storage.lineage import record

        record(txn, "add-checksums", figures={"arrays": len(todo), "chunks": chunks})
    return {"arrays": todo, "chunks": chunks, "commit": txn.commit_id}
