"""A store's arrays by name: groups and arrays opened (their metadata and chunks checked against
what their commit recorded), arrays created with checksummed chunks, and arrays read whole, by
selections or by rows, straight from the store where their chunks are plainly encoded
(:mod:`fairpipe.storage.chunks`) and through zarr otherwise; lists kept as JSON arrays."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import numpy as np

from fairpipe.storage.chunk_checks import first_corrupt_chunk
from fairpipe.storage.chunks import (
    _fetch_chunks,
    _fetch_many,
    _is_light,
    _metadata_read,
    _plain_chunks,
    _PlainChunks,
    checksummed,
    on_zarr_loop,
    zarr_api,
)
from fairpipe.storage.manifests import check_array, check_groups


def open_group(session, mode: str = "r"):
    """The root group of a session's store (read: its groups' metadata checked against what
    their commit recorded, :mod:`fairpipe.storage.manifests`)."""
    if mode == "r":
        check_groups(session)
    with _metadata_read("the root group"):
        return zarr_api().open_group(session.store, mode=mode)


def open_array(session, name: str, mode: str = "r"):
    """Array ``name`` of a session's store (read: its metadata and its chunks as its manifest
    lists them checked against what their commit recorded, once per snapshot:
    :func:`fairpipe.storage.manifests.check_array`)."""
    if mode == "r":
        check_array(session, name)
    if _is_light(session):  # fairpipe.storage.light: read-only, without zarr
        return session.array(name)
    with _metadata_read(f"array '{name}'"):
        return zarr_api().open_array(session.store, path=name, mode=mode)


@contextlib.contextmanager
def zarr_checked(arr, sel: Any = None):
    """Around a read of zarr array ``arr`` through zarr's codec pipeline (or a write of part of a
    chunk, which reads it): zarr's own error for a chunk that fails its checksum or its decoders
    (a ValueError or RuntimeError naming no chunk) becomes a
    :class:`~fairpipe.storage.damage.CorruptChunkError` naming the first chunk selection ``sel`` reads
    (every chunk where None) that fails, if one does
    (:func:`fairpipe.storage.chunk_checks.first_corrupt_chunk`, which runs only once the read has
    failed)."""
    try:
        yield
    except (ValueError, RuntimeError) as e:
        if _is_light(arr):
            raise
        try:
            bad = first_corrupt_chunk(arr, sel)
        except Exception:  # the search failed too: zarr's error is the one to see
            bad = None
        if bad is None:
            raise
        raise bad from e


def create_array(root, name: str, *, compressors: Any = "auto", **kwargs):
    """``root.create_array(name, ...)`` with the chunks checksummed (:func:`checksummed`): how
    every array of a store is created."""
    return root.create_array(name, compressors=checksummed(compressors), **kwargs)


def set_shape(root, name: str, shape: tuple[int, ...]) -> None:
    """Set array ``name``'s shape, its metadata only: no chunk is read or deleted. Growing makes
    room for chunks about to be written; shrinking is for an array with no chunk outside the new
    shape (zarr's own resize lists every chunk of the old shape to delete those outside: for an
    array whose shape was room to write in, that list never ends)."""
    arr = open_array(root, name, mode="r+")
    if tuple(arr.shape) != tuple(shape):
        on_zarr_loop(arr.async_array.resize(tuple(shape), delete_outside_chunks=False))


def replace_array(root, name: str, values: np.ndarray) -> None:
    """Write ``values`` as array ``name`` of an open group, replacing any array there."""
    if name in root:
        del root[name]
    arr = create_array(root, name, shape=values.shape, dtype=values.dtype)
    if values.size:
        arr[...] = values


def read_array(session, name: str, sel=slice(None)) -> np.ndarray:
    arr = open_array(session, name)
    with zarr_checked(arr, sel):
        return np.asarray(arr[sel])


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


def read_json_array(session, name: str) -> list:
    """The list kept as the UTF-8 JSON bytes of the uint8 array ``name`` (the receipts, the
    lineage log); [] where the store has none."""
    if name not in open_group(session):
        return []
    return json.loads(read_array(session, name).tobytes().decode())


def write_json_array(root, name: str, values: list) -> None:
    """Keep ``values`` as the UTF-8 JSON bytes of the uint8 array ``name`` of an open group."""
    replace_array(root, name, np.frombuffer(json.dumps(values).encode(), dtype=np.uint8))
