"""Writes into a store's arrays by name: rows and blocks (whole chunks of a plainly encoded array
encoded and put straight into the store, the rest through zarr), whole chunks, and rewrites of
only the chunks that hold given rows."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from fairpipe.storage.arrays import _check_rows, _chunk_runs, open_array, zarr_checked
from fairpipe.storage.chunks import _fetch_chunks, _plain_chunks, _PlainChunks, _put_chunks


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
