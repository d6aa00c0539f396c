"""Checking an array's stored chunks: listing what its store holds, fetching them concurrently on
zarr's loop, and testing each against its checksum (or, without one, whether it decodes). Reads
check the chunks they read (:func:`first_corrupt_chunk`); ``fairpipe verify`` checks them all
(:mod:`fairpipe.storage.integrity`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from fairpipe.storage.chunks import (
    READ_CONCURRENCY,
    _plain_chunks,
    checksum_ok,
    decode_chunk,
    on_zarr_loop,
)
from fairpipe.storage.damage import CorruptChunkError


def has_checksum(arr) -> bool:
    """Whether array ``arr``'s last codec is a crc32c checksum (a zarr array's metadata)."""
    from zarr.codecs import Crc32cCodec

    codecs = list(getattr(arr.metadata, "codecs", None) or ())
    return bool(codecs) and isinstance(codecs[-1], Crc32cCodec)


def _chunk_coords(arr) -> Callable[[str], tuple[int, ...] | None]:
    """The chunk coordinates of a key below an array's path (``c/3/0``), None for other keys
    (its ``zarr.json``)."""
    encoding = arr.metadata.chunk_key_encoding
    sep = getattr(encoding, "separator", "/")
    if getattr(encoding, "name", "default") == "default":

        def coords(rest: str) -> tuple[int, ...] | None:
            if rest == "c":
                return ()
            if not rest.startswith("c" + sep):
                return None
            return tuple(int(part) for part in rest[2:].split(sep))

        return coords

    def v2(rest: str) -> tuple[int, ...] | None:
        if rest.endswith(("zarr.json", ".zarray", ".zattrs")):
            return None
        return tuple(int(part) for part in rest.split(sep)) if rest != "0" or arr.ndim else ()

    return v2


async def _stored_chunks(arr) -> AsyncIterator[tuple[tuple[int, ...], str]]:
    """(coordinates, key) of every chunk of ``arr`` its store holds, as the store lists them."""
    store, prefix = arr.store_path.store, f"{arr.path}/"
    coords_of = _chunk_coords(arr)
    async for key in store.list_prefix(prefix):
        coords = coords_of(key[len(prefix) :])
        if coords is not None:
            yield coords, key


def _covers(sel: Any, shape: tuple[int, ...], chunks: tuple[int, ...]):
    """A test of chunk coordinates: does selection ``sel`` (ints, slices, integer arrays, one per
    dimension at most, or None: everything) read that chunk?"""
    if sel is None or sel is Ellipsis:
        return lambda coords: True
    sel = sel if isinstance(sel, tuple) else (sel,)
    if any(s is Ellipsis for s in sel):
        return lambda coords: True
    tests: list[Any] = []
    for s, n, c in zip(sel, shape, chunks):
        if isinstance(s, (int, np.integer)):
            i = int(s) + n if s < 0 else int(s)
            tests.append({i // c})
        elif isinstance(s, slice):
            picked = range(*s.indices(n))
            tests.append(set() if not picked else
                         range(min(picked[0], picked[-1]) // c, max(picked[0], picked[-1]) // c + 1))  # fmt: skip
        else:
            values = np.asarray(s)
            if values.dtype == bool:
                values = np.flatnonzero(values)
            tests.append(set((np.where(values < 0, values + n, values) // c).tolist()))
    return lambda coords: all(k in t for k, t in zip(coords, tests))


class _Checker:
    """Checks stored chunks of one array: their checksum where the array has one, else whether
    they decode (an array the direct path reads; None: nothing to check them with)."""

    def __init__(self, arr):
        self.arr = arr
        self.checksum = has_checksum(arr)
        self.plain = None if self.checksum else _plain_chunks(arr)

    @property
    def able(self) -> bool:
        return self.checksum or self.plain is not None

    def check(self, coords: tuple[int, ...], data) -> CorruptChunkError | None:
        if self.checksum:
            return None if checksum_ok(data) else CorruptChunkError(self.arr.path, coords)
        assert self.plain is not None  # checked by the caller (able)
        try:
            decode_chunk(self.plain, coords, data)
        except CorruptChunkError as e:
            return e
        return None


async def _each_chunk(arr, wanted, handle, unreadable=None) -> None:
    """Fetch every stored chunk of ``arr`` that ``wanted(coords)`` accepts, at most
    READ_CONCURRENCY at once, and await ``handle(coords, key, data)`` on each as it arrives;
    stops listing more where one returns True. ``unreadable(coords, error)``, where given, is
    told of a chunk Icechunk cannot fetch (its object missing or damaged) instead of raising."""
    from icechunk import IcechunkError  # (here: a query's light path imports no icechunk)
    from zarr.buffer import default_buffer_prototype

    store, proto = arr.store_path.store, default_buffer_prototype()
    gate = asyncio.Semaphore(READ_CONCURRENCY)
    running: set[asyncio.Future] = set()
    stop = asyncio.Event()

    async def one(coords: tuple[int, ...], key: str) -> None:
        try:
            try:
                raw = await store.get(key, proto)
            except IcechunkError as e:
                if unreadable is None:
                    raise
                unreadable(coords, e)
                return
            if raw is not None and await handle(coords, key, raw.as_numpy_array()):
                stop.set()
        except Exception as e:  # the first one is raised once every fetch has ended
            errors.append(e)
            stop.set()
        finally:
            gate.release()

    errors: list[Exception] = []
    try:
        async for coords, key in _stored_chunks(arr):
            if stop.is_set():
                break
            if not wanted(coords):
                continue
            await gate.acquire()
            task = asyncio.ensure_future(one(coords, key))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:  # (the listing may fail too) no fetch outlives this
        if running:
            await asyncio.gather(*running)
    if errors:
        raise errors[0]


def first_corrupt_chunk(arr, sel: Any = None) -> CorruptChunkError | None:
    """The first chunk of zarr array ``arr`` that selection ``sel`` reads (every stored one where
    None) whose bytes fail their checksum (or, without one, do not decode), as an error to
    raise; None where every one passes."""

    checker = _Checker(arr)
    if not checker.able:
        return None
    wanted = _covers(sel, tuple(arr.shape), tuple(arr.chunks))
    found: list[CorruptChunkError] = []

    async def handle(coords, key, data) -> bool:
        bad = checker.check(coords, data)
        if bad is not None:
            found.append(bad)
        return bool(found)

    on_zarr_loop(_each_chunk(arr, wanted, handle))
    return min(found, key=lambda e: e.chunk) if found else None
