"""A damaged store: the errors that say so, and telling Icechunk's reports of damage from the rest.

A store is damaged when what it holds is not what was written: a chunk whose bytes fail their
checksum (:class:`CorruptChunkError`), a snapshot, manifest, transaction log or ref
Icechunk cannot decode, an object the store's metadata names that is missing, or a manifest
that decodes but no longer lists the chunks its commit wrote (:mod:`fairpipe.storage.manifests`). Every
one is a :class:`DamagedStoreError`: never bad input, never a bug; the command line exits 4.

Icechunk reports a file it cannot read as an ``IcechunkError`` whose context names the fetch
(``icechunk::asset_manager::fetch_snapshot``, ``fetch_manifest``, ``fetch_transaction_log``,
``fetch_chunk``; ``refs::fetch_branch`` for a ref) and whose causes say why: the zstd frame or
the flatbuffer does not decode (``I/O error`` then ``Data corruption detected``, ``incomplete
frame``; ``Invalid Icechunk metadata file``, ``... is out of bounds``), the header is not
Icechunk's (``invalid magic numbers``), the object is shorter than the snapshot says or gone
(``Requested range was invalid``, ``not found``). :func:`icechunk_damage` reads that text, in
one place; anything else Icechunk reports (a refused connection or credential, a missing
bucket, a full or read-only disk) is not damage and keeps its own exit code.
tests/storage/test_manifests.py fails with a clear message if a release of Icechunk words these
reports differently.
"""

from __future__ import annotations

import re

from fairpipe.errors import wrapped

# What to do about any damage: one line, like a damaged chunk's (CORRUPT_CHUNK).
DAMAGED = (
    "{what}{where} is damaged: {why}. 'fairpipe verify --store {store}' lists the damage; "
    "restore the store from a copy or ingest its source again."
)
UNREADABLE = "Icechunk cannot read it ({reason})"
MISSING_OBJECT = "Icechunk cannot read its object ({reason})"
# Icechunk reads a file's format version from its header: a flipped byte there reads as a newer
# format, which a newer Icechunk would also write.
NEWER_FORMAT = (
    "its header names a newer format than this Icechunk reads (if a newer Icechunk wrote the "
    "store, upgrade icechunk to read it)"
)


class DamagedStoreError(Exception):
    """What a store holds is not what was written (exit 4). Subclasses name what is damaged;
    :meth:`with_store` names the store where the layer that raised it did not know it."""

    store: str | None = None

    def with_store(self, store: str | None) -> DamagedStoreError:
        raise NotImplementedError


class DamagedPartError(DamagedStoreError):
    """A part of the store that is not what was written: ``what`` names it as a message starts
    (``The manifest of array 'points'``, ``Snapshot 1CEC...``, ``Segment (2, 0) of array
    'lsh/segments'``), ``why`` says what is wrong with it."""

    def __init__(self, what: str, why: str, store: str | None = None):
        self.what, self.why, self.store = what, why, store
        super().__init__(what, why, store)

    def __str__(self) -> str:
        where = f" in the store {self.store}" if self.store else ""
        return DAMAGED.format(what=self.what, where=where, why=self.why,
                              store=self.store or "STORE")  # fmt: skip

    def with_store(self, store: str | None) -> DamagedPartError:
        if self.store or not store:
            return self
        return type(self)(self.what, self.why, store)


class DamagedMetadataError(DamagedPartError):
    """A snapshot, manifest, transaction log or ref of the store that Icechunk cannot read, or
    that disagrees with what its commit recorded."""


def icechunk_reason(error: BaseException) -> str:
    """The innermost cause in an Icechunk error's report (``Data corruption detected``)."""
    lines = [line.strip(" |`-") for line in str(error).splitlines() if "-> " in line]
    lines = [line.removeprefix("> ").strip() for line in lines if line]
    return lines[-1] if lines else (str(error).strip().splitlines() or [type(error).__name__])[0]


# The fetch an Icechunk error's context names, by what it read.
_FETCH = re.compile(r"icechunk::(?:asset_manager::|storage::\w+::)?"
                    r"(fetch_snapshot|snapshot_ancestry|fetch_manifest|fetch_transaction_log|"
                    r"fetch_chunk)\b")  # fmt: skip
_REF = re.compile(r"icechunk::refs::fetch_(?:branch|tag)")
# Causes that mean the object's bytes are not what Icechunk wrote (or it is gone).
_UNDECODABLE = re.compile(
    r"I/O error|Data corruption detected|incomplete frame|early eof|Unknown frame descriptor|"
    r"Corrupted block|Dictionary mismatch|Invalid Icechunk metadata file|invalid magic numbers|"
    r"cannot read this file type|cannot read file|is out of bounds|points out of bounds|"
    r"is unaligned|Missing required field|invalid utf-8|Utf8 error|Requested range was invalid|"
    r"object was only \d+ bytes long|manifest information cannot be found in snapshot"
)
_GONE = re.compile(r"\bnot found\b|NoSuchKey|No such file or directory \(os error 2\)")
_REF_UNDECODABLE = re.compile(r"cannot (?:de)?serialize ref json")
# Causes that are the environment's, whatever was being read: never damage (read in the report's
# first line and its causes, not its context, which may print settings: a stream timeout).
_ENVIRONMENT = re.compile(
    r"\(os error (?:1|13|28|30|122)\)|permission denied|connection|timed out|timeout|"
    r"dns error|credential|forbidden|access ?denied|unauthori[sz]ed|InvalidAccessKeyId|"
    r"SignatureDoesNotMatch|NoSuchBucket|certificate|\btls\b|throttl|SlowDown|"
    r"\bstatus(?: code)?:? (?:40[13]|429|5\d\d)\b",
    re.IGNORECASE,
)
_SNAPSHOT_ID = re.compile(r"snapshot_id=([0-9A-Z]{20})|SnapshotId\(([0-9A-Z]{20})\)")
_MANIFEST_ID = re.compile(r"manifest_id=([0-9A-Z]{20})")
_TRANSACTION_ID = re.compile(r"transaction_id=([0-9A-Z]{20})")
_ARRAY_PATH = re.compile(r'inner: "/([^"]*)"|prefix="([^"]*?)/?"')
_KEY = re.compile(r'key="([^"]+)"')
_CHUNK_KEY = re.compile(r"^(.+)/c((?:/\d+)*)$")
_BRANCH = re.compile(r'branch(?:_name)?="?([\w.-]+)')


def icechunk_damage(error: BaseException) -> DamagedStoreError | None:
    """The damage an ``IcechunkError`` reports, as a :class:`DamagedStoreError` naming the
    snapshot, the manifest's array, the chunk or the ref; None for any other error (one that is
    not Icechunk's, or an environment's: a connection, a credential, a bucket, a disk)."""
    if is_panic(error):
        # Icechunk panics, rather than fails, on some undecodable snapshots; only a panic that
        # says so (a call that is not async keeps its message) is damage.
        if "flatbuffers" not in str(error):
            return None
        why = UNREADABLE.format(reason=f"it panicked: {str(error).strip().splitlines()[0]}")
        return DamagedMetadataError("A snapshot", why)
    if type(error).__name__ != "IcechunkError":  # (the light path's compiled module has its own)
        return None
    text = str(error)
    lines = text.strip().splitlines()
    if _ENVIRONMENT.search("\n".join(lines[:1] + [line for line in lines if "-> " in line])):
        return None
    reason = icechunk_reason(error)
    if "written with a more modern version" in text:  # a header's format version byte
        return DamagedMetadataError(_snapshot_named(text), NEWER_FORMAT)
    fetch = _FETCH.search(text)
    if fetch is None:
        if _REF.search(text) and _REF_UNDECODABLE.search(text):
            found = _BRANCH.search(text)
            name = found.group(1) if found else "main"
            return DamagedMetadataError(
                f"The ref of branch '{name}'", UNREADABLE.format(reason=reason)
            )
        if "manifest information cannot be found in snapshot" in text or (
            "error during metadata file deserialization" in text  # a snapshot's commit metadata
        ):
            return DamagedMetadataError(_snapshot_named(text), UNREADABLE.format(reason=reason))
        return None
    if not (_UNDECODABLE.search(text) or _GONE.search(text)):
        return None
    kind = fetch.group(1)
    if kind == "fetch_chunk":
        chunk = next((m for m in map(_CHUNK_KEY.match, _KEY.findall(text)) if m), None)
        why = MISSING_OBJECT.format(reason=reason)
        if chunk is None:
            return DamagedMetadataError("A chunk", why)
        coords = tuple(int(c) for c in chunk.group(2).split("/")[1:])
        return CorruptChunkError(chunk.group(1), coords, why=why)
    if kind == "fetch_manifest":
        path = _ARRAY_PATH.search(text)
        name = next((g for g in path.groups() if g), None) if path else None
        if name is None:
            keys = [_CHUNK_KEY.match(k) for k in _KEY.findall(text)]
            name = next((k.group(1) for k in keys if k is not None), None)
        if name:
            what = f"The manifest of array '{name}'"
        else:
            found = _MANIFEST_ID.search(text)
            what = f"Manifest {found.group(1)}" if found else "A manifest"
        return DamagedMetadataError(what, UNREADABLE.format(reason=reason))
    if kind == "fetch_transaction_log":
        found = _TRANSACTION_ID.search(text)
        what = f"The transaction log of snapshot {found.group(1)}" if found else "A transaction log"
        return DamagedMetadataError(what, UNREADABLE.format(reason=reason))
    return DamagedMetadataError(_snapshot_named(text), UNREADABLE.format(reason=reason))


def is_panic(error: BaseException) -> bool:
    """Whether ``error`` is a Rust panic raised through PyO3 (a call, or an awaited future)."""
    return type(error).__name__ in ("PanicException", "RustPanic")


def probe_snapshots(repo, snapshots, error: BaseException) -> None:
    """After a Rust panic ``error`` that says nothing (an awaited future's), read each of
    ``snapshots`` with a call that keeps a panic's message (``Repository.inspect_snapshot``)
    and raise the damage found (a :class:`DamagedMetadataError` naming the snapshot); return
    where none is found."""
    for snapshot in snapshots:
        try:
            repo.inspect_snapshot(snapshot)
        except BaseException as probe:  # (a panic is a BaseException)
            if not isinstance(probe, Exception) and not is_panic(probe):
                raise
            found = icechunk_damage(probe)
            if isinstance(found, DamagedMetadataError):
                raise DamagedMetadataError(f"Snapshot {snapshot}", found.why) from error


def _snapshot_named(text: str) -> str:
    found = _SNAPSHOT_ID.search(text)
    return f"Snapshot {next(g for g in found.groups() if g)}" if found else "A snapshot"


def damaged_store_error(error: BaseException | None) -> DamagedStoreError | None:
    """The damage behind ``error``: a :class:`DamagedStoreError` it is, was raised from
    (``raise ... from``) or is the one exception of a group of (as Prefect and Dask hand errors
    on), or the damage an ``IcechunkError`` among those reports; None where there is none."""
    chain = list(wrapped(error))
    found = next((e for e in chain if isinstance(e, DamagedStoreError)), None)
    if found is not None:
        return found
    return next((d for d in map(icechunk_damage, chain) if d is not None), None)


def raise_damage(error: BaseException, store: str | None = None) -> None:
    """Raise the damage ``error`` reports (naming ``store``), from it; return where it reports
    none (the caller re-raises ``error``)."""
    found = damaged_store_error(error)
    if found is not None:
        raise found.with_store(store) from error


# A chunk whose stored bytes fail their checksum (or cannot be decoded): one line, naming the
# chunk, the array and the store, and what to do.
CORRUPT_CHUNK = (
    "Chunk {chunk} of array '{array}'{where} is corrupt: {why}. 'fairpipe verify --store "
    "{store}' lists every damaged chunk; restore the store from a copy or ingest its source again."
)
CHECKSUM_MISMATCH = "its crc32c checksum does not match its bytes"
UNDECODABLE = "its bytes cannot be decoded ({error})"


class CorruptChunkError(DamagedStoreError):
    """A chunk of an array whose stored bytes are not what was written: they fail the crc32c
    checksum every array carries as its last codec, or (an array stored without one) cannot be
    decoded. Damaged storage, never bad input and never a wrong answer: the read stops.

    ``array`` is the array's path in the store, ``chunk`` the chunk's coordinates, ``store`` the
    store's URL where the layer that raised it knew it (:meth:`with_store` adds it later)."""

    def __init__(self, array: str, chunk: tuple[int, ...], store: str | None = None,
                 why: str = CHECKSUM_MISMATCH):  # fmt: skip
        self.array, self.chunk, self.store, self.why = array, tuple(chunk), store, why
        super().__init__(array, self.chunk, store, why)

    def __str__(self) -> str:
        where = f" in the store {self.store}" if self.store else ""
        return CORRUPT_CHUNK.format(chunk=format_chunk(self.chunk), array=self.array,
                                    where=where, why=self.why, store=self.store or "STORE")  # fmt: skip

    def with_store(self, store: str | None) -> CorruptChunkError:
        """This error, naming ``store`` if it named none."""
        if self.store or not store:
            return self
        return CorruptChunkError(self.array, self.chunk, store, self.why)


def format_chunk(chunk: tuple[int, ...]) -> str:
    """Chunk coordinates as a message shows them: ``(3, 0)``, ``(7)``."""
    return "(" + ", ".join(str(int(c)) for c in chunk) + ")"


def corrupt_chunk_error(exc: BaseException | None) -> CorruptChunkError | None:
    """The :class:`CorruptChunkError` behind ``exc`` (itself, or an error it wraps:
    :func:`fairpipe.errors.wrapped`), or None."""
    return next((e for e in wrapped(exc) if isinstance(e, CorruptChunkError)), None)
