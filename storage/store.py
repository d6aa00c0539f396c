"""The fairpipe store: layout, reads and atomic write transactions over an Icechunk repository.

Layout (Zarr v3, one commit per flow run):

- ``points`` float32 (n, d), ``ids`` int64 (n,), ``groups`` int32 (n,), ``alive`` bool (n,), all
  chunked by rows (``chunk_rows``); group names and parameters in the root attributes;
- ``lsh/keys`` uint64 (n, L): each point's bucket key per table (row chunks);
- ``lsh/projections`` (d, L*k), ``lsh/offsets`` (L*k,), ``lsh/multipliers`` (k,): the hash functions;
- ``lsh/members`` int64 (L, n): per table, the rows sorted by key (padded with -1 past the alive
  rows); ``lsh/bucket_keys`` uint64 (L, n) and ``lsh/bucket_starts`` int64 (L, n + 1): per table its
  sorted distinct keys and where each bucket starts in ``members`` (padded); ``lsh/bucket_counts``
  int64 (L,): how many buckets each table has. One table per chunk row, so tables are written in
  parallel without sharing a chunk.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairpipe.bucket_index import BucketIndex
from fairpipe.errors import FairpipeInputError
from fairpipe.lsh import E2LSH
from storage.lock import StoreBusyError, WriterLock, lock_path_for
from storage.urls import make_storage, parse_store_url

FORMAT = 1
TXN_PREFIX = "fairpipe-txn-"
INTERNAL = "fairpipe_checkpoint"  # commit metadata key of a transaction's checkpoints
CHECKPOINT = "checkpoint before distributed writes"
NOT_A_STORE = "{url} is not a fairpipe store ({why}). Give an empty or new folder to create one."
NO_STORE = "There is no fairpipe store at {url}. Run 'fairpipe ingest SOURCE --store {url}' first."

__all__ = ["FairpipeStore", "NotAStoreError", "StoreBusyError", "open_store", "Transaction"]


class NotAStoreError(FairpipeInputError):
    """The location exists but holds something other than a fairpipe store."""


def _zarr():
    import zarr

    return zarr


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

    @property
    def root(self):
        return _zarr().open_group(self.session.store, mode="a")

    def checkpoint(self, message: str) -> str:
        """Commit what is written so far to the private branch and continue in a new session."""
        snap = (
            self.session.commit(message, metadata={INTERNAL: True})
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


def write_rows(session, name: str, start: int, values: np.ndarray) -> None:
    """Write ``values`` at rows [start, start + len) of array ``name`` (a fork session is fine)."""
    arr = _zarr().open_array(session.store, path=name, mode="r+")
    arr[start : start + values.shape[0]] = values


def write_table_rows(session, name: str, first_table: int, values: np.ndarray) -> None:
    """Write whole table rows [first_table, first_table + len) of an (L, ...) index array."""
    arr = _zarr().open_array(session.store, path=name, mode="r+")
    arr[first_table : first_table + values.shape[0]] = values


def read_array(session, name: str, sel=slice(None)) -> np.ndarray:
    return np.asarray(_zarr().open_array(session.store, path=name, mode="r")[sel])


class FairpipeStore:
    """A fairpipe dataset in an Icechunk repository (local folder or object store URL)."""

    def __init__(self, url: str, repo, spec):
        self.url = url
        self.repo = repo
        self.spec = spec

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, create: bool = False) -> FairpipeStore:
        import icechunk

        url = str(url)
        spec = parse_store_url(url)
        if spec.local_dir is not None and spec.local_dir.exists():
            if not spec.local_dir.is_dir():
                raise NotAStoreError(NOT_A_STORE.format(url=url, why="it is a file"))
        storage = make_storage(url, spec)
        exists = icechunk.Repository.exists(storage)
        if not exists:
            if spec.local_dir is not None and spec.local_dir.exists():
                entries = [p.name for p in spec.local_dir.iterdir() if p.name != ".fairpipe.lock"]
                if entries:
                    why = f"the folder holds {', '.join(sorted(entries)[:3])}"
                    raise NotAStoreError(NOT_A_STORE.format(url=url, why=why))
            if not create:
                raise FairpipeInputError(NO_STORE.format(url=url))
            repo = icechunk.Repository.create(storage)
            # Mark the repository as ours at once, so an empty store reopens as a fairpipe store.
            session = repo.writable_session("main")
            root = _zarr().open_group(session.store, mode="a")
            root.attrs["fairpipe_format"] = FORMAT
            session.commit("create fairpipe store")
        else:
            repo = icechunk.Repository.open(storage)
        store = cls(url, repo, spec)
        if exists:
            attrs = store.attrs()
            if attrs.get("fairpipe_format") is None and (attrs or not create):
                raise NotAStoreError(
                    NOT_A_STORE.format(url=url, why="an Icechunk repository without fairpipe data")
                )
        return store

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
        if snapshot_id is not None:
            return self.repo.readonly_session(snapshot_id=snapshot_id)
        return self.repo.readonly_session(branch="main")

    def attrs(self, session=None) -> dict:
        session = session or self.readonly_session()
        try:
            group = _zarr().open_group(session.store, mode="r")
        except Exception:  # an empty repository has no root group yet
            return {}
        return dict(group.attrs)

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
        ``main``."""
        return [
            {
                "id": s.id,
                "message": s.message,
                "time": s.written_at.isoformat(),
                # Stores written before the metadata existed: the checkpoint's fixed message.
                "internal": bool((s.metadata or {}).get(INTERNAL)) or s.message == CHECKPOINT,
            }
            for s in self.repo.ancestry(branch="main")
        ]

    def read(self, name: str, sel=slice(None), session=None) -> np.ndarray:
        return read_array(session or self.readonly_session(), name, sel)

    def load_lsh(self, session=None) -> E2LSH:
        session = session or self.readonly_session()
        lsh_attrs = self.attrs(session)["lsh"]
        lsh = E2LSH(
            k=lsh_attrs["k"],
            n_tables=lsh_attrs["n_tables"],
            width=lsh_attrs["width"],
            seed=lsh_attrs["seed"],
        )
        return lsh.set_params_arrays(
            read_array(session, "lsh/projections"),
            read_array(session, "lsh/offsets"),
            read_array(session, "lsh/multipliers"),
        )

    def load_index(self, session=None) -> BucketIndex:
        session = session or self.readonly_session()
        counts = read_array(session, "lsh/bucket_counts")
        n_alive = int(self.attrs(session)["n_alive"])
        keys = read_array(session, "lsh/bucket_keys")
        starts = read_array(session, "lsh/bucket_starts")
        members = read_array(session, "lsh/members")
        tables = [
            (keys[t, : counts[t]], starts[t, : counts[t] + 1], members[t, :n_alive])
            for t in range(counts.shape[0])
        ]
        return BucketIndex.from_tables(tables)

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, message: str, lock_timeout: float = 0.0):
        """Hold the writer lock and yield a :class:`Transaction`; publish it on success.

        An exception inside the block (or a crash) leaves ``main`` at its last commit. The new
        ``main`` snapshot id is ``txn.commit_id`` afterwards.
        """
        with WriterLock(lock_path_for(self.url, self.spec.local_dir), self.url, lock_timeout):
            for stale in self.repo.list_branches():
                if stale.startswith(TXN_PREFIX):  # left by a crashed writer; we hold the lock
                    self.repo.delete_branch(stale)
            base = self.repo.lookup_branch("main")
            branch = f"{TXN_PREFIX}{uuid.uuid4().hex[:12]}"
            self.repo.create_branch(branch, base)
            txn = Transaction(self, branch, self.repo.writable_session(branch), base)
            try:
                yield txn
                if not txn.session.has_uncommitted_changes:  # nothing written: nothing to publish
                    txn.commit_id = base  # type: ignore[attr-defined]
                    return
                tip = txn.session.commit(message)
                self.repo.reset_branch("main", tip, from_snapshot_id=base)
                txn.commit_id = tip  # type: ignore[attr-defined]
            finally:
                with contextlib.suppress(Exception):
                    self.repo.delete_branch(branch)

    def purge_history(self, lock_timeout: float = 0.0) -> dict:
        """Drop every snapshot before ``main``'s tip and delete the objects only they used.

        Forgetting is complete only when no snapshot still holds the erased rows: a forget
        commit rewrites the chunks holding them, but earlier snapshots keep the old chunks for
        time travel. This expires every snapshot older than the tip (history becomes the
        repository's empty first snapshot, then the tip) and garbage-collects every object no
        retained snapshot reaches. Chunks the tip still uses are never touched. Holds the writer
        lock; readers with a session on an expired snapshot may fail afterwards.
        """
        with WriterLock(lock_path_for(self.url, self.spec.local_dir), self.url, lock_timeout):
            tip = self.repo.lookup_snapshot(self.repo.lookup_branch("main"))
            before = len(self.history())
            self.repo.expire_snapshots(
                tip.written_at, delete_expired_branches=True, delete_expired_tags=True
            )
            gc = self.repo.garbage_collect(tip.written_at)
            return {
                "snapshots_before": before,
                "snapshots_after": len(self.history()),
                "snapshots_deleted": int(gc.snapshots_deleted),
                "chunks_deleted": int(gc.chunks_deleted),
                "bytes_deleted": int(gc.bytes_deleted),
            }


def open_store(url: str, create: bool = False) -> FairpipeStore:
    return FairpipeStore.open(url, create=create)
