"""Persistence: one dataset = one Icechunk repository of Zarr v3 arrays (``store``), its rows
(``rows``) and LSH index (``layers``, ``segments``, ``index``), its clustering model (``models``)
and fair summary (``summary``), the writer lock (``lock``) and store URLs (``urls``).

:func:`open_store` opens a store to write it (a :class:`FairpipeStore`); :func:`open_reader`
opens a committed store to query it (a :class:`~fairpipe.storage.reader.StoreReader`: lazy, cached reads,
served on first use so that importing ``storage`` does not load the samplers' kernels)."""

import os

# Icechunk logs a warning on every local repository open; our writer lock is what makes the
# single-committer rule hold, so keep its log quiet unless the user asks for it.
os.environ.setdefault("ICECHUNK_LOG", "error")

from typing import TYPE_CHECKING, Any  # noqa: E402

from fairpipe.storage.lock import StoreBusyError  # noqa: E402
from fairpipe.storage.store import FairpipeStore, NotAStoreError, open_store  # noqa: E402

if TYPE_CHECKING:
    from fairpipe.storage.reader import StoreReader, open_reader

_ON_FIRST_USE = {"open_reader": "fairpipe.storage.reader", "StoreReader": "fairpipe.storage.reader"}

__all__ = [
    "FairpipeStore", "NotAStoreError", "StoreBusyError", "StoreReader", "open_reader", "open_store",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'fairpipe.storage' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    globals()[name] = value
    return value
