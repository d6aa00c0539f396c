"""Every commit records what it wrote (fairpipe.storage.manifests), and what is damaged is named: a chunk
reference a manifest no longer lists, a manifest or snapshot Icechunk cannot read, a snapshot
that is not what its commit recorded. Never a different answer, never a bug report.

The stores here are made without Prefect: a transaction writing a few arrays. A manifest that
decodes yet lists one chunk fewer is made by Icechunk itself: a copy of the store commits the
chunk's deletion, and its new manifest's bytes replace the original manifest's file
(:func:`drop_chunk_reference`); ``Repository.inspect_snapshot`` names an array's manifest.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import icechunk
import numpy as np
import pytest

import fairpipe.storage.manifests as manifests
from fairpipe.storage.arrays import create_array, read_array
from fairpipe.storage.chunks import on_zarr_loop
from fairpipe.storage.damage import (
    DamagedMetadataError,
    DamagedStoreError,
    damaged_store_error,
    icechunk_damage,
)
from fairpipe.storage.integrity import verify_store
from fairpipe.storage.manifests import (
    FIRST_SNAPSHOT,
    RECORD_KEY,
    array_problem,
    lineage_problem,
)
from fairpipe.storage.snapshot_checks import check_snapshot, history_problem
from fairpipe.storage.store import FairpipeStore

FORMAT1 = Path(__file__).resolve().parents[1] / "data" / "format1"
MANIFEST_REPORT = (
    "Icechunk's report of a {what} no longer reads as damage (fairpipe.storage.damage.icechunk_damage "
    "needs its new wording): {text}"
)


def make_store(path: Path) -> FairpipeStore:
    """A store of two commits: ``points`` (5 chunks), ``ids`` (5), ``model/centroids`` (1) in a
    group with attributes; then ``ids`` rewritten in part, ``model`` dropped for ``summary``."""
    with FairpipeStore.creating(str(path)) as st, st.transaction("write") as txn:
        root = txn.root
        root.attrs["n"] = 100
        points = create_array(root, "points", shape=(100, 4), chunks=(20, 4), dtype="float32")
        points[...] = np.arange(400, dtype=np.float32).reshape(100, 4)
        create_array(root, "ids", shape=(100,), chunks=(20,), dtype="int64")[...] = np.arange(100)
        group = root.create_group("model")
        group.attrs["k"] = 3
        create_array(group, "centroids", shape=(3, 4), chunks=(3, 4), dtype="float64")[...] = 1.0
    st = FairpipeStore.open(str(path))
    with st.transaction("change") as txn:
        root = txn.root
        root["ids"][20:40] = np.arange(20) + 1000
        del root["model"]
        create_array(root.create_group("summary"), "ids", shape=(6,), chunks=(6,),
                     dtype="int64")[...] = np.arange(6)  # fmt: skip
    return FairpipeStore.open(str(path))


@pytest.fixture(autouse=True)
def _fresh_records():
    """Each test reads its stores as a new process would (the records a process noted stay with
    their snapshot ids, and these tests make copies that share them)."""
    manifests._EXPECTED.clear()
    yield
    manifests._EXPECTED.clear()


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("manifests") / "s").spec.local_dir


def copy(sound: Path, where: Path) -> Path:
    shutil.copytree(sound, where)
    return where


def repository(path: Path) -> icechunk.Repository:
    return icechunk.Repository.open(icechunk.local_filesystem_storage(str(path)))


def manifest_file(path: Path, array: str) -> Path:
    """The file of the manifest that lists the chunks of ``array`` at the tip of ``main``."""
    repo = repository(path)
    nodes = json.loads(repo.inspect_snapshot(repo.lookup_branch("main"), pretty=False))["nodes"]
    (ref,) = next(n for n in nodes if n["path"] == f"/{array}")["manifest_refs"]
    return path / "manifests" / ref["id"]


def drop_chunk_reference(path: Path, array: str, key: str) -> None:
    """Make the manifest of ``array`` list every chunk but ``key`` (a manifest Icechunk wrote,
    which decodes), in place of the one the tip's commit wrote. An array of one chunk gets
    another array's manifest, which lists none of its chunks (as a manifest whose node id
    changed does)."""
    if coordinates(path, array) == [tuple(int(c) for c in key.split("/")[1:])]:
        repo = repository(path)
        nodes = json.loads(repo.inspect_snapshot(repo.lookup_branch("main"), pretty=False))
        other = next(n["path"] for n in nodes["nodes"]
                     if n.get("manifest_refs") and n["path"] != f"/{array}")  # fmt: skip
        manifest_file(path, array).write_bytes(manifest_file(path, other[1:]).read_bytes())
        return
    other = path.with_name(path.name + "-other")
    shutil.copytree(path, other)
    repo = repository(other)
    session = repo.writable_session("main")
    on_zarr_loop(session.store.delete(f"{array}/{key}"))
    session.commit("drop one chunk")
    manifest_file(path, array).write_bytes(manifest_file(other, array).read_bytes())
    shutil.rmtree(other)


def coordinates(path: Path, array: str) -> list:
    session = repository(path).readonly_session(branch="main")

    async def listed() -> list:
        return [c async for c in session.chunk_coordinates(f"/{array}")]

    return sorted(on_zarr_loop(listed()))


def test_every_commit_records_what_it_wrote_and_only_that(sound):
    st = FairpipeStore.open(str(sound))
    tip, parent = [s for s in st.repo.ancestry(branch="main")][:2]
    record, before = tip.metadata[RECORD_KEY], parent.metadata[RECORD_KEY]
    assert set(record["arrays"]) == {"points", "ids", "summary/ids"}
    assert set(record["groups"]) == {"", "summary"}
    assert record["arrays"]["points"] == before["arrays"]["points"]
    assert record["arrays"]["ids"] == before["arrays"]["ids"]  # the same chunks, other values
    assert record["chunks"] == 11 == sum(int(m.num_chunk_refs) for m in tip.manifests)
    assert record["parent"] == [parent.id, parent.written_at.isoformat()]
    # counts and digests only: nothing of the data, nothing that identifies a person
    text = json.dumps(record)
    assert len(text) < 1200 and "1000" not in text and "model" not in text
    check_snapshot(st, tip.id)  # every array listed again: what the record says
    assert st.history()[0]["metadata"] == {}  # the record is not shown as the commit's metadata


def test_a_chunk_reference_dropped_from_a_manifest_is_named_by_reads_verify_and_writes(
    sound, tmp_path
):
    path = copy(sound, tmp_path / "s")
    drop_chunk_reference(path, "points", "c/2/0")
    assert coordinates(path, "points") == [(0, 0), (1, 0), (3, 0), (4, 0)]  # it decodes
    st = FairpipeStore.open(str(path))
    tip = st.repo.lookup_branch("main")
    with pytest.raises(DamagedMetadataError) as err:
        st.read("points")  # rows 40-59 would read as zeros
    assert str(err.value).startswith(
        f"The manifest of array 'points' in the store {path} is damaged: it lists 4 chunks "
        f"where commit {tip} wrote 5. 'fairpipe verify --store {path}' lists the damage"
    )
    assert np.array_equal(read_array(st.readonly_session(), "ids", slice(0, 10)), np.arange(10))
    report = verify_store(st)  # both commits' snapshots use that manifest
    parent = st.repo.lookup_snapshot(tip).parent_id
    assert [(d["snapshot"], d["array"]) for d in report["damaged"]] == [
        (tip, "points"),
        (parent, "points"),
    ]
    with pytest.raises(DamagedStoreError, match="The manifest of array 'points'"):
        with st.transaction("never"):
            pytest.fail("a transaction started on top of damage")
    assert st.repo.lookup_branch("main") == tip


def test_a_manifest_icechunk_cannot_read_is_named(sound, tmp_path):
    path = copy(sound, tmp_path / "s")
    file = manifest_file(path, "points")
    file.write_bytes(file.read_bytes()[:60])  # truncated: its zstd frame ends early
    st = FairpipeStore.open(str(path))
    with pytest.raises(DamagedStoreError) as err:
        st.read("points")
    assert "The manifest of array 'points'" in str(err.value), MANIFEST_REPORT.format(
        what="truncated manifest", text=repr(err.value.__cause__)
    )
    assert "Icechunk cannot read it (" in str(err.value)
    report = verify_store(FairpipeStore.open(str(path)))
    assert {d["array"] for d in report["damaged"]} == {"points"}


def test_a_damaged_snapshot_is_named_current_or_ancestor(sound, tmp_path):
    for which in (0, 1):
        path = copy(sound, tmp_path / f"s{which}")
        snapshot = [s.id for s in repository(path).ancestry(branch="main")][which]
        file = path / "snapshots" / snapshot
        file.write_bytes(file.read_bytes()[:-40])
        if which == 0:  # the tip: the store cannot even be opened
            with pytest.raises(DamagedStoreError) as err:
                FairpipeStore.open(str(path))
            assert str(err.value).startswith(f"Snapshot {snapshot} in the store {path} is "
                                             "damaged: Icechunk cannot read it ("), (
                MANIFEST_REPORT.format(what="truncated snapshot", text=repr(err.value.__cause__))
            )  # fmt: skip
            continue
        st = FairpipeStore.open(str(path))  # the tip reads; its history does not
        with pytest.raises(DamagedMetadataError, match=f"Snapshot {snapshot} in the store"):
            st.history()
        report = verify_store(st)
        assert [d["snapshot"] for d in report["damaged"]] == [snapshot]


def test_environment_errors_are_not_damage():
    """A store that cannot be reached or read is not a damaged one (the environment's error
    keeps its exit code), even where the fetch it failed is a snapshot's or a manifest's. The
    reports are Icechunk 1.1's, as it words them (a real refused connection takes 30 s of the
    S3 client's retries)."""
    as_icechunk = type("IcechunkError", (Exception,), {})
    refused = as_icechunk(
        "  x error getting object metadata from object store dispatch failure\n  | context:\n"
        "  |    0: icechunk::repository::open\n  |-> dispatch failure\n  |-> io error\n"
        "  |-> client error (Connect)\n  |-> tcp connect error\n"
        "  `-> Connection refused (os error 111)"
    )
    denied = as_icechunk(
        "  x object store error Generic LocalFileSystem error\n  | context:\n"
        "  |    0: icechunk::asset_manager::fetch_manifest\n"
        "  `-> Permission denied (os error 13)"
    )
    forbidden = as_icechunk(
        "  x object store error Generic S3 error: Forbidden\n  | context:\n"
        "  |    0: icechunk::asset_manager::fetch_snapshot\n  `-> status: 403"
    )
    for error in (refused, denied, forbidden):
        assert icechunk_damage(error) is None and damaged_store_error(error) is None, str(error)
    assert icechunk_damage(ValueError("Data corruption detected")) is None  # not Icechunk's
    truncated = as_icechunk(
        "  x I/O error\n  | context:\n  |    0: icechunk::asset_manager::fetch_snapshot\n"
        "  |            with snapshot_id=1CECHNKREP0F1RSTCMT0\n  |-> I/O error\n"
        "  `-> incomplete frame"
    )
    found = damaged_store_error(RuntimeError("a flow failed").with_traceback(None))
    assert found is None
    found = icechunk_damage(truncated)
    assert (found.what, found.why) == ("Snapshot 1CECHNKREP0F1RSTCMT0",
                                       "Icechunk cannot read it (incomplete frame)")  # fmt: skip


def test_a_record_that_disagrees_names_what_differs(sound):
    st = FairpipeStore.open(str(sound))
    session = st.readonly_session()
    record = st.repo.lookup_snapshot(session.snapshot_id).metadata[RECORD_KEY]
    assert array_problem(session, "points", record) is None
    meta = {**record, "arrays": {**record["arrays"], "ids": [5, "0" * 16, "1" * 16]}}
    assert array_problem(session, "ids", meta)[0] == "The metadata of array 'ids'"
    moved = {**record, "arrays": {**record["arrays"], "ids": [*record["arrays"]["ids"]]}}
    moved["arrays"]["ids"][1] = "0" * 16
    assert array_problem(session, "ids", moved) == (
        "The manifest of array 'ids'",
        f"it lists other chunks than commit {session.snapshot_id} wrote",
    )
    # An array its commit did not write: absent, as recorded (zarr then says it is not there),
    # or there all the same (damage).
    assert array_problem(session, "nope", record) is None
    unrecorded = {**record, "arrays": {k: v for k, v in record["arrays"].items() if k != "ids"}}
    assert array_problem(session, "ids", unrecorded) == (
        "Array 'ids'",
        f"it is not among the arrays its commit {session.snapshot_id} wrote",
    )
    root = {**record, "groups": {**record["groups"], "": "0" * 16, "gone": "1" * 16}}
    assert manifests.group_problems(session, root) == [
        ("The metadata of the root group", f"it is not what commit {session.snapshot_id} wrote"),
        ("The metadata of group 'gone'",
         f"it is missing from snapshot {session.snapshot_id}, whose commit wrote it"),
    ]  # fmt: skip


def test_a_snapshot_that_names_itself_otherwise_or_lost_its_record_is_damaged():
    when = datetime(2026, 12, 7, tzinfo=UTC)

    def info(id, parent, metadata, message="m"):
        return SimpleNamespace(id=id, parent_id=parent, metadata=metadata, message=message,
                               written_at=when, manifests=[])  # fmt: skip

    first = info(*FIRST_SNAPSHOT[:1], None, FIRST_SNAPSHOT[2], FIRST_SNAPSHOT[1])
    assert lineage_problem(first, None) is None
    changed = info(FIRST_SNAPSHOT[0], None, {"__roov": True}, FIRST_SNAPSHOT[1])
    assert lineage_problem(changed, None)[1] == manifests.FIRST_DIFFERS
    recorded = info("B", "A", {RECORD_KEY: {"parent": ["A", when.isoformat()]}})
    parent = info("A", FIRST_SNAPSHOT[0], {RECORD_KEY: {}})
    assert lineage_problem(recorded, parent) is None
    later = SimpleNamespace(**{**vars(parent), "written_at": datetime(2026, 12, 8, tzinfo=UTC)})
    assert lineage_problem(recorded, later) == (
        "Snapshot A",
        manifests.OTHER_TIME.format(child="B"),
    )
    lost = info("C", "A", {"fairpipe_operation": "k"})  # fairpipe's commit, its record gone
    assert lineage_problem(lost, parent)[0] == "Snapshot C"
    assert lineage_problem(info("C", "A", {}), parent) is None  # a commit made without fairpipe
    assert history_problem([parent], "X") == ("Snapshot X", "it names itself A")


def test_icechunk_behaviours_the_record_relies_on(tmp_path):
    """If one of these fails after an upgrade of Icechunk, fairpipe.storage.manifests must change with it:
    a snapshot's manifests hold exactly the chunk references its arrays list (written again when
    an array changes, shrinks or is made again); a node's metadata reads back as the bytes
    written; the repository's first snapshot is the one FIRST_SNAPSHOT describes; a session
    that has not committed lists the chunks it wrote twice (fairpipe.storage.manifests lists each once)."""
    import zarr
    from zarr.buffer import default_buffer_prototype

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    session = repo.writable_session("main")
    root = zarr.open_group(session.store, mode="a")
    root.create_array("a", shape=(100,), chunks=(10,), dtype="i4")[:] = 1
    root.create_array("g/b", shape=(50,), chunks=(10,), dtype="i4")[:] = 2
    listed = on_zarr_loop(_listed(session, "/a"))
    assert sorted(listed) == sorted(2 * [(i,) for i in range(10)]) or sorted(listed) == [
        (i,) for i in range(10)
    ], f"Session.chunk_coordinates of an uncommitted session lists {sorted(listed)}"
    meta = on_zarr_loop(session.store.get("a/zarr.json", default_buffer_prototype())).to_bytes()
    steps = []
    steps.append(session.commit("write"))
    session = repo.writable_session("main")
    root = zarr.open_group(session.store, mode="a")
    root["a"].resize((35,))
    root["g/b"][0:10] = 0  # a chunk of the fill value: deleted
    steps.append(session.commit("shrink"))
    session = repo.writable_session("main")
    root = zarr.open_group(session.store, mode="a")
    del root["g"]
    root.create_array("g/b", shape=(20,), chunks=(10,), dtype="i4")[:] = 3
    steps.append(session.commit("again"))
    for snapshot in steps:
        info = repo.lookup_snapshot(snapshot)
        read = repo.readonly_session(snapshot_id=snapshot)
        listed = sum(len(set(on_zarr_loop(_listed(read, p)))) for p in ("/a", "/g/b"))
        refs = sum(m.num_chunk_refs for m in info.manifests)
        assert listed == refs, (
            f"Icechunk {icechunk.__version__}: snapshot '{info.message}' lists {listed} chunks "
            f"but its manifests hold {refs} references (fairpipe.storage.manifests.record_problem)"
        )
    read = repo.readonly_session(snapshot_id=steps[0])
    assert (
        on_zarr_loop(read.store.get("a/zarr.json", default_buffer_prototype())).to_bytes() == meta
    ), (
        "an array's zarr.json no longer reads back as written (fairpipe.storage.manifests digests it)"
    )
    first = list(repo.ancestry(snapshot_id=steps[0]))[-1]
    assert (first.id, first.message, first.metadata) == FIRST_SNAPSHOT, (
        f"the repository's first snapshot is now {(first.id, first.message, first.metadata)}"
    )


async def _listed(session, path: str) -> list:
    return [c async for c in session.chunk_coordinates(path)]


def test_a_store_written_before_records_reads_and_verifies(tmp_path):
    """A store without records (tests/data/format1) reads as before; verify counts its chunks
    against Icechunk's count only; its next commit starts its records."""
    path = tmp_path / "dc"
    shutil.copytree(FORMAT1 / "dc", path)
    st = FairpipeStore.open(str(path))
    report = verify_store(st)
    assert report["damaged"] == [] and report["unrecorded"] >= 1
    with st.transaction("one more") as txn:
        txn.root.attrs["note"] = 1
    tip = st.repo.lookup_snapshot(st.repo.lookup_branch("main"))
    assert RECORD_KEY in tip.metadata
    check_snapshot(FairpipeStore.open(str(path)), tip.id)
    assert verify_store(FairpipeStore.open(str(path)))["damaged"] == []
