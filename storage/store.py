"""The fairpipe store: a dataset's Icechunk repository opened, created, read, written in atomic
transactions (:mod:`fairpipe.storage.transaction`), and its history listed and purged.

One dataset is one Icechunk repository of Zarr v3 arrays, one commit per flow run. What lives in
it is described where it is written: the rows in :mod:`fairpipe.storage.rows`, the LSH index in
:mod:`fairpipe.storage.layers` and :mod:`fairpipe.storage.segments`, the clustering model in :mod:`fairpipe.storage.models`,
the fair summary in :mod:`fairpipe.storage.summary`. Its arrays are read by name in :mod:`fairpipe.storage.arrays`
and written in :mod:`fairpipe.storage.writes`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.storage.arrays import open_group, read_array
from fairpipe.storage.chunks import zarr_api
from fairpipe.storage.creation import abandoned_creation, make_folders
from fairpipe.storage.damage import (
    DamagedMetadataError,
    DamagedStoreError,
    is_panic,
    probe_snapshots,
    raise_damage,
)
from fairpipe.storage.lock import LOCK_NAME, StoreBusyError, WriterLock, lock_path_for
from fairpipe.storage.manifests import CREATED, RECORD_KEY, expect, snapshots_opened
from fairpipe.storage.names import current_names, upgrade_names
from fairpipe.storage.paths import NESTED, check_own_objects
from fairpipe.storage.snapshot_checks import ancestry, check_snapshot, history_problem
from fairpipe.storage.transaction import (
    CHECKPOINT,
    INTERNAL,
    TXN_PREFIX,
    Transaction,
    commit_recorded,
)
from fairpipe.storage.urls import (
    delete_objects,
    enclosing_repository_url,
    list_objects,
    make_storage,
    parse_store_url,
    probe_endpoint,
)

FORMAT = 2
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

__all__ = ["FairpipeStore", "NotAStoreError", "open_store"]


class NotAStoreError(FairpipeInputError):
    """The location exists but holds something other than a fairpipe store."""


def _check_empty_folder(url: str, local: Path | None) -> None:
    """A folder that holds no repository may become a store only if it is empty (or holds only
    a lock file)."""
    if local is None or not local.exists():
        return
    entries = [p.name for p in local.iterdir() if p.name != LOCK_NAME]
    if entries:
        why = f"the folder holds {', '.join(sorted(entries)[:3])}"
        raise NotAStoreError(NOT_A_STORE.format(url=url, why=why))


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
        if not attrs and local is not None and abandoned_creation(store.repo, local):
            # A creation killed before its first commit, or one at work that has not marked the
            # repository yet: no store yet (the next creator, under the writer lock, removes
            # what a killed one left; a creator at work holds the lock).
            if not create:
                raise FairpipeInputError(NO_STORE.format(url=url))
            with cls.creating(url) as store:
                return store
        if not attrs:  # a creator may have marked the repository since the first read
            attrs = store.attrs()
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
            made += make_folders(local) if local is not None else []
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
                    if abandoned_creation(icechunk.Repository.open(storage), local):
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
        checked against what its commit recorded (:func:`fairpipe.storage.manifests.expect`). Damage
        met opening it is a :class:`DamagedStoreError` naming this store."""

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

    def require_data(self) -> dict:
        attrs = self.attrs()
        if attrs.get("n", 0) == 0:
            raise FairpipeInputError(NO_STORE.format(url=self.url))
        return attrs

    def history(self) -> list[dict]:
        """``main``'s snapshots, newest first; ``internal`` marks a transaction's checkpoints
        (commits on its private branch before it was published), which no reader ever saw as
        ``main``. A snapshot that cannot be read, or is not what its commit recorded
        (:func:`fairpipe.storage.snapshot_checks.history_problem`), is a :class:`DamagedStoreError`."""

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
        :func:`fairpipe.storage.damage.icechunk_damage`) is raised as a :class:`DamagedStoreError`
        naming this store."""

        try:
            yield
        except DamagedStoreError as e:
            if e.store:
                raise
            raise e.with_store(self.url) from e
        except BaseException as e:
            if is_panic(e) and self.repo is not None:  # a damaged snapshot Icechunk panics on?
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
        against what its commit recorded first (:func:`fairpipe.storage.snapshot_checks.check_snapshot`):
        nothing is written on top of damage.
        """

        with self.writer_lock(lock_timeout):
            stale = [b for b in self.repo.list_branches() if b.startswith(TXN_PREFIX)]
            for name in stale:  # left by a crashed writer; we hold the lock
                self._delete_branch(name)
            if stale:  # its objects too: written, never published
                self._collect_garbage()
            base = self.repo.lookup_branch("main")
            if base != self._published:
                with (
                    self.named()
                ):  # nothing is written on top of damage (fairpipe.storage.manifests)
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
