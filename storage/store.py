"""The fairpipe store: opening, reading and atomic write transactions over an Icechunk repository.

One dataset is one Icechunk repository of Zarr v3 arrays, one commit per flow run. What lives in
it is described where it is written: the rows and the LSH index in :mod:`storage.index`, the
clustering model in :mod:`storage.models`, the fair summary in :mod:`storage.summary`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fairpipe.errors import FairpipeInputError, wrapped
from storage.damage import DamagedMetadataError, DamagedStoreError, raise_damage
from storage.lock import LOCK_NAME, StoreBusyError, WriterLock, lock_path_for
from storage.names import current_names, upgrade_names
from storage.paths import NESTED, check_own_objects
from storage.urls import (
    delete_objects,
    enclosing_repository_url,
    list_objects,
    make_storage,
    parse_store_url,
    probe_endpoint,
)

FORMAT = 2
TXN_PREFIX = "fairpipe-txn-"
INTERNAL = "fairpipe_checkpoint"  # commit metadata key of a transaction's checkpoints
CHECKPOINT = "checkpoint before distributed writes"
CREATED = "create fairpipe store"  # the message of a store's first commit
# Where Icechunk's local storage keeps a branch's ref (its folder outlives the branch).
LOCAL_REF_FOLDER = "refs/branch.{branch}"
NOT_A_STORE = "{url} is not a fairpipe store ({why}). Give an empty or new folder to create one."
UNREACHABLE = (
    "Cannot reach the store {url} ({why}). Check the URL, the network, and the credentials and "
    "endpoint in the environment (AWS_*, GOOGLE_*, AZURE_*)."
)
NO_STORE = "There is no fairpipe store at {url}. Run 'fairpipe ingest SOURCE --store {url}' first."
CREATED_MEANWHILE = (
    "Store {url} was created by another command while this one was starting; run this one again "
    "to add to it."
)

__all__ = [
    "CorruptChunkError",
    "DamagedStoreError",
    "FairpipeStore",
    "NotAStoreError",
    "StoreBusyError",
    "open_store",
    "Transaction",
]


class NotAStoreError(FairpipeInputError):
    """The location exists but holds something other than a fairpipe store."""


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


def zarr_api():
    """The zarr module, imported on first use (opening a store should not pay for it twice)."""
    import zarr

    return zarr


def on_zarr_loop(coroutine):
    """Run ``coroutine`` to its end on zarr's own event loop, the loop zarr's stores and
    Icechunk's zarr store work on (their async reads and writes, awaited many at once, are what
    makes direct chunk reads fast). zarr offers no public runner for its loop: this is the one
    place fairpipe reaches ``zarr.core.sync.sync``, and tests/storage/test_chunk_reads.py fails
    naming zarr when an upgrade moves it."""
    from zarr.core.sync import sync

    return sync(coroutine)


def open_group(session, mode: str = "r"):
    """The root group of a session's store (read: its groups' metadata checked against what
    their commit recorded, :mod:`storage.manifests`)."""
    if mode == "r":
        from storage.manifests import check_groups

        check_groups(session)
    with _metadata_read("the root group"):
        return zarr_api().open_group(session.store, mode=mode)


def open_array(session, name: str, mode: str = "r"):
    """Array ``name`` of a session's store (read: its metadata and its chunks as its manifest
    lists them checked against what their commit recorded, once per snapshot:
    :func:`storage.manifests.check_array`)."""
    if mode == "r":
        from storage.manifests import check_array

        check_array(session, name)
    if _is_light(session):  # storage.light: read-only, without zarr
        return session.array(name)
    with _metadata_read(f"array '{name}'"):
        return zarr_api().open_array(session.store, path=name, mode=mode)


@contextlib.contextmanager
def _metadata_read(what: str):
    """Around zarr's read of a node's metadata: metadata that is not JSON or not Zarr's (a
    damaged snapshot of a store without a record of it) is a :class:`DamagedMetadataError`, and
    so is what Icechunk reports as damage (:func:`storage.damage.icechunk_damage`)."""
    from zarr.errors import MetadataValidationError, UnknownCodecError

    try:
        yield
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        why = f"it is not valid JSON ({type(e).__name__}: {e})"
        raise DamagedMetadataError(f"The metadata of {what}", why) from e
    except (MetadataValidationError, UnknownCodecError) as e:
        why = f"it is not Zarr metadata ({' '.join(str(e).split())})"
        raise DamagedMetadataError(f"The metadata of {what}", why) from e
    except Exception as e:
        raise_damage(e)
        raise


def _is_light(obj) -> bool:
    """Whether ``obj`` is a :class:`storage.light.LightSession` (not an Icechunk one) or one of
    its arrays."""
    return bool(getattr(obj, "is_light", False))


@dataclass
class Transaction:
    """Writes on a private branch; ``main`` moves to the result once, at the end, or never.

    Icechunk cannot fork a session that holds uncommitted changes, and distributed writes need
    forks. So a transaction works on a temporary branch where it may ``checkpoint`` (commit) as
    often as it needs, and publishing is one compare-and-swap of ``main`` to the branch's tip.
    Readers of ``main`` see the old state or the new one, never a half-written one.
    """

    store: FairpipeStore
    branch: str
    session: Any
    base_snapshot: str
    # Commit metadata added inside the block (the lineage log's operation key): like the
    # transaction's own, it must hold nothing that identifies a person.
    metadata: dict = field(default_factory=dict)

    @property
    def root(self):
        return open_group(self.session, mode="a")

    def checkpoint(self, message: str) -> str:
        """Commit what is written so far to the private branch and continue in a new session."""
        snap = (
            commit_recorded(self.store.repo, self.session, message, {INTERNAL: True})
            if self.session.has_uncommitted_changes
            else None
        )
        self.session = self.store.repo.writable_session(self.branch)
        return snap or self.session.snapshot_id

    def fork(self):
        if self.session.has_uncommitted_changes:
            self.checkpoint(CHECKPOINT)
        return self.session.fork()

    def merge(self, forks) -> None:
        if forks:
            self.session.merge(*forks)


def commit_recorded(repo, session, message: str, metadata: dict | None = None) -> str:
    """``session.commit(message, metadata)`` with the record of what the commit writes
    (:func:`storage.manifests.commit`): how every commit of a store is made."""
    from storage.manifests import commit

    return commit(repo, session, message, metadata)


def write_rows(session, name: str, start: int, values: np.ndarray) -> None:
    """Write ``values`` at rows [start, start + len) of array ``name`` (a fork session is fine)."""
    write_block(session, name, (start,) + (0,) * (values.ndim - 1), values)


def write_block(session, name: str, start: tuple[int, ...], block: np.ndarray) -> None:
    """``array[start : start + block.shape] = block``. A block made of whole chunks of a plainly
    encoded array is encoded here and put straight into the store, its chunks concurrently
    (alone, zarr's path took 1.7x the time for 416 chunks of segments; an index build in the
    flow spends 13% less); a chunk equal to the fill value is deleted instead, as zarr does
    (unless the array writes empty chunks), so both paths leave the same objects, byte for byte.
    Rows of an array chunked along its first axis only are written the same way, the chunks
    they cover in part fetched, patched and put back (:func:`_write_rows_direct`: an append's
    ids, groups, points and sketches). Any other block goes through zarr."""
    import itertools

    arr = open_array(session, name, mode="r+")
    region = tuple(slice(a, a + n) for a, n in zip(start, block.shape))
    plain = _plain_chunks(arr)
    dims = zip(start, block.shape, arr.chunks, arr.shape)
    aligned = all(a % c == 0 and n % c == 0 and a + n <= m for a, n, c, m in dims)
    whole = plain is not None and block.dtype == plain.dtype and aligned
    keep_empty = bool(arr.config.write_empty_chunks)
    by_rows = (
        plain is not None
        and block.dtype == plain.dtype
        and block.ndim >= 1
        and tuple(arr.chunks[1:]) == tuple(arr.shape[1:]) == tuple(block.shape[1:])
        and not any(start[1:])
        and start[0] + block.shape[0] <= arr.shape[0]
    )
    if not whole and by_rows and block.size:
        assert plain is not None
        _write_rows_direct(session, plain, keep_empty, int(start[0]), block)
        return
    if not whole or block.size == 0:
        with zarr_checked(arr, region):
            arr[region] = block
        return
    assert plain is not None
    chunks = plain.shape
    grid = [range(n // c) for n, c in zip(block.shape, chunks)]
    parts = []
    for local in itertools.product(*grid):
        part = block[tuple(slice(i * c, (i + 1) * c) for i, c in zip(local, chunks))]
        parts.append((tuple(a // c + i for a, c, i in zip(start, chunks, local)), part))
    _put_chunks(session, plain, keep_empty, parts)


def _write_rows_direct(session, plain: _PlainChunks, keep_empty: bool, start: int,
                       block: np.ndarray) -> None:  # fmt: skip
    """Rows [start, start + len(block)) of an array chunked along its first axis only: the
    chunks they cover whole are encoded from ``block``; the (at most two) they cover in part
    are fetched (a chunk never written holds the fill value), patched and put back with them,
    as zarr would write them."""
    c = plain.shape[0]
    end = start + block.shape[0]
    first, last = start // c, (end - 1) // c
    partial = [k for k in sorted({first, last}) if k * c < start or (k + 1) * c > end]
    fetched: dict[int, np.ndarray] = {}

    def take(i: int, values: np.ndarray) -> None:
        fetched[partial[i]] = np.array(values)  # a writable copy

    zeros = (0,) * (block.ndim - 1)
    _fetch_chunks(session, plain, [(k,) + zeros for k in partial], take)
    parts = []
    for k in range(first, last + 1):
        a, b = max(start, k * c), min(end, (k + 1) * c)
        if k in fetched:
            chunk = fetched[k]
            chunk[a - k * c : b - k * c] = block[a - start : b - start]
        else:
            chunk = block[a - start : b - start]
        parts.append(((k,) + zeros, chunk))
    _put_chunks(session, plain, keep_empty, parts)


def write_chunks(session, name: str, parts: Iterable[tuple[tuple[int, ...], np.ndarray]]) -> None:
    """Write whole chunks of a plainly encoded array: ``parts`` are (chunk coordinates, the
    chunk's values), put straight into the store concurrently (what :func:`write_block` does for
    a block; here the chunks need not form one). Any other array: through zarr, chunk by chunk.
    Each part is encoded (or written) before the next is taken, so an iterator may yield the
    same buffer again."""
    if isinstance(parts, list) and not parts:
        return
    arr = open_array(session, name, mode="r+")
    plain = _plain_chunks(arr)
    if plain is None:
        for coord, part in parts:
            region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(coord, arr.chunks))
            with zarr_checked(arr, region):
                arr[region] = part
        return
    _put_chunks(session, plain, bool(arr.config.write_empty_chunks), parts)


def _put_chunks(session, plain: _PlainChunks, keep_empty: bool, parts) -> None:
    """Encode and put (chunk coordinates, values) pairs, at most READ_CONCURRENCY at once; a
    chunk equal to the fill value is deleted instead, as zarr does (unless ``keep_empty``)."""
    import asyncio

    from zarr.buffer import default_buffer_prototype

    puts: list[tuple[str, bytes | None]] = []
    for coord, part in parts:
        if part.shape != plain.shape or part.dtype != plain.dtype:
            raise ValueError(f"a chunk of {plain.path} is {plain.shape} {plain.dtype}")
        key = f"{plain.path}/{plain.encode_key(coord)}"
        empty = not keep_empty and _all_fill(part, plain.fill)
        puts.append((key, None if empty else plain.encode(part)))
    store, proto = session.store, default_buffer_prototype()

    async def put() -> None:
        gate = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(key: str, data: bytes | None) -> None:
            if data is None:
                await store.delete(key)
            else:
                await store.set(key, proto.buffer.from_bytes(data))

        await _every(gate, [lambda k=k, d=d: one(k, d) for k, d in puts])

    on_zarr_loop(put())


def _all_fill(part: np.ndarray, fill) -> bool:
    """Whether every value of ``part`` is the fill value, as zarr decides it (so both write paths
    delete the same chunks): NaN matches NaN; a float fill of zero matches by bit pattern (a
    chunk of -0.0 is kept: it is not the fill 0.0)."""
    f = np.asarray(fill)
    flat = part.reshape(-1)
    if f.dtype.kind == "f" and f == 0.0 and part.dtype.kind in "fc":
        word = np.dtype(f"u{part.dtype.itemsize}") if part.dtype.itemsize <= 8 else None
        if word is None:  # complex128 and wider: zarr's own comparison of raw bytes
            void = f"V{part.dtype.itemsize}"
            target = np.asarray(fill, part.dtype).reshape(1).view(void)
            return bool((flat.view(void) == target[0]).all())
        values, target = flat.view(word), np.asarray(fill, part.dtype).reshape(1).view(word)[0]
    elif f.dtype.kind in "fc" and np.isnan(f):
        return bool(np.isnan(part).all())
    else:
        values, target = flat, fill
    if values.size and not (values[[0, -1]] == target).all():
        return False  # most chunks: decided by two values, without a pass over all
    return bool((values == target).all())


def read_array(session, name: str, sel=slice(None)) -> np.ndarray:
    arr = open_array(session, name)
    with zarr_checked(arr, sel):
        return np.asarray(arr[sel])


@contextlib.contextmanager
def zarr_checked(arr, sel: Any = None):
    """Around a read of zarr array ``arr`` through zarr's codec pipeline (or a write of part of a
    chunk, which reads it): zarr's own error for a chunk that fails its checksum or its decoders
    (a ValueError or RuntimeError naming no chunk) becomes a :class:`CorruptChunkError` naming
    the first chunk selection ``sel`` reads (every chunk where None) that fails, if one does
    (:func:`storage.integrity.first_corrupt_chunk`, which runs only once the read has failed)."""
    try:
        yield
    except (ValueError, RuntimeError) as e:
        if _is_light(arr):
            raise
        from storage.integrity import first_corrupt_chunk

        try:
            bad = first_corrupt_chunk(arr, sel)
        except Exception:  # the search failed too: zarr's error is the one to see
            bad = None
        if bad is None:
            raise
        raise bad from e


# Chunks fetched at once by the direct read path (measured on a 1M x 128 store's 489 chunks of
# points: 8 in flight 0.18 s, all at once 0.31 s, 2 at once 0.43 s).
READ_CONCURRENCY = 8


@dataclass(frozen=True)
class _PlainChunks:
    """How to turn one stored chunk of an array back into numbers without zarr's codec pipeline:
    the array's chunk shape, dtype, fill value, byte-to-byte decoders (Blosc or Zstd, applied
    last first) and whether a crc32c checksum ends the chain (verified before anything is
    decoded). Only arrays whose codecs are exactly that (little-endian bytes, then at most those
    compressors, then at most the checksum) get one; zarr reads every other array."""

    path: str
    encode_key: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    fill: Any
    decoders: tuple
    encoders: tuple = ()  # the same codecs, applied first to last
    checksum: bool = False  # a crc32c of the encoded bytes follows them (zarr's Crc32cCodec)

    def encode(self, chunk: np.ndarray) -> bytes:
        """A whole chunk's stored bytes (what zarr's codec pipeline writes for it)."""
        data: Any = np.ascontiguousarray(chunk, dtype=self.dtype).reshape(-1).view(np.uint8)
        for encode in self.encoders:
            data = encode(data)
        if not self.checksum:
            return bytes(data)
        return b"".join((data, crc32c_of(data).to_bytes(4, "little")))  # one copy

    def decode(self, data) -> np.ndarray:
        """The chunk of its stored bytes (any buffer; None: a chunk never written). Raises
        :class:`ChecksumMismatch` where the bytes fail their checksum, and whatever the decoders
        raise for bytes they cannot read."""
        if data is None:  # a chunk never written holds the fill value
            return np.full(self.shape, self.fill, dtype=self.dtype)
        if self.checksum:
            data = np.frombuffer(data, dtype=np.uint8)
            if not checksum_ok(data):
                raise ChecksumMismatch(CHECKSUM_MISMATCH)
            data = data[:-4]
        for decode in self.decoders:
            data = decode(data)
        return np.frombuffer(data, dtype=self.dtype).reshape(self.shape)


class ChecksumMismatch(ValueError):
    """Stored bytes whose crc32c checksum is not the one stored after them."""


def crc32c_of(data) -> int:
    """The crc32c (Castagnoli) of a bytes object or a contiguous numpy array's bytes, as zarr's
    Crc32cCodec computes it (google-crc32c's compiled code, about 15 GB/s here)."""
    from google_crc32c import value

    return int(value(data if isinstance(data, (bytes, np.ndarray)) else bytes(data)))


def checksum_ok(data) -> bool:
    """Whether stored bytes ``data`` end with the crc32c of the bytes before them (what a chunk of
    an array whose last codec is the checksum must do)."""
    data = np.frombuffer(data, dtype=np.uint8)
    return data.size >= 4 and crc32c_of(data[:-4]) == int.from_bytes(data[-4:], "little")


def _plain_chunks(arr) -> _PlainChunks | None:
    if _is_light(arr):  # a storage.light array: plainly encoded by design
        return arr.plain
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec

    meta = arr.metadata
    codecs = getattr(meta, "codecs", None)
    if getattr(meta, "zarr_format", None) != 3 or not codecs:
        return None
    first, rest = codecs[0], list(codecs[1:])
    if not isinstance(first, BytesCodec):  # e.g. sharding, or an array-to-array codec first
        return None
    dtype = np.dtype(arr.dtype)
    little = dtype.itemsize == 1 or getattr(first.endian, "value", first.endian) == "little"
    if not little or dtype.byteorder == ">":
        return None
    checksum = bool(rest) and isinstance(rest[-1], Crc32cCodec)
    if checksum:
        rest.pop()
    decoders, encoders = [], []
    for codec in rest:
        if isinstance(codec, BloscCodec):
            from numcodecs import Blosc, blosc

            decoders.append(blosc.decompress)
            # The numcodecs codec zarr's BloscCodec builds from the same settings.
            shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[codec.shuffle.name]
            config = {"cname": codec.cname.name, "clevel": codec.clevel, "shuffle": shuffle,
                      "blocksize": codec.blocksize, "typesize": codec.typesize}  # fmt: skip
            encoders.append(Blosc.from_config(config).encode)
        elif isinstance(codec, ZstdCodec):
            from numcodecs import Zstd

            decoders.append(Zstd().decode)
            encoders.append(Zstd.from_config({"level": codec.level,
                                              "checksum": codec.checksum}).encode)  # fmt: skip
        else:
            return None
    return _PlainChunks(path=arr.path, encode_key=meta.encode_chunk_key, shape=tuple(arr.chunks),
                        dtype=dtype, fill=arr.fill_value, decoders=tuple(reversed(decoders)),
                        encoders=tuple(encoders), checksum=checksum)  # fmt: skip


def _fetch_chunks(session, plain: _PlainChunks, coords: list[tuple[int, ...]], take) -> None:
    """Fetch chunks ``coords`` straight from the store, at most ``READ_CONCURRENCY`` at once, and
    hand each to ``take(i, chunk)`` as it arrives (so at most that many are held at once)."""
    _fetch_many(session, [(plain, c) for c in coords], take)


def _fetch_many(session, items: list[tuple[_PlainChunks, tuple[int, ...]]], take) -> None:
    """:func:`_fetch_chunks` for chunks of several arrays: ``items`` are (array, chunk)."""
    import asyncio

    if not items:
        return
    get, run = _chunk_source(session)

    async def fetch() -> None:
        gate = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(i: int, plain: _PlainChunks, c: tuple[int, ...]) -> None:
            data = await get(f"{plain.path}/{plain.encode_key(c)}")
            take(i, decode_chunk(plain, c, data))

        await _every(gate, [lambda i=i, p=p, c=c: one(i, p, c) for i, (p, c) in enumerate(items)])

    run(fetch)


async def _every(gate, jobs: list) -> None:
    """Run ``jobs`` (coroutine functions), as many at once as ``gate`` lets in; once one fails,
    start no more, wait for those under way, then raise the first error. No job outlives this
    call: a fetch still in flight in Icechunk's compiled store when the error reaches the
    program's exit would call back into an interpreter being torn down (a Rust panic, SIGABRT),
    and one on the light path's event loop after it is closed."""
    import asyncio

    failed: list[BaseException] = []

    async def guarded(job) -> None:
        async with gate:
            if failed:
                return
            try:
                await job()
            except BaseException as e:  # (a cancellation too: the others still end first)
                failed.append(e)

    await asyncio.gather(*(guarded(job) for job in jobs))
    if failed:
        raise failed[0]


def decode_chunk(plain: _PlainChunks, coord: tuple[int, ...], data) -> np.ndarray:
    """Chunk ``coord`` of its stored bytes ``data``; a :class:`CorruptChunkError` naming it where
    they fail their checksum or cannot be decoded."""
    try:
        return plain.decode(data)
    except ChecksumMismatch:
        raise CorruptChunkError(plain.path, coord) from None
    except Exception as e:  # bytes no decoder reads (an array stored without a checksum)
        why = UNDECODABLE.format(error=f"{type(e).__name__}: {e}".strip().split("\n")[0])
        raise CorruptChunkError(plain.path, coord, why=why) from e


def _chunk_source(session):
    """(an async read of a key's stored bytes, None where there are none; a runner of a
    coroutine factory) for an Icechunk session (through zarr's store and event loop) or a
    :class:`storage.light.LightSession` (its own)."""
    if _is_light(session):
        return session.get_bytes, session.run
    from zarr.buffer import default_buffer_prototype

    store, proto = session.store, default_buffer_prototype()

    async def get(key: str):
        raw = await store.get(key, proto)
        return None if raw is None else raw.as_numpy_array()

    return get, lambda make: on_zarr_loop(make())


def read_arrays(session, names: list[str]) -> list[np.ndarray]:
    """Whole arrays ``names``, their chunks fetched together straight from the store when
    plainly encoded (a few small arrays cost one round trip instead of zarr's path for each)."""
    import itertools

    arrays = [open_array(session, name) for name in names]
    out: list[np.ndarray] = []
    items: list[tuple[_PlainChunks, tuple[int, ...]]] = []
    owner: list[int] = []
    for i, arr in enumerate(arrays):
        plain = _plain_chunks(arr)
        if plain is None or arr.size == 0:
            with zarr_checked(arr):
                out.append(np.asarray(arr[...]))
            continue
        out.append(np.empty(arr.shape, dtype=arr.dtype))
        grid = [range(-(-n // c)) for n, c in zip(arr.shape, arr.chunks)]
        for coord in itertools.product(*grid):
            items.append((plain, coord))
            owner.append(i)

    def take(j: int, chunk: np.ndarray) -> None:
        arr, coord = out[owner[j]], items[j][1]
        place = tuple(slice(k * c, min((k + 1) * c, n))
                      for k, c, n in zip(coord, chunk.shape, arr.shape))  # fmt: skip
        arr[place] = chunk[tuple(slice(0, p.stop - p.start) for p in place)]

    _fetch_many(session, items, take)
    return out


def _chunk_pieces(sel: tuple, shape: tuple[int, ...], chunks: tuple[int, ...]):
    """The chunks a basic selection (ints and unit-step slices, one per dimension) reads, as
    [(chunk coordinates, selection inside that chunk), ...] in order along the last dimension,
    when it lies inside one chunk in every other dimension (a segment of the index spanning
    several chunks: its pieces are joined along the last axis); else None."""
    if len(sel) != len(shape):
        return None
    coord: list[int] = []
    local: list[int | slice] = []
    for i, (s, n, c) in enumerate(zip(sel, shape, chunks)):
        if isinstance(s, (int, np.integer)) and 0 <= s < n:
            coord.append(int(s) // c)
            local.append(int(s) % c)
        elif isinstance(s, slice) and s.step in (None, 1):
            a, b, _ = s.indices(n)
            if b <= a:
                return None
            if a // c != (b - 1) // c:
                if i != len(shape) - 1:
                    return None
                return [
                    (
                        (*coord, k),
                        (*local, slice(max(a, k * c) - k * c, min(b, (k + 1) * c) - k * c)),
                    )
                    for k in range(a // c, (b - 1) // c + 1)
                ]
            coord.append(a // c)
            local.append(slice(a % c, (b - 1) % c + 1))
        else:
            return None
    return [(tuple(coord), tuple(local))]


def read_many(session, name: str, selections: list) -> list[np.ndarray]:
    """``array[selection]`` for each of ``selections`` of array ``name``, read concurrently.
    Selections that each lie inside one chunk of a plainly encoded array (or, along its last
    dimension only, span several) are fetched as whole chunks straight from the store (about
    half the time of zarr's path, which pays a task and a thread hop per chunk); others go
    through zarr."""
    import asyncio

    if not selections:
        return []
    arr = open_array(session, name)
    plain = _plain_chunks(arr)
    places = [_chunk_pieces(tuple(s), arr.shape, arr.chunks) for s in selections]
    if plain is not None and all(p is not None for p in places):
        pieces = [(i, coord, local) for i, p in enumerate(places) for coord, local in p or []]
        got: list = [None] * len(pieces)

        def take(j: int, chunk: np.ndarray) -> None:
            got[j] = chunk[pieces[j][2]].copy()

        _fetch_chunks(session, plain, [coord for _, coord, _ in pieces], take)
        out: list = [[] for _ in selections]
        for (i, _, _), part in zip(pieces, got):
            out[i].append(part)
        return [parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1) for parts in out]
    if _is_light(session):
        return [np.asarray(arr[tuple(s)]) for s in selections]
    from zarr.api.asynchronous import open_array as open_async

    async def read() -> list:
        arr = await open_async(store=session.store, path=name, mode="r")
        return await asyncio.gather(*(arr.getitem(sel) for sel in selections))

    with zarr_checked(arr):
        return [np.asarray(x) for x in on_zarr_loop(read())]


def read_rows_at(session, name: str, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (sorted or not) of array ``name``: only the chunks holding them are read,
    each once (:func:`for_rows_at`)."""
    arr = open_array(session, name)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((rows.size, *arr.shape[1:]), dtype=arr.dtype)

    def take(part: np.ndarray, values: np.ndarray) -> None:
        out[part] = values

    for_rows_at(session, name, rows, take)
    return out


def _check_rows(rows: np.ndarray, name: str, n: int) -> None:
    """An IndexError naming the first of ``rows`` (in their order) outside [0, n)."""
    if rows.min() < 0 or rows.max() >= n:
        bad = rows[(rows < 0) | (rows >= n)][0]
        raise IndexError(f"Row {bad} is out of range for {name} of {n} rows.")


def _chunk_runs(sorted_rows: np.ndarray, block: int):
    """(each row's chunk along the first axis, where each chunk's run of ``sorted_rows`` starts,
    where it ends)."""
    chunk = sorted_rows // block
    firsts = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
    return chunk, firsts, np.r_[firsts[1:], sorted_rows.size]


def for_rows_at(session, name: str, rows: np.ndarray, take) -> None:
    """Hand ``take(positions, values)`` the values of ``rows[positions]`` of array ``name``, a
    chunk at a time as each arrives: only the chunks holding ``rows`` are read, each once,
    straight from the store when the array is plainly encoded and split along rows only (then
    at most ``READ_CONCURRENCY`` chunks are held at once, and nothing the size of all ``rows``
    is, unless ``take`` keeps it); zarr's orthogonal selection otherwise (one call)."""
    arr = open_array(session, name)
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return
    plain = _plain_chunks(arr)
    if plain is None or tuple(arr.chunks[1:]) != tuple(arr.shape[1:]):
        sel = (rows,) + (slice(None),) * (arr.ndim - 1)
        with zarr_checked(arr, sel):
            values = np.asarray(arr.get_orthogonal_selection(sel))
        take(np.arange(rows.size), values)
        return
    _check_rows(rows, name, arr.shape[0])
    block = arr.chunks[0]
    order = np.argsort(rows, kind="stable")
    chunk, firsts, ends = _chunk_runs(rows[order], block)

    def one(i: int, values: np.ndarray) -> None:
        part = order[firsts[i] : ends[i]]
        take(part, values[rows[part] - int(chunk[firsts[i]]) * block])

    _fetch_chunks(session, plain, [(int(chunk[f]),) + (0,) * (arr.ndim - 1) for f in firsts], one)


# Chunks a rewrite holds at once (each read, edited and put back): at most 64 chunks of 1 MB of
# points, so a deletion batch's memory follows this, not the rows it erases.
REWRITE_CHUNKS = 64


def rewrite_rows_at(session, name: str, rows: np.ndarray, edit) -> None:
    """Rewrite only the chunks of array ``name`` that hold ``rows`` (along its first axis): each
    stored chunk is fetched whole straight from the store, ``edit(chunk, local_rows)`` changes
    it in place (``local_rows``: the rows' positions in it, increasing), and it is put back,
    REWRITE_CHUNKS at a time. A chunk's bytes beyond the array's end are kept as stored. Arrays
    that are not plainly encoded, or are split along another axis: through zarr, the rows'
    chunks only."""
    arr = open_array(session, name, mode="r+")
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    if rows.size == 0:
        return
    _check_rows(rows, name, arr.shape[0])
    block = int(arr.chunks[0])
    chunk, firsts, ends = _chunk_runs(rows, block)
    plain = _plain_chunks(arr)
    if plain is None or tuple(arr.chunks[1:]) != tuple(arr.shape[1:]):
        for f, e in zip(firsts, ends):
            a = int(chunk[f]) * block
            with zarr_checked(arr, slice(a, a + block)):
                values = np.asarray(arr[a : a + block])
            edit(values, rows[f:e] - a)
            with zarr_checked(arr, slice(a, a + block)):
                arr[a : a + values.shape[0]] = values
        return
    keep_empty = bool(arr.config.write_empty_chunks)
    zeros = (0,) * (arr.ndim - 1)
    for g in range(0, firsts.size, REWRITE_CHUNKS):
        mine = list(range(g, min(g + REWRITE_CHUNKS, firsts.size)))
        coords = [(int(chunk[firsts[i]]),) + zeros for i in mine]
        got: dict[int, np.ndarray] = {}

        def take(i: int, values: np.ndarray, got=got) -> None:
            got[i] = np.array(values)  # a writable copy

        _fetch_chunks(session, plain, coords, take)
        for j, i in enumerate(mine):
            edit(got[j], rows[firsts[i] : ends[i]] - coords[j][0] * block)
        _put_chunks(session, plain, keep_empty, [(coords[j], got[j]) for j in range(len(mine))])


def checksummed(compressors: Any = "auto") -> tuple:
    """The bytes-to-bytes codecs of an array a store creates: ``compressors`` (``"auto"``: zarr's
    default, zstd at level 0; None: none), then a crc32c checksum of the encoded chunk, so a
    chunk whose stored bytes change is an error (:class:`CorruptChunkError`), never a wrong
    answer. The direct chunk path writes and verifies it too (:class:`_PlainChunks`)."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    if isinstance(compressors, str) and compressors == "auto":
        compressors = (ZstdCodec(level=0, checksum=False),)  # zarr 3's default, fixed here
    elif compressors is None:
        compressors = ()
    elif not isinstance(compressors, (list, tuple)):
        compressors = (compressors,)
    return (*compressors, Crc32cCodec())


def create_array(root, name: str, *, compressors: Any = "auto", **kwargs):
    """``root.create_array(name, ...)`` with the chunks checksummed (:func:`checksummed`): how
    every array of a store is created."""
    return root.create_array(name, compressors=checksummed(compressors), **kwargs)


def replace_array(root, name: str, values: np.ndarray) -> None:
    """Write ``values`` as array ``name`` of an open group, replacing any array there."""
    if name in root:
        del root[name]
    arr = create_array(root, name, shape=values.shape, dtype=values.dtype)
    if values.size:
        arr[...] = values


def read_json_array(session, name: str) -> list:
    """The list kept as the UTF-8 JSON bytes of the uint8 array ``name`` (the receipts, the
    lineage log); [] where the store has none."""
    if name not in open_group(session):
        return []
    return json.loads(read_array(session, name).tobytes().decode())


def write_json_array(root, name: str, values: list) -> None:
    """Keep ``values`` as the UTF-8 JSON bytes of the uint8 array ``name`` of an open group."""
    replace_array(root, name, np.frombuffer(json.dumps(values).encode(), dtype=np.uint8))


def _check_empty_folder(url: str, local: Path | None) -> None:
    """A folder that holds no repository may become a store only if it is empty (or holds only
    a lock file)."""
    if local is None or not local.exists():
        return
    entries = [p.name for p in local.iterdir() if p.name != LOCK_NAME]
    if entries:
        why = f"the folder holds {', '.join(sorted(entries)[:3])}"
        raise NotAStoreError(NOT_A_STORE.format(url=url, why=why))


def _abandoned_creation(repo, local: Path) -> bool:
    """Whether the repository ``repo`` in the folder ``local`` is one a fairpipe creation made and
    was killed (SIGKILL, power loss) before marking as a store: fairpipe's lock file beside it,
    no root group, and no snapshot but the repository's first (its clean-up never ran)."""
    if not (local / LOCK_NAME).exists():
        return False
    try:
        open_group(repo.readonly_session(branch="main"))
        return False  # a root group: someone's data
    except Exception:
        pass
    return sum(1 for _ in itertools.islice(repo.ancestry(branch="main"), 2)) == 1


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; return those this call made, outermost first
    (a folder another process made at the same moment is not ours; one it removed meanwhile is
    made again)."""
    made: list[Path] = []
    for _ in range(5):
        missing: list[Path] = []
        at = folder
        while not at.exists():
            missing.append(at)
            if at.parent == at:
                break
            at = at.parent
        try:
            for path in reversed(missing):
                try:
                    path.mkdir()
                except FileExistsError:
                    continue
                made.append(path)
            return made
        except FileNotFoundError:  # a parent removed meanwhile: look again
            continue
    raise FileNotFoundError(f"{folder}: its parent folders keep disappearing")


class FairpipeStore:
    """A fairpipe dataset in an Icechunk repository (local folder or object store URL)."""

    def __init__(self, url: str, repo, spec):
        self.url = url
        self.repo = repo
        self.spec = spec
        self._ids: tuple[str, np.ndarray] | None = None  # (snapshot, its ids): see ids_at
        self._lock: WriterLock | None = None  # held by :meth:`creating` for the whole block
        # The snapshot this object's last transaction published (its record made from a checked
        # base and what it wrote): the next transaction on it need not check it again.
        self._published: str | None = None

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, create: bool = False) -> FairpipeStore:
        """The fairpipe store at ``url``. Opening never writes: a missing folder is reported,
        not made. ``create``: make a new store where there is none (and keep it), as
        :meth:`creating` does."""
        import icechunk

        url = str(url)
        spec = parse_store_url(url)
        local = spec.local_dir
        if local is not None and local.exists() and not local.is_dir():
            raise NotAStoreError(NOT_A_STORE.format(url=url, why="it is a file"))
        if local is not None and not local.exists():
            # Icechunk's local storage makes the folder it is asked about: never ask.
            if not create:
                raise FairpipeInputError(NO_STORE.format(url=url))
            with cls.creating(url) as store:
                return store
        unreachable = probe_endpoint(spec)
        if unreachable is not None:
            raise FairpipeInputError(UNREACHABLE.format(url=url, why=unreachable))
        storage = make_storage(url, spec)
        try:
            exists = icechunk.Repository.exists(storage)
        except icechunk.IcechunkError as e:  # no server, no bucket, no credentials
            raise_damage(e, url)  # or a damaged ref of main
            if local is not None:
                raise
            why = (str(e).strip().splitlines() or [type(e).__name__])[0].strip()
            raise FairpipeInputError(UNREACHABLE.format(url=url, why=why)) from None
        if not exists:
            _check_empty_folder(url, local)
            if not create:
                raise FairpipeInputError(NO_STORE.format(url=url))
            with cls.creating(url) as store:
                return store
        store = cls(url, None, spec)
        with store.named():
            store.repo = icechunk.Repository.open(storage)
        attrs = store.attrs()
        if not attrs and local is not None and _abandoned_creation(store.repo, local):
            # A creation killed before its first commit: no store yet (the next creator, under
            # the writer lock, removes what it left).
            if not create:
                raise FairpipeInputError(NO_STORE.format(url=url))
            with cls.creating(url) as store:
                return store
        if attrs.get("fairpipe_format") is None and (attrs or not create):
            raise NotAStoreError(
                NOT_A_STORE.format(url=url, why="an Icechunk repository without fairpipe data")
            )
        return store

    @classmethod
    @contextlib.contextmanager
    def creating(cls, url: str, lock_timeout: float = 0.0) -> Iterator[FairpipeStore]:
        """Make a new, empty store at ``url`` and yield it, holding its writer lock throughout
        (the store's transactions inside the block use that lock). If the block raises, what
        this call made is removed before the lock is released: the repository, the lock file
        and the folders it created, nothing else. Of several commands creating one store at
        once exactly one makes it; the others raise :class:`StoreBusyError` and touch nothing
        of it.
        """
        import icechunk

        url = str(url)
        spec = parse_store_url(url)
        local = spec.local_dir
        made: list[Path] = []
        lock = None
        for _ in range(5):  # the folder may be removed by a failed creator meanwhile
            made += _make_folders(local) if local is not None else []
            lock = WriterLock(lock_path_for(url, local), url, lock_timeout,
                              note_holder=local is None, folder=local is not None)  # fmt: skip
            try:
                lock.__enter__()  # StoreBusyError: the folders made stay (the holder's now)
                break
            except FileNotFoundError:
                lock = None
        if lock is None:
            raise StoreBusyError(CREATED_MEANWHILE.format(url=url))
        store: FairpipeStore | None = None
        before: set[str] = set()
        try:
            storage = make_storage(url, spec)
            taken = False
            if local is not None:
                before = set(os.listdir(local))
                if before == {LOCK_NAME}:  # a holder note of no repository: stale
                    (local / LOCK_NAME).unlink()
                    before = set()
                elif LOCK_NAME in before and icechunk.Repository.exists(storage):
                    if _abandoned_creation(icechunk.Repository.open(storage), local):
                        # Killed before its first commit (this lock now held: no other
                        # creator is at work): what it left goes, as its clean-up would have.
                        for name in before - {LOCK_NAME}:
                            shutil.rmtree(local / name, ignore_errors=True)
                        (local / LOCK_NAME).unlink(missing_ok=True)
                        before = set()
                # Anything else was made by another creator since this command looked (the
                # folder was empty or absent then).
                taken = bool(before)
            else:
                outer = enclosing_repository_url(url, spec)
                if outer is not None:
                    raise FairpipeInputError(NESTED.format(path=url, outer=outer))
                before = list_objects(url, spec)
            if taken or icechunk.Repository.exists(storage):
                raise StoreBusyError(CREATED_MEANWHILE.format(url=url))
            store = cls(url, None, spec)
            store.repo = icechunk.Repository.create(storage)
            if local is not None:
                lock.note_holder()
            store._lock = lock
            # Mark the repository as ours at once, so an empty store reopens as one.
            session = store.repo.writable_session("main")
            open_group(session, mode="a").attrs["fairpipe_format"] = FORMAT
            commit_recorded(store.repo, session, CREATED)
            yield store
        except BaseException:
            if store is not None:
                store._remove_created(before)
            # Only the holder removes folders (a creator that lost the race must not remove the
            # folder it made: the winner may not have written into it yet). A folder holding
            # another creator's store is not empty, and stays.
            for folder in reversed(made):  # only those this call made, if left empty
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
        finally:
            if store is not None:
                store._lock = None
            lock.__exit__(None, None, None)

    def _remove_created(self, before: set[str]) -> None:
        """Delete the repository this process created (its writer lock held): in a local folder,
        the entries that were not there before; in an object store, every object under the
        store's prefix that was not there before."""
        local = self.spec.local_dir
        if local is not None:
            for name in set(os.listdir(local)) - before:
                entry = local / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            return
        with contextlib.suppress(Exception):
            delete_objects(self.url, self.spec, list_objects(self.url, self.spec) - before)

    @classmethod
    def open_existing(cls, url: str) -> FairpipeStore | None:
        """The fairpipe store at ``url``, or None where there is none yet; raises NotAStoreError
        for anything else there."""
        try:
            return cls.open(url)
        except NotAStoreError:
            raise
        except FairpipeInputError:
            return None

    # -- reading ---------------------------------------------------------------------------
    def readonly_session(self, snapshot_id: str | None = None):
        """A read-only session at ``snapshot_id`` (default: the tip of ``main``) whose reads are
        checked against what its commit recorded (:func:`storage.manifests.expect`). Damage
        met opening it is a :class:`DamagedStoreError` naming this store."""
        from storage.manifests import expect

        with self.named():
            if snapshot_id is not None:
                session = self.repo.readonly_session(snapshot_id=snapshot_id)
            else:
                session = self.repo.readonly_session(branch="main")
            expect(self.repo, session.snapshot_id)
        return session

    def attrs(self, session=None) -> dict:
        with self.named():
            session = session or self.readonly_session()
            try:
                group = open_group(session)
            except DamagedStoreError:
                raise
            except (FileNotFoundError, zarr_api().errors.BaseZarrError):
                return {}  # an empty repository has no root group yet (or not a group)
            return current_names(dict(group.attrs))

    def is_empty(self) -> bool:
        return "n" not in self.attrs()

    def require_data(self) -> dict:
        attrs = self.attrs()
        if attrs.get("n", 0) == 0:
            raise FairpipeInputError(NO_STORE.format(url=self.url))
        return attrs

    def history(self) -> list[dict]:
        """``main``'s snapshots, newest first; ``internal`` marks a transaction's checkpoints
        (commits on its private branch before it was published), which no reader ever saw as
        ``main``. A snapshot that cannot be read, or is not what its commit recorded
        (:func:`storage.manifests.history_problem`), is a :class:`DamagedStoreError`."""
        from storage.manifests import RECORD_KEY, ancestry, history_problem

        with self.named():
            tip = self.repo.lookup_branch("main")
            snapshots = list(ancestry(self.repo, tip))
            problem = history_problem(snapshots, tip)
        if problem is not None:
            raise DamagedMetadataError(*problem, store=self.url)
        return [
            {
                "id": s.id,
                "message": s.message,
                "time": s.written_at.isoformat(),
                # Stores written before the metadata existed: the checkpoint's fixed message.
                "internal": bool((s.metadata or {}).get(INTERNAL)) or s.message == CHECKPOINT,
                "metadata": {k: v for k, v in (s.metadata or {}).items() if k != RECORD_KEY},
            }
            for s in snapshots
        ]

    def read(self, name: str, sel=slice(None), session=None) -> np.ndarray:
        with self.named():
            return read_array(session or self.readonly_session(), name, sel)

    @contextlib.contextmanager
    def named(self):
        """Damage met inside (a :class:`DamagedStoreError`, or what Icechunk reports as damage:
        :func:`storage.damage.icechunk_damage`) is raised as a :class:`DamagedStoreError`
        naming this store."""
        from storage.damage import is_panic, probe_snapshots

        try:
            yield
        except DamagedStoreError as e:
            if e.store:
                raise
            raise e.with_store(self.url) from e
        except BaseException as e:
            if is_panic(e) and self.repo is not None:  # a damaged snapshot Icechunk panics on?
                from storage.manifests import snapshots_opened

                snapshots = snapshots_opened()
                with contextlib.suppress(Exception):
                    snapshots.append(self.repo.lookup_branch("main"))
                try:
                    probe_snapshots(self.repo, dict.fromkeys(snapshots), e)
                except DamagedStoreError as found:
                    raise found.with_store(self.url) from e
            if isinstance(e, Exception):
                raise_damage(e, self.url)
            raise

    def ids_at(self, snapshot: str) -> np.ndarray:
        """The ``ids`` array of ``snapshot``, read once per snapshot (a snapshot never changes):
        a forget checks the ids it is given, then its batch maps them to rows, from one read
        (8 bytes a row: 0.2 s at 10M rows). The array is returned read-only: it is shared."""
        if self._ids is None or self._ids[0] != snapshot:
            with self.named():
                ids = read_array(self.readonly_session(snapshot), "ids")
            ids.flags.writeable = False
            self._ids = (snapshot, ids)
        return self._ids[1]

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, message: str, lock_timeout: float = 0.0, metadata: dict | None = None):
        """Hold the writer lock and yield a :class:`Transaction`; publish it on success (with
        commit ``metadata``, which must hold nothing that identifies a person: Icechunk cannot
        erase it).

        An exception inside the block (or a crash) leaves ``main`` at its last commit. The new
        ``main`` snapshot id is ``txn.commit_id`` afterwards. The base snapshot is checked
        against what its commit recorded first (:func:`storage.manifests.check_snapshot`):
        nothing is written on top of damage.
        """
        from storage.manifests import check_snapshot

        with self.writer_lock(lock_timeout):
            stale = [b for b in self.repo.list_branches() if b.startswith(TXN_PREFIX)]
            for name in stale:  # left by a crashed writer; we hold the lock
                self._delete_branch(name)
            if stale:  # its objects too: written, never published
                self._collect_garbage()
            base = self.repo.lookup_branch("main")
            if base != self._published:
                with self.named():  # nothing is written on top of damage (storage.manifests)
                    check_snapshot(self, base)
            branch = f"{TXN_PREFIX}{uuid.uuid4().hex[:12]}"
            self.repo.create_branch(branch, base)
            txn = Transaction(self, branch, self.repo.writable_session(branch), base)
            failed = True
            try:
                yield txn
                if not txn.session.has_uncommitted_changes:  # nothing written: nothing to publish
                    txn.commit_id = base  # type: ignore[attr-defined]
                else:
                    upgrade_names(txn.root)  # a store written with older attribute names
                    tip = commit_recorded(self.repo, txn.session, message,
                                          {**(metadata or {}), **txn.metadata})  # fmt: skip
                    self.repo.reset_branch("main", tip, from_snapshot_id=base)
                    txn.commit_id = tip  # type: ignore[attr-defined]
                    self._published = tip
                failed = False
            finally:
                with contextlib.suppress(Exception):
                    self._delete_branch(branch)
                if failed:  # what the transaction wrote is garbage now: delete it
                    with contextlib.suppress(Exception):
                        self._collect_garbage()

    @contextlib.contextmanager
    def writer_lock(self, lock_timeout: float = 0.0) -> Iterator[None]:
        """Hold the store's writer lock (already held inside :meth:`creating`'s block, and
        inside an outer ``writer_lock``: the store's transactions in it use it, one after the
        other, with no other writer in between)."""
        if self._lock is not None and self._lock.held:
            yield
            return
        local = self.spec.local_dir
        with WriterLock(lock_path_for(self.url, local), self.url, lock_timeout,
                        folder=local is not None) as lock:  # fmt: skip
            self._lock = lock
            try:
                yield
            finally:
                self._lock = None

    def _delete_branch(self, name: str) -> None:
        """Delete a transaction's branch. Icechunk's local storage deletes the branch's ref
        object but leaves the folder that held it (``refs/branch.<name>``), so one empty folder
        would pile up per commit: it is removed here if empty (tests/storage/test_store_files.py
        fails with a clear message if Icechunk's layout changes)."""
        self.repo.delete_branch(name)
        local = self.spec.local_dir
        if local is not None:
            with contextlib.suppress(FileNotFoundError, OSError):
                (local / LOCAL_REF_FOLDER.format(branch=name)).rmdir()

    def _collect_garbage(self) -> None:
        """Delete every object no branch reaches, under the writer lock (the objects of a
        transaction that failed or crashed: chunks written, never published). History is
        untouched: every snapshot of ``main`` stays reachable."""
        if self.spec.local_dir is not None:
            check_own_objects(self.spec.local_dir, self.url)
        self.repo.garbage_collect(datetime.now(UTC))

    def purge_history(self, lock_timeout: float = 0.0, older_than: datetime | None = None) -> dict:
        """Drop the snapshots of ``main`` written before ``older_than`` (default, and at the
        latest: ``main``'s tip) and delete the objects only they used.

        Forgetting is complete only when no snapshot still holds the erased rows: a forget
        commit rewrites the chunks holding them, but earlier snapshots keep the old chunks for
        time travel. This expires the snapshots before the cutoff (history becomes the
        repository's empty first snapshot, then the rest) and garbage-collects every object no
        retained snapshot reaches and written before the cutoff, under the writer lock: no
        fairpipe writer is working, and an object newer than the cutoff is never deleted.
        Chunks the tip still uses are never touched. Readers with a session on an expired
        snapshot may fail afterwards.
        """
        if self.spec.local_dir is not None:
            check_own_objects(self.spec.local_dir, self.url)
        with self.writer_lock(lock_timeout):
            tip = self.repo.lookup_snapshot(self.repo.lookup_branch("main"))
            cutoff = tip.written_at if older_than is None else min(older_than, tip.written_at)
            before = len(self.history())
            self.repo.expire_snapshots(
                cutoff, delete_expired_branches=True, delete_expired_tags=True
            )
            gc = self.repo.garbage_collect(cutoff)
            return {
                "cutoff": cutoff.isoformat(),
                "snapshots_before": before,
                "snapshots_after": len(self.history()),
                "snapshots_deleted": int(gc.snapshots_deleted),
                "chunks_deleted": int(gc.chunks_deleted),
                "bytes_deleted": int(gc.bytes_deleted),
            }


def open_store(url: str, create: bool = False) -> FairpipeStore:
    return FairpipeStore.open(url, create=create)
