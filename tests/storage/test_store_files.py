"""What a store leaves on disk: one creator of a new store among many, nothing made by a command
that finds no store, no transaction refs after commits, no objects of a failed write."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from fairpipe.storage.arrays import open_group, read_array
from fairpipe.storage.lock import StoreBusyError
from fairpipe.storage.store import FairpipeStore


def files_under(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` (relative path: size), the lock's holder note aside."""
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.name != ".fairpipe.lock"
    }


def write_points(txn, values: np.ndarray) -> None:
    root = txn.root
    if "points" not in root:
        root.create_array("points", shape=values.shape, chunks=(16, values.shape[1]),
                          dtype=values.dtype)  # fmt: skip
    root["points"][...] = values
    root.attrs["n"] = int(values.shape[0])


def create_and_fill(url: str, start_at: float, fail: bool) -> str:
    """One creator (a process of its own): make the store, write rows, commit; or fail after
    writing."""
    time.sleep(max(0.0, start_at - time.time()))  # every creator starts at the same moment
    try:
        with FairpipeStore.creating(url) as store:
            with store.transaction("fill") as txn:
                write_points(txn, np.full((64, 4), os.getpid(), dtype=np.float32))
                time.sleep(0.05)
                if fail:
                    raise RuntimeError("failed on purpose")
    except StoreBusyError as e:
        return f"busy: {e}"
    except RuntimeError:
        return "failed"
    return f"made by {os.getpid()}"


@pytest.fixture(scope="module")
def creators():
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        yield pool


@pytest.mark.parametrize("round_", range(4))
def test_of_concurrent_creators_exactly_one_makes_the_store_and_nothing_of_it_is_touched(
    creators, tmp_path, round_
):
    url = str(tmp_path / "a" / "b" / "store")
    start = time.time() + 0.3
    outcomes = creators.starmap(create_and_fill, [(url, start, False)] * 4)
    made = [o for o in outcomes if o.startswith("made")]
    assert len(made) == 1, outcomes
    busy = [o for o in outcomes if o.startswith("busy")]
    assert len(busy) == 3, outcomes
    assert all("being written by another process" in o or "created by another" in o for o in busy)
    store = FairpipeStore.open(url)  # one complete store, all of the winner's rows
    points = read_array(store.readonly_session(), "points")
    assert points.shape == (64, 4) and (points == int(made[0].split()[-1])).all()


def test_a_failed_creator_among_concurrent_ones_leaves_no_store(creators, tmp_path):
    url = str(tmp_path / "a" / "store")
    start = time.time() + 0.3
    outcomes = creators.starmap(create_and_fill, [(url, start, True)] * 3)
    assert outcomes.count("failed") == 1 and len(outcomes) == 3, outcomes
    assert files_under(tmp_path) == {}  # its repository is gone; any folder left is empty
    with pytest.raises(ValueError, match="There is no fairpipe store at"):
        FairpipeStore.open(url)


def test_a_creation_that_fails_removes_what_it_made_and_only_that(tmp_path):
    """The folders it made (not one more), its repository, its lock; a folder that was there
    stays."""
    (tmp_path / "kept").mkdir()
    url = tmp_path / "kept" / "x" / "y" / "store"
    with pytest.raises(RuntimeError):
        with FairpipeStore.creating(str(url)) as store:
            with store.transaction("fill") as txn:
                write_points(txn, np.ones((40, 3), np.float32))
            raise RuntimeError("after the commit, still inside the creation")
    assert sorted(os.listdir(tmp_path)) == ["kept"] and os.listdir(tmp_path / "kept") == []


def test_a_folder_holding_anything_is_not_made_a_store(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    with pytest.raises(StoreBusyError, match="created by another command"):
        with FairpipeStore.creating(str(tmp_path / "s")):
            pass
    assert os.listdir(tmp_path / "s") == ["notes.txt"]


@pytest.fixture
def store(tmp_path) -> FairpipeStore:
    st = FairpipeStore.open(str(tmp_path / "s"), create=True)
    with st.transaction("fill") as txn:
        write_points(txn, np.arange(64 * 4, dtype=np.float32).reshape(64, 4))
    return st


def test_opening_never_makes_a_folder(tmp_path):
    for url in (tmp_path / "a" / "b" / "c", tmp_path / "d"):
        with pytest.raises(ValueError, match="There is no fairpipe store at"):
            FairpipeStore.open(str(url))
        assert FairpipeStore.open_existing(str(url)) is None
    assert os.listdir(tmp_path) == []


def test_commits_leave_no_transaction_refs(store, tmp_path):
    """Icechunk's local storage keeps a deleted branch's empty folder (refs/branch.<name>); the
    store removes it. If Icechunk's layout changes, this fails: see FairpipeStore._delete_branch."""
    for k in range(3):
        with store.transaction(f"commit {k}") as txn:
            txn.root.attrs["k"] = k
            txn.checkpoint("a checkpoint on the private branch")
            txn.root.attrs["k2"] = k
    refs = tmp_path / "s" / "refs"
    assert refs.is_dir(), "Icechunk's local layout changed: no refs/ folder in the repository"
    assert sorted(os.listdir(refs)) == ["branch.main"], (
        "a transaction's branch left its ref folder behind: FairpipeStore._delete_branch no longer "
        "matches Icechunk's local layout"
    )


def test_a_failed_transaction_leaves_no_object_behind(store, tmp_path):
    """Chunks it wrote, checkpoints it committed on its private branch: all deleted before the
    error reaches the caller; the store reads as before."""
    folder = tmp_path / "s"
    before = files_under(folder)
    with pytest.raises(RuntimeError, match="disk full"):
        with store.transaction("doomed") as txn:
            write_points(txn, np.full((64, 4), 7.0, np.float32))
            txn.checkpoint("checkpoint")
            txn.root.create_array("more", shape=(100,), chunks=(10,), dtype="int64")[...] = 5
            raise RuntimeError("disk full")
    assert files_under(folder) == before
    points = read_array(store.readonly_session(), "points")
    assert points[0, 1] == 1.0 and points.shape == (64, 4)


def test_a_crashed_transactions_objects_are_removed_by_the_next_commit(store, tmp_path):
    """A writer killed mid-transaction leaves its branch and objects; the next transaction (it
    holds the lock, so no writer is working) deletes them."""
    folder = tmp_path / "s"
    before = files_under(folder)
    base = store.repo.lookup_branch("main")
    store.repo.create_branch("fairpipe-txn-crashed00001", base)
    s = store.repo.writable_session("fairpipe-txn-crashed00001")
    open_group(s, mode="a")["points"][...] = np.full((64, 4), 9.0, np.float32)
    s.commit("written by a writer that then died")
    assert len(files_under(folder)) > len(before)
    with store.transaction("next") as txn:
        txn.root.attrs["next"] = True
    after = files_under(folder)
    new = set(after) - set(before)
    # Only the new commit's own objects (its snapshot, manifest of attributes, transaction log).
    assert not any(name.startswith("chunks/") for name in new), new
    assert sorted(os.listdir(folder / "refs")) == ["branch.main"]
    assert store.repo.list_branches() == {"main"}


def test_a_folder_holding_only_a_lock_note_becomes_a_store(tmp_path):
    """A holder note left where no repository was made (a store removed by hand) is stale."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / ".fairpipe.lock").write_text('{"pid": 1}')
    store = FairpipeStore.open(str(tmp_path / "s"), create=True)
    assert store.attrs()["fairpipe_format"] and "n" not in store.attrs()


def test_a_creation_killed_before_its_first_commit_is_no_store_and_is_made_again(tmp_path):
    """SIGKILL between the repository's creation and its fairpipe mark leaves an Icechunk
    repository with only its first snapshot beside the lock note: no store, and the next
    creator (holding the lock) removes it and makes the store. A user's own repository with
    data, or without fairpipe's lock note, stays refused."""
    import icechunk

    killed = tmp_path / "killed"
    icechunk.Repository.create(icechunk.local_filesystem_storage(str(killed)))
    (killed / ".fairpipe.lock").write_text('{"pid": 1}')
    with pytest.raises(ValueError, match="There is no fairpipe store at"):
        FairpipeStore.open(str(killed))
    assert FairpipeStore.open_existing(str(killed)) is None
    with FairpipeStore.creating(str(killed)) as store:
        with store.transaction("fill") as txn:
            write_points(txn, np.ones((8, 2), np.float32))
    assert FairpipeStore.open(str(killed)).attrs()["fairpipe_format"]
    theirs = tmp_path / "theirs"
    icechunk.Repository.create(icechunk.local_filesystem_storage(str(theirs)))
    with pytest.raises(ValueError, match="an Icechunk repository without fairpipe data"):
        FairpipeStore.open(str(theirs))


def test_a_store_marked_between_two_reads_of_its_attributes_opens(tmp_path, monkeypatch):
    """A command opening a store that another is creating may read its attributes before the
    creator marks it (none yet) and look again after: it finds the store, not 'an Icechunk
    repository without fairpipe data'."""
    url = str(tmp_path / "s")
    with FairpipeStore.creating(url):
        pass
    reads: list[int] = []
    real = FairpipeStore.attrs

    def before_the_mark_then_after(self, session=None):
        reads.append(1)
        return {} if len(reads) == 1 else real(self, session)

    monkeypatch.setattr(FairpipeStore, "attrs", before_the_mark_then_after)
    assert FairpipeStore.open(url).url == url and len(reads) == 2
