"""Chunks read and written straight through a store, beneath zarr's codec pipeline: an array's
codecs as a plain chain (:class:`_PlainChunks`: little-endian bytes, then Blosc or Zstd, then a
crc32c checksum), chunks fetched and put concurrently on zarr's own event loop
(:func:`on_zarr_loop`), raising :class:`fairpipe.storage.damage.CorruptChunkError` for a chunk whose
stored bytes are damaged; and zarr itself (:func:`zarr_api`), whose reads of a node's metadata
report damage as such (:func:`_metadata_read`). The one place fairpipe reaches zarr beyond its
public API."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairpipe.storage.damage import (
    CHECKSUM_MISMATCH,
    UNDECODABLE,
    CorruptChunkError,
    DamagedMetadataError,
    raise_damage,
)


def zarr_api():
    """The zarr module, imported on first use (opening a store should not pay for it twice)."""
    import zarr

    return zarr


@contextlib.contextmanager
def _metadata_read(what: str):
    """Around zarr's read of a node's metadata: metadata that is not JSON or not Zarr's (a
    damaged snapshot of a store without a record of it) is a :class:`DamagedMetadataError`, and
    so is what Icechunk reports as damage (:func:`fairpipe.storage.damage.icechunk_damage`)."""
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


def on_zarr_loop(coroutine):
    """Run ``coroutine`` to its end on zarr's own event loop, the loop zarr's stores and
    Icechunk's zarr store work on (their async reads and writes, awaited many at once, are what
    makes direct chunk reads fast). zarr offers no public runner for its loop: this is the one
    place fairpipe reaches ``zarr.core.sync.sync``, and tests/storage/test_chunk_reads.py fails
    naming zarr when an upgrade moves it."""
    from zarr.core.sync import sync

    return sync(coroutine)


def _is_light(obj) -> bool:
    """Whether ``obj`` is a :class:`fairpipe.storage.light.LightSession` (not an Icechunk one) or one of
    its arrays."""
    return bool(getattr(obj, "is_light", False))


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
    if _is_light(arr):  # a fairpipe.storage.light array: plainly encoded by design
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
    :class:`fairpipe.storage.light.LightSession` (its own)."""
    if _is_light(session):
        return session.get_bytes, session.run
    from zarr.buffer import default_buffer_prototype

    store, proto = session.store, default_buffer_prototype()

    async def get(key: str):
        raw = await store.get(key, proto)
        return None if raw is None else raw.as_numpy_array()

    return get, lambda make: on_zarr_loop(make())


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
