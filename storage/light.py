"""A read-only view of a committed local store that needs neither zarr nor icechunk's Python
package: the cold query's read path.

Importing ``icechunk`` imports zarr (its store subclasses zarr's), 0.15 s of a cold one-query
``fairpipe sample`` of about 0.6 s. This view loads only icechunk's compiled module (3 ms), reads
each array's ``zarr.json`` itself and fetches whole chunks through the compiled store, decoding
them as :class:`fairpipe.storage.chunks._PlainChunks` does (raw little-endian bytes, then at most Blosc
or Zstd: numcodecs, 0.03 s; each chunk's crc32c checksum verified first, a
:class:`~fairpipe.storage.damage.CorruptChunkError` where it fails). :func:`fairpipe.storage.arrays.open_array`, :func:`~fairpipe.storage.arrays.read_many`,
:func:`~fairpipe.storage.arrays.read_arrays` and :func:`~fairpipe.storage.arrays.for_rows_at` accept a
:class:`LightSession` where they accept an Icechunk session, so the reader's code is the same on
both paths and reads the same bytes.

:func:`open_light` gives a view only where everything a query reads can be read this way (a
local folder holding a fairpipe store whose arrays are all plainly encoded, and the compiled
module loadable); otherwise None, and the caller opens the store the ordinary way (which also
gives the errors for anything that is not a store). Nothing here writes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fairpipe.storage.chunks import _fetch_many, _PlainChunks
from fairpipe.storage.manifests import check_groups, expect
from fairpipe.storage.names import current_names

NATIVE = "icechunk._icechunk_python"
# The arrays of a store a query may read (each must be plainly encoded for the light path).
# (With the arrays of the index's delta layers, :func:`delta_arrays`.)
QUERY_ARRAYS = ("ids", "id_ranges", "alive", "points", "sketch", "sketch_residual", "lsh/projections",
                "lsh/offsets", "lsh/multipliers", "lsh/segments", "lsh/segment_lengths",
                "lsh/bucket_counts")  # fmt: skip


def delta_arrays(attrs: dict) -> list[str]:
    """The arrays of the index's delta layers of a store with these root attributes."""
    from fairpipe.storage.layers import deltas_of, layer_arrays

    if not isinstance(attrs.get("lsh"), dict):
        return []
    return [f"lsh/{a}" for name, _, _ in deltas_of(attrs) for a in layer_arrays(name)]


def native_icechunk():
    """icechunk's compiled module, loaded without running the ``icechunk`` package (the one
    already loaded, if any: a compiled module may be initialised once per process). Registered
    under its own name, so a later ``import icechunk`` uses it. None if it cannot be loaded."""
    loaded = sys.modules.get(NATIVE)
    if loaded is not None:
        return loaded
    try:
        package = importlib.util.find_spec("icechunk")  # finds, does not import
        folders = list(package.submodule_search_locations or []) if package else []
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        found = [p for folder in folders for p in Path(folder).glob("_icechunk_python*")
                 if p.name.endswith(suffixes)]  # fmt: skip
        if not found:
            return None
        spec = importlib.util.spec_from_file_location(NATIVE, found[0])
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[NATIVE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(NATIVE, None)
            raise
        module.initialize_logs()  # as the package does on import (ICECHUNK_LOG)
        return module
    except Exception:  # an icechunk laid out differently: the ordinary path
        return None


def run(make_coroutine):
    """Run ``make_coroutine()`` to completion on an event loop of its own (about 0.1 ms), on
    this thread, or on a helper thread where an event loop is already running here (a
    notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(make_coroutine())
        finally:
            loop.close()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make_coroutine())).result()


class LightArray:
    """An array's metadata from its ``zarr.json`` (shape, chunks, dtype, fill value, codecs) and
    the reads the store's helpers make of it."""

    is_light = True

    def __init__(self, session: LightSession, path: str, meta: dict, plain: _PlainChunks):
        self.session, self.path, self.plain = session, path, plain
        self.shape = tuple(int(n) for n in meta["shape"])
        self.chunks = plain.shape
        self.dtype = plain.dtype
        self.fill_value = plain.fill
        self.ndim = len(self.shape)
        self.attrs = dict(meta.get("attributes") or {})
        self.size = int(np.prod(self.shape, dtype=np.int64))

    def __getitem__(self, sel) -> np.ndarray:
        """A basic selection (ints and slices, one per dimension at most), from the chunks it
        covers."""
        import itertools

        sel = sel if isinstance(sel, tuple) else (sel,)
        if any(s is Ellipsis for s in sel):
            if sel != (Ellipsis,):
                raise IndexError(f"{self.path}: only [...] may use an Ellipsis here.")
            sel = ()
        sel = sel + (slice(None),) * (self.ndim - len(sel))
        box: list[tuple[int, int]] = []
        local: list = []
        for s, n in zip(sel, self.shape):
            if isinstance(s, (int, np.integer)):
                i = int(s) + n if s < 0 else int(s)
                if not 0 <= i < n:
                    raise IndexError(f"{self.path}: index {int(s)} out of range for {n}.")
                box.append((i, i + 1))
                local.append(0)
            elif isinstance(s, slice):
                picked = range(*s.indices(n))
                if not picked:
                    box.append((0, 0))
                    local.append(slice(0, 0))
                    continue
                first, last = picked[0], picked[-1]
                lo = min(first, last)
                box.append((lo, max(first, last) + 1))
                stop = last - lo + picked.step
                local.append(slice(first - lo, stop if stop >= 0 else None, picked.step))
            else:
                raise IndexError(f"{self.path}: a selection of ints and slices is expected.")
        out = np.full([b - a for a, b in box], self.fill_value, dtype=self.dtype)
        ranges = [range(a // c, -(-b // c)) for (a, b), c in zip(box, self.chunks)]
        coords = list(itertools.product(*ranges)) if out.size else []

        def take(j: int, chunk: np.ndarray) -> None:
            place, inner = [], []
            for k, c, (a, b) in zip(coords[j], self.chunks, box):
                lo, hi = max(k * c, a), min((k + 1) * c, b)
                place.append(slice(lo - a, hi - a))
                inner.append(slice(lo - k * c, hi - k * c))
            out[tuple(place)] = chunk[tuple(inner)]

        _fetch_many(self.session, [(self.plain, c) for c in coords], take)
        return out[tuple(local)]

    def get_orthogonal_selection(self, sel) -> np.ndarray:
        raise NotImplementedError(f"{self.path}: the light read path reads whole rows only.")


class LightSession:
    """A committed snapshot of a local store, read through icechunk's compiled store only."""

    is_light = True

    def __init__(self, native_session):
        self._native = native_session
        self.store = native_session.store
        self.snapshot_id = native_session.snapshot_id
        self._arrays: dict[str, LightArray] = {}

    run = staticmethod(run)

    async def get_bytes(self, key: str) -> memoryview | None:
        """The stored bytes at ``key``, None where there are none."""
        try:
            return memoryview(await self.store.get(key))
        except KeyError:
            return None

    def coordinate_batches(self, array_path: str, batch_size: int = 1000):
        """The coordinates of every chunk array ``array_path`` (``/points``) lists, in batches
        (lists of lists): what ``icechunk.Session.chunk_coordinates`` gives one by one, and
        :mod:`fairpipe.storage.manifests` checks against the snapshot's record."""
        return self._native.chunk_coordinates(array_path, batch_size)

    def json(self, *keys: str) -> list[dict | None]:
        """The JSON documents at ``keys`` (None where there is none), fetched together."""

        async def get():
            return await asyncio.gather(*(self.get_bytes(key) for key in keys))

        return [None if raw is None else json.loads(bytes(raw)) for raw in run(get)]

    def attrs(self) -> dict:
        meta = self.json("zarr.json")[0]
        return dict(meta.get("attributes", {})) if meta else {}

    def load(self, names) -> dict:
        """The root attributes, and every array of ``names`` the store has opened (one round
        trip for their metadata; raises ValueError for one not plainly encoded)."""
        root, *metas = self.json("zarr.json", *(f"{name}/zarr.json" for name in names))
        for name, meta in zip(names, metas):
            if meta is not None and meta.get("node_type") == "array":
                self._take(name, meta)
        return dict(root.get("attributes", {})) if root else {}

    def _take(self, name: str, meta: dict) -> LightArray:
        plain = plain_chunks(name, meta)
        if plain is None:
            raise ValueError(f"{name} is not plainly encoded")
        self._arrays[name] = LightArray(self, name, meta, plain)
        return self._arrays[name]

    def array(self, name: str) -> LightArray:
        """The array ``name`` (KeyError if there is none, ValueError if it is not plainly
        encoded)."""
        if name not in self._arrays:
            meta = self.json(f"{name}/zarr.json")[0]
            if meta is None or meta.get("node_type") != "array":
                raise KeyError(f"no array {name}")
            return self._take(name, meta)
        return self._arrays[name]


def chunk_key_encoder(meta: dict):
    """The array's chunk key (below its path) of chunk coordinates, by its encoding."""
    encoding = meta.get("chunk_key_encoding") or {"name": "default"}
    config = encoding.get("configuration") or {}
    if encoding.get("name") == "default":
        sep = config.get("separator", "/")
        return lambda c: sep.join(["c", *map(str, c)])
    if encoding.get("name") == "v2":
        sep = config.get("separator", ".")
        return lambda c: sep.join(map(str, c)) if c else "0"
    return None


def plain_chunks(path: str, meta: dict) -> _PlainChunks | None:
    """The decoding of an array's chunks from its ``zarr.json``, for the codecs
    :func:`fairpipe.storage.chunks._plain_chunks` reads (little-endian bytes, then Blosc or Zstd, then a
    crc32c checksum); None for anything else."""
    if meta.get("zarr_format") != 3 or meta.get("storage_transformers"):
        return None
    grid = meta.get("chunk_grid") or {}
    encode_key = chunk_key_encoder(meta)
    codecs = meta.get("codecs") or []
    if grid.get("name") != "regular" or encode_key is None or not codecs:
        return None
    try:
        dtype = np.dtype(meta["data_type"])
    except TypeError:
        return None
    if dtype.kind not in "biuf":
        return None
    first, rest = codecs[0], list(codecs[1:])
    endian = (first.get("configuration") or {}).get("endian", "little")
    if first.get("name") != "bytes" or (dtype.itemsize > 1 and endian != "little"):
        return None
    checksum = bool(rest) and rest[-1].get("name") == "crc32c"
    if checksum:
        rest.pop()
    decoders: list[Any] = []
    for codec in rest:
        if codec.get("name") == "blosc":
            from numcodecs import blosc

            decoders.append(blosc.decompress)
        elif codec.get("name") == "zstd":
            from numcodecs import Zstd

            decoders.append(Zstd().decode)
        else:
            return None
    fill = meta.get("fill_value", 0)
    if isinstance(fill, str):  # "NaN", "Infinity", "-Infinity" (hex-encoded floats: no)
        if fill not in ("NaN", "Infinity", "-Infinity"):
            return None
        fill = float(fill.replace("Infinity", "inf"))
    shape = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
    return _PlainChunks(path=path, encode_key=encode_key, shape=shape, dtype=dtype,
                        fill=dtype.type(fill), decoders=tuple(reversed(decoders)),
                        checksum=checksum)  # fmt: skip


def open_light(local_dir: Path, snapshot: str | None = None) -> tuple[LightSession, dict] | None:
    """(a light view of the local store at ``local_dir`` at ``snapshot`` (default the tip of
    ``main``), its root attributes), or None where the ordinary path must open it: no compiled
    module, no Icechunk repository or no fairpipe data there, or an array a query reads that is
    not plainly encoded."""
    native = native_icechunk()
    if native is None or not (local_dir / "refs").is_dir():
        return None
    try:
        repo = native.PyRepository.open(native.Storage.new_local_filesystem(str(local_dir)))
        if snapshot is None:
            session = LightSession(repo.readonly_session(branch="main"))
        else:
            session = LightSession(repo.readonly_session(snapshot_id=snapshot))
        expect(repo, session.snapshot_id)  # its arrays are checked as they are opened
        check_groups(session)  # and every node's metadata (the root's attributes) now
        # arrays a store lacks (no sketch) are never read; older attribute names read as current
        attrs = current_names(session.load(QUERY_ARRAYS))
        if attrs.get("fairpipe_format") is None or not attrs.get("n"):
            return None
        if delta_arrays(attrs):  # a second round trip, for the deltas' arrays
            session.load(delta_arrays(attrs))
        return session, attrs
    except Exception:  # anything unexpected (damage too): the ordinary path opens it and names it
        return None
