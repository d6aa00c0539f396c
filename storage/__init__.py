"""Persistence: one dataset = one Icechunk repository of Zarr v3 arrays (``store``), its rows and
LSH index (``index``), its clustering model (``models``) and fair summary (``summary``), the
writer lock (``lock``) and store URLs (``urls``)."""

import os

# Icechunk logs a warning on every local repository open; our writer lock is what makes the
# single-committer rule hold, so keep its log quiet unless the user asks for it.
os.environ.setdefault("ICECHUNK_LOG", "error")

from storage.store import FairpipeStore, NotAStoreError, StoreBusyError, open_store  # noqa: E402

__all__ = ["FairpipeStore", "NotAStoreError", "StoreBusyError", "open_store"]
