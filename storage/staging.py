"""An ingest's staging area: the new rows' keys between the hashing jobs and the index jobs, in
the store's own storage (so every Dask worker that can write the store reaches it, wherever it
runs) and outside the repository's objects (so none of it outlives the ingest).

A local store stages in a folder inside its own folder, an object store under a prefix inside
its own prefix (``<store>/.fairpipe-staging.<random>/``), a ``memory://`` store in this process's
memory. The area is removed when the ingest commits or fails; one left by a killed ingest is
found and removed by the next ingest of the store (which holds the store's writer lock, as only
an ingest making a staging area does).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.storage.urls import StorageSpec, object_store, s3_endpoint

STAGING_MARK = ".fairpipe-staging."  # <store>/<mark><random>: a folder, or an object prefix
NO_STAGING = (
    "The store {url} has no object store to stage an ingest's keys in: name its S3 endpoint "
    "with AWS_ENDPOINT_URL."
)
_MEMORY: dict[str, object] = {}  # memory:// stores' staging areas (obstore MemoryStores)


def stale_staging(local_dir: Path) -> list[Path]:
    """Staging folders of the local store ``local_dir`` (any there while its writer lock is held
    were left by a killed ingest: only an ingest holding the lock makes one): inside the store's
    folder, and beside it (``.<store><mark><random>``, where stores kept them before)."""
    inside = re.compile(re.escape(STAGING_MARK) + r"[a-z0-9_]+")
    beside = re.compile(re.escape(f".{local_dir.name}{STAGING_MARK}") + r"[a-z0-9_]+")
    found = []
    for folder, name in ((local_dir, inside), (local_dir.parent, beside)):
        if folder.is_dir():
            found += [p for p in folder.iterdir() if name.fullmatch(p.name) and p.is_dir()]
    return found


class Staging:
    """The keys of rows [base, n_total), one part per chunk job, transposed (L, rows) so that an
    index job reads each of its tables as one contiguous run of every part. In a local store,
    each part is a ``.npy`` file (memory-mapped when read); in an object store, one object of
    the raw little-endian keys, of which an index job fetches its tables' byte range only.

    Pickled to the workers with the jobs: an object store's area is reached with the endpoint
    the client opened the store with and the credentials of the worker's environment (as the
    store's own objects are)."""

    def __init__(self, spec: StorageSpec, base: int, n_total: int, url: str = ""):
        """Made by an ingest holding the store's writer lock, so the staging areas of earlier
        ingests of the same store, killed before they could remove their own (8 bytes a row and
        table: 8 GB at 10M rows and L = 100), are found and removed first: :attr:`swept` counts
        them."""
        self.base, self.n_total = base, n_total
        self.swept = 0
        self.path: Path | None = None
        self._spec, self._endpoint = spec, s3_endpoint()
        self._store: Any = None
        self._name = STAGING_MARK + uuid.uuid4().hex[:12]
        if spec.local_dir is not None:
            stale = stale_staging(spec.local_dir)
            for old in stale:
                shutil.rmtree(old, ignore_errors=True)
            self.swept = len(stale)
            self.path = Path(tempfile.mkdtemp(prefix=STAGING_MARK, dir=spec.local_dir))
            return
        if spec.scheme == "memory":
            from obstore.store import MemoryStore

            _MEMORY[self._name] = MemoryStore()
            return
        if self._objects() is None:
            raise FairpipeInputError(NO_STAGING.format(url=url or spec.scheme))
        self.swept = self._sweep()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_store": None}  # made again where it is used

    def _objects(self):
        """The obstore store of this area (None for a local folder)."""
        if self.path is not None:
            return None
        if self._store is None:
            if self._spec.scheme == "memory":
                self._store = _MEMORY[self._name]
            elif self._spec.scheme in ("r2", "tigris"):
                self._store = self._compatible()
            else:
                self._store = object_store(self._spec, self._name, endpoint=self._endpoint)
        return self._store

    def _compatible(self):
        """r2:// and tigris://: S3-compatible object stores."""
        from fairpipe.datasets import object_store as remote_store

        k = self._spec.kwargs
        prefix = "/".join(p for p in (k.get("prefix", ""), self._name) if p)
        try:
            return remote_store(self._spec.scheme, k["bucket"], prefix, endpoint=self._endpoint)
        except ValueError:
            return None

    def _sweep(self) -> int:
        """Remove every staging area under the store's prefix (this one has none yet)."""
        import obstore

        if self._spec.scheme in ("r2", "tigris"):
            return 0  # (their areas go with a failed transaction's clean-up only)
        root = object_store(self._spec, endpoint=self._endpoint)
        top = obstore.list_with_delimiter(root)["common_prefixes"]  # a prefix is a "folder"
        areas = [p for p in top if p.startswith(STAGING_MARK)]
        for area in areas:
            for batch in obstore.list(root, prefix=area):
                obstore.delete(root, [m["path"] for m in batch])
        return len(areas)

    def write(self, start: int, keys: np.ndarray) -> None:
        """The keys (L, rows), a table per row, of rows [start, start + rows)."""
        keys = np.ascontiguousarray(keys, dtype="<u8")
        if self.path is None:
            import obstore

            # An object is whole or absent: a dead job wrote nothing.
            obstore.put(self._objects(), f"{start:012d}", keys.data.cast("B"))
            return
        tmp = self.path / f".{start:012d}.{uuid.uuid4().hex[:6]}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, keys)
        tmp.rename(self.path / f"{start:012d}.npy")  # whole or absent: a dead job wrote nothing

    def read(self, t0: int, t1: int) -> np.ndarray:
        """Keys of tables [t0, t1) of every new row: (t1 - t0, rows), a table per row."""
        out = np.empty((t1 - t0, self.n_total - self.base), dtype=np.uint64)
        if self.path is None:
            starts = self._read_objects(out, t0, t1)
        else:
            files = sorted(self.path.glob("*.npy"))
            at = 0
            for path in files:
                part = np.load(path, mmap_mode="r")
                out[:, at : at + part.shape[1]] = part[t0:t1]
                at += part.shape[1]
            starts = [int(p.stem) for p in files] + [self.base + at]
        if not starts or starts[0] != self.base or starts[-1] != self.n_total:
            covered = starts[-1] - starts[0] if starts else 0
            raise RuntimeError(f"staged keys cover {covered} of {out.shape[1]} new rows "
                               f"({self.path or self._name})")  # fmt: skip
        return out

    def _read_objects(self, out: np.ndarray, t0: int, t1: int) -> list[int]:
        """Fill ``out`` from the area's objects: each one's bytes of tables [t0, t1). Returns
        the parts' first rows and the row after the last part's."""
        import obstore

        store = self._objects()
        parts = sorted((int(m["path"]), int(m["size"])) for batch in obstore.list(store)
                       for m in batch)  # fmt: skip
        starts = [start for start, _ in parts]
        ends = [*starts[1:], self.n_total]
        for (start, size), end in zip(parts, ends):
            rows = end - start
            if rows <= 0 or size % (8 * rows):
                return [*starts[: starts.index(start)], start]  # not the parts of these rows
            data = obstore.get_range(store, f"{start:012d}", start=t0 * rows * 8,
                                     end=t1 * rows * 8)  # fmt: skip
            block = np.frombuffer(memoryview(data), dtype="<u8").reshape(t1 - t0, rows)
            out[:, start - self.base : end - self.base] = block
        return [*starts, self.n_total] if parts else []

    def remove(self) -> None:
        """Remove the area and everything in it."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        if self._spec.scheme == "memory":
            _MEMORY.pop(self._name, None)
            return
        import obstore

        store = self._objects()
        for batch in obstore.list(store):
            obstore.delete(store, [m["path"] for m in batch])
