"""Every chunk a store writes carries a crc32c checksum: a damaged chunk is an error naming it,
never a wrong answer.

One small store holds every kind of array (ingest, fit, summarize and a forget: rows, index,
model, summary, receipts). Chunks are damaged where they lie, in the files of the Icechunk
repository: Icechunk offers no public call from an array's chunk to the object holding it
(``Session.chunk_coordinates`` lists the chunks, ``Repository.inspect_snapshot`` the manifests
but not their chunk references), and a native chunk's object holds exactly the bytes the store
returns for its key. So the object of a chunk is the file under ``chunks/`` with those bytes; the
store is made with Icechunk's ``inline_chunk_threshold_bytes`` at 0, so that even a chunk of a
few bytes is such a file rather than a part of a manifest.
"""

from __future__ import annotations

import gc
import json
import pickle
import shutil
from pathlib import Path

import icechunk
import numpy as np
import pytest
from typer.testing import CliRunner
from zarr.buffer import default_buffer_prototype

from fairpipe.flows.cli import app
from fairpipe.flows.cli._runner import CORRUPT_STORE
from fairpipe.flows.fit import run_fit
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import FitOptions, IngestOptions, SummarizeOptions
from fairpipe.flows.summarize import run_summarize
from fairpipe.storage.arrays import open_array, read_array, read_arrays, read_many, read_rows_at
from fairpipe.storage.chunk_checks import has_checksum
from fairpipe.storage.chunks import on_zarr_loop
from fairpipe.storage.damage import CorruptChunkError, corrupt_chunk_error
from fairpipe.storage.integrity import add_checksums, store_arrays, verify_store
from fairpipe.storage.light import open_light, plain_chunks
from fairpipe.storage.store import FairpipeStore

THREADS = dict(n_workers=1, processes=False)
FORMAT1 = Path(__file__).resolve().parents[1] / "data" / "format1"
# The arrays of a store that has been ingested, fitted (DC tree of height 2), summarized and
# forgotten from; each must carry a checksum.
EXPECTED = {"points", "ids", "groups", "alive", "sketch", "sketch_residual", "id_ranges",
            "lsh/projections", "lsh/offsets", "lsh/multipliers", "lsh/segments",
            "lsh/segment_lengths", "lsh/bucket_counts", "tree/level_0/centroids",
            "tree/level_0/masses", "summary/ids", "summary/level_0/candidates",
            "receipts/json", "receipts/row_receipt", "lineage/json"}  # fmt: skip
runner = CliRunner()


def invoke(*args):
    # Garbage of earlier tests (an asyncio transport of a closed loop, whose finaliser reports
    # "Event loop is closed") is collected here, not while the runner captures stderr, whose
    # lines these tests count.
    gc.collect()
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def store(prefect_server, tmp_path_factory):
    """3000 gaussian rows in 6 chunks of 512 (d = 4), every kind of array, each chunk a file."""
    path = tmp_path_factory.mktemp("integrity") / "s"
    FairpipeStore.open(str(path), create=True)
    config = icechunk.RepositoryConfig(inline_chunk_threshold_bytes=0)
    icechunk.Repository.open(icechunk.local_filesystem_storage(str(path)), config).save_config()
    gaussian = {"n": 3000, "d": 4, "clusters": 4, "groups": 3}
    run_ingest("gaussian", str(path), IngestOptions(seed=1, n_hashes=3, n_tables=3,
                                                    chunk_rows=512, gaussian=gaussian), **THREADS)  # fmt: skip
    run_fit(
        str(path), FitOptions(n_clusters=3, fanout=3, height=2, max_iter=3, n_init=1), **THREADS
    )
    run_summarize(str(path), SummarizeOptions(k=6, lower=0.1, upper=0.6, fanout=3, height=2, eval_size=64),
                  **THREADS)  # fmt: skip
    ids = FairpipeStore.open(str(path)).read("ids")
    run_forget(str(path), ids[[5, 700]], **THREADS)
    return path


def stored_chunks(path) -> dict[tuple[str, tuple[int, ...]], bytes]:
    """(array, chunk coordinates) -> the chunk's stored bytes, for every chunk of the tip."""
    session = FairpipeStore.open(str(path)).readonly_session()
    proto, out = default_buffer_prototype(), {}
    for name, _ in store_arrays(session):

        async def each(name=name):
            async for coords in session.chunk_coordinates(f"/{name}"):
                key = f"{name}/c/" + "/".join(map(str, coords)) if coords else f"{name}/c"
                out[(name, coords)] = (await session.store.get(key, proto)).to_bytes()

        on_zarr_loop(each())
    return out


def damage(path, data: bytes, at: int | None = None, n: int = 64) -> list[tuple[Path, bytes]]:
    """Flip ``n`` bytes (from ``at``, default the middle) of every object under ``chunks/``
    holding exactly ``data``; returns what to restore."""
    hits = [p for p in sorted((Path(path) / "chunks").iterdir()) if p.read_bytes() == data]
    assert hits, "no object holds the chunk's bytes"
    n = min(n, len(data) - 4)  # inside the encoded bytes, before the checksum
    at = (len(data) - 4 - n) // 2 if at is None else at
    for p in hits:
        b = bytearray(data)
        b[at : at + n] = bytes(x ^ 0xFF for x in b[at : at + n])
        p.write_bytes(bytes(b))
    return [(p, data) for p in hits]


def restore(saved) -> None:
    for p, data in saved:
        p.write_bytes(data)


def test_every_array_a_store_writes_carries_a_checksum(store):
    arrays = dict(store_arrays(FairpipeStore.open(str(store)).readonly_session()))
    assert EXPECTED <= set(arrays)
    assert [name for name, arr in arrays.items() if not has_checksum(arr)] == []


def test_a_damaged_chunk_of_any_array_is_an_error_naming_it(store):
    """For each array: 64 bytes flipped in one of its chunk objects (the middle one) make every
    read of it fail with the chunk named (zarr's path and the direct one), and ``verify`` list
    exactly the chunks stored with those bytes; restored, all is clean again."""
    chunks = stored_chunks(store)
    st = FairpipeStore.open(str(store))
    names = sorted({name for name, _ in chunks})
    assert set(names) >= EXPECTED
    for name in names:
        mine = sorted(c for a, c in chunks if a == name)
        coords = mine[len(mine) // 2]
        data = chunks[(name, coords)]
        same = sorted(k for k, v in chunks.items() if v == data)  # all stored as this object
        saved = damage(store, data)
        try:
            report = verify_store(st)
            assert [(c["array"], tuple(c["chunk"])) for c in report["corrupt"]] == same, name
            assert report["n_corrupt"] == len(same) and report["chunks"] == len(chunks)
            # the chunk's region, through zarr's path and the direct one
            arr = open_array(st.readonly_session(), name)
            box = tuple(slice(k * c, min((k + 1) * c, n))
                        for k, c, n in zip(coords, arr.chunks, arr.shape))  # fmt: skip
            for read in (read_array, lambda s, n, b: read_many(s, n, [b])):
                with pytest.raises(CorruptChunkError) as err:
                    read(st.readonly_session(), name, box)
                assert (err.value.array, err.value.chunk) in same, name
                assert f"Chunk ({', '.join(map(str, err.value.chunk))}) of array '{name}'" in str(
                    err.value
                )
        finally:
            restore(saved)
    assert verify_store(st)["n_corrupt"] == 0


def test_verify_reports_damage_and_exits_4(store):
    chunks = stored_chunks(store)
    saved = damage(store, chunks[("ids", (1,))])
    try:
        out = invoke("verify", "--store", store)
        assert out.exit_code == CORRUPT_STORE == 4
        assert "corrupt: chunk (1) of array 'ids'" in out.stdout
        res = json.loads(invoke("verify", "--store", store, "--json").stdout)
        assert res["corrupt"] == [{"array": "ids", "chunk": [1], "why": res["corrupt"][0]["why"]}]
        assert res["arrays"] >= len(EXPECTED) and res["chunks"] == len(chunks)
        with pytest.raises(CorruptChunkError, match=f"of array 'ids' in the store {store} is"):
            FairpipeStore.open(str(store)).read("ids")
        # a read through zarr of a part of the array names the chunk it read
        with pytest.raises(CorruptChunkError, match=r"Chunk \(1\) of array 'ids'"):
            read_array(FairpipeStore.open(str(store)).readonly_session(), "ids", slice(600, 700))
        assert read_array(FairpipeStore.open(str(store)).readonly_session(), "ids",
                          slice(0, 512)).shape == (512,)  # fmt: skip
    finally:
        restore(saved)
    out = invoke("verify", "--store", store, "--json")
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["n_corrupt"] == 0 and res["unverifiable"] == [] and res["bytes"] > 0


@pytest.mark.parametrize(
    ("array", "command"),
    [
        ("sketch", ["sample", "--query-row", 2048]),
        # a radius at the distance of row 2048's nearest neighbour: the sketch cannot settle it
        ("sketch_residual", ["sample", "--query-row", 2048, "--radius", "NEAREST"]),
        ("points", ["sample", "--query-row", 2048]),
        ("lsh/segments", ["sample", "--query-row", 2048]),
        ("lsh/projections", ["sample", "--query-row", 2048]),
        ("ids", ["sample", "--query-id", 2048]),
        ("summary/ids", ["info"]),
        ("receipts/json", ["receipts"]),
        ("lineage/json", ["history"]),
        ("tree/level_0/centroids", ["predict", "--query-row", 3]),
    ],
)
def test_a_command_reading_a_damaged_chunk_exits_4_with_one_line(store, array, command):
    """Every chunk of ``array`` damaged: the command that reads it ends with exit 4 and one line
    naming the chunk, the array and the store, and prints no result."""
    if "NEAREST" in command:
        X = FairpipeStore.open(str(store)).read("points")
        nearest = np.sort(np.linalg.norm(X - X[2048], axis=1))[1]
        command = [nearest if a == "NEAREST" else a for a in command]
    chunks = stored_chunks(store)
    saved = []
    for (name, _), data in chunks.items():
        if name == array and not any(d == data for _, d in saved):
            saved += damage(store, data)
    try:
        out = invoke(*command, "--store", store)
        assert out.exit_code == 4, out.output
        assert out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: Chunk (")
        assert f"of array '{array}' in the store {store} is corrupt" in lines[0]
        assert f"fairpipe verify --store {store}" in lines[0]
    finally:
        restore(saved)
    assert invoke(*command, "--store", store).exit_code == 0


def test_the_hostile_case_64_bytes_of_rows_2048_to_2051_of_the_sketch(store):
    """Bytes flipped inside the uncompressed sketch chunk holding rows 2048-2051 (its first 64
    bytes: 16 a row at d = 4): the query of row 2048 is an error, not an empty neighbourhood."""
    want = invoke("sample", "--store", store, "--query-row", 2048, "--json")
    assert want.exit_code == 0 and json.loads(want.stdout)["queries"][0]["neighbourhood_size"] > 0
    session = FairpipeStore.open(str(store)).readonly_session()
    assert read_array(session, "sketch", slice(0, 1)).shape == (1, 16)
    chunk = 2048 // 512
    saved = damage(store, stored_chunks(store)[("sketch", (chunk, 0))], at=0, n=64)
    try:
        out = invoke("sample", "--store", store, "--query-row", 2048, "--json")
        assert out.exit_code == 4 and out.stdout == ""
        assert f"Chunk ({chunk}, 0) of array 'sketch'" in out.stderr
        light = open_light(store)
        assert light is not None  # the cold query's read path: checked the same way
        for session in (FairpipeStore.open(str(store)).readonly_session(), light[0]):
            with pytest.raises(CorruptChunkError, match=rf"Chunk \({chunk}, 0\) of array 'sketch'"):
                read_rows_at(session, "sketch", np.array([2049]))
    finally:
        restore(saved)


def test_a_forget_over_a_damaged_chunk_commits_nothing(store, tmp_path):
    copy = tmp_path / "s"
    shutil.copytree(store, copy)
    st = FairpipeStore.open(str(copy))
    ids = st.read("ids")
    tip = st.repo.lookup_branch("main")
    saved = damage(copy, stored_chunks(copy)[("points", (2, 0))])  # rows 1024-1535
    assert saved
    with pytest.raises(Exception) as err:
        run_forget(str(copy), [int(ids[1100])], **THREADS)
    found = corrupt_chunk_error(err.value)
    assert found is not None and (found.array, found.chunk) == ("points", (2, 0))
    assert st.repo.lookup_branch("main") == tip


def test_the_error_pickles_and_is_found_behind_wrappers():
    e = CorruptChunkError("lsh/segments", (2, 0, 1))
    again = pickle.loads(pickle.dumps(e))
    assert (again.array, again.chunk, str(again)) == (e.array, e.chunk, str(e))
    assert "in the store" not in str(e) and "in the store /x" in str(e.with_store("/x"))
    try:
        try:
            raise e
        except CorruptChunkError as inner:
            raise RuntimeError("the flow failed") from inner
    except RuntimeError as outer:
        assert corrupt_chunk_error(outer) is e
        assert corrupt_chunk_error(ExceptionGroup("one", [outer])) is e
    assert corrupt_chunk_error(ValueError("x")) is None


def test_a_store_without_checksums_reads_verifies_and_gets_them(tmp_path):
    """A store written before chunks carried a checksum (tests/data/format1): it reads as before,
    ``verify`` lists every array as unverifiable (exit 0), ``--add-checksums`` gives them one in
    a commit that changes no value, and damage is then found."""
    path = tmp_path / "dc"
    shutil.copytree(FORMAT1 / "dc", path)
    st = FairpipeStore.open(str(path))
    names = [name for name, _ in store_arrays(st.readonly_session())]
    before = dict(zip(names, read_arrays(st.readonly_session(), names)))
    out = invoke("verify", "--store", path, "--json")
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert {u["array"] for u in res["unverifiable"]} == set(names) and res["n_corrupt"] == 0
    assert "--add-checksums" in invoke("verify", "--store", path).stdout
    out = invoke("verify", "--store", path, "--add-checksums", "--json")
    assert out.exit_code == 0, out.output
    added = json.loads(out.stdout)["added"]
    assert set(added["arrays"]) == set(names) and added["chunks"] == res["chunks"]
    session = FairpipeStore.open(str(path)).readonly_session()
    assert all(has_checksum(arr) for _, arr in store_arrays(session))
    for name, values in zip(names, read_arrays(session, names)):
        assert np.array_equal(values, before[name]), name
        assert np.array_equal(read_array(session, name), before[name]), name
    res = json.loads(invoke("verify", "--store", path, "--json").stdout)
    assert res["unverifiable"] == [] and res["n_corrupt"] == 0
    assert add_checksums(FairpipeStore.open(str(path)))["arrays"] == []  # nothing left to do
    chunks = stored_chunks(path)
    data = chunks[("points", (0, 0))]
    if any((p.read_bytes() == data) for p in (path / "chunks").iterdir()):  # not inlined
        saved = damage(path, data)
        assert invoke("verify", "--store", path).exit_code == 4
        restore(saved)


def test_an_old_stores_undecodable_chunk_is_an_error_too(tmp_path):
    """Without a checksum, a compressed chunk damaged so that it cannot be decoded (its zstd
    frame's header) is still an error naming it on both read paths, and ``verify`` lists it.
    (Damage inside a frame may decode to wrong values: hence ``--add-checksums``.)"""
    path = tmp_path / "dc"
    shutil.copytree(FORMAT1 / "dc", path)
    chunks = stored_chunks(path)
    files = {p.read_bytes() for p in (path / "chunks").iterdir()}
    name, coords = next(k for k, v in sorted(chunks.items())
                        if v in files and v.startswith(b"\x28\xb5\x2f\xfd"))  # fmt: skip
    saved = damage(path, chunks[(name, coords)], at=0, n=8)
    st = FairpipeStore.open(str(path))
    for read in (read_array, lambda s, n: read_arrays(s, [n])):
        with pytest.raises(CorruptChunkError, match="cannot be decoded"):
            read(st.readonly_session(), name)
    report = verify_store(st)
    assert [(c["array"], tuple(c["chunk"])) for c in report["corrupt"]] == [(name, coords)]
    restore(saved)


def test_the_erasure_scan_reads_inside_a_checksummed_zstd_chunk():
    """fairpipe.storage.erasure.holds decompresses a chunk whose zstd frame is followed by its checksum
    (the proof that erased rows are in no stored byte must look inside compressed chunks)."""
    from numcodecs import Zstd

    from fairpipe.storage.chunks import crc32c_of
    from fairpipe.storage.erasure import holds

    row = np.arange(7, dtype=np.float32).tobytes()
    frame = Zstd(level=0).encode(row * 50 + np.arange(300, dtype=np.float32).tobytes())
    sealed = frame + crc32c_of(frame).to_bytes(4, "little")
    assert row not in sealed and holds(sealed, [row]) and not holds(sealed, [b"\x01" * 28])


def test_verify_lists_a_chunk_whose_object_is_gone(store, tmp_path):
    copy = tmp_path / "s"
    shutil.copytree(store, copy)
    data = stored_chunks(copy)[("points", (1, 0))]
    gone = [p for p in (copy / "chunks").iterdir() if p.read_bytes() == data]
    for p in gone:
        p.unlink()
    res = json.loads(invoke("verify", "--store", copy, "--json").stdout)
    assert [(c["array"], c["chunk"]) for c in res["corrupt"]] == [("points", [1, 0])]
    assert "Icechunk cannot read its object" in res["corrupt"][0]["why"]


def test_the_light_path_reads_the_checksum_only_as_the_last_codec():
    meta = {"zarr_format": 3, "shape": [4], "data_type": "int32", "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}  # fmt: skip
    crc, zstd = {"name": "crc32c"}, {"name": "zstd", "configuration": {"level": 0}}
    assert not plain_chunks("x", meta).checksum
    assert plain_chunks("x", {**meta, "codecs": meta["codecs"] + [zstd, crc]}).checksum
    assert plain_chunks("x", {**meta, "codecs": meta["codecs"] + [crc, zstd]}) is None


def test_no_fetch_outlives_a_read_that_meets_a_damaged_chunk(store):
    """A read of many chunks that meets a damaged one raises once every fetch under way has
    ended (and starts no more): a fetch of Icechunk's compiled store still in flight when the
    error reached the program's exit called back into a torn-down interpreter (a Rust panic:
    SIGABRT, after the error line was printed)."""
    import asyncio

    light, _ = open_light(store)
    in_flight = [0]
    original = light.get_bytes

    async def slow_get(key):
        in_flight[0] += 1
        try:
            await asyncio.sleep(0.02 if key.endswith("/c/1/0") else 0.05)
            return await original(key)
        finally:
            in_flight[0] -= 1

    light.get_bytes = slow_get
    saved = damage(store, stored_chunks(store)[("points", (1, 0))])
    try:
        with pytest.raises(CorruptChunkError, match=r"Chunk \(1, 0\) of array 'points'"):
            read_arrays(light, ["points"])
        assert in_flight[0] == 0  # every fetch under way ended before the error was raised
    finally:
        restore(saved)


def test_a_segment_naming_a_row_the_store_lacks_is_damage_not_an_index(store, tmp_path):
    """A segment whose values changed yet pass their checksum (written so, here; a store
    without checksums) is checked before a query indexes rows with its members: exit 4 naming
    the segment, never rows read past the store's end or a crash."""
    from fairpipe.storage.damage import DamagedPartError
    from fairpipe.storage.reader import open_reader

    path = tmp_path / "s"
    shutil.copytree(store, path)
    st = FairpipeStore.open(str(path))
    n = int(st.attrs()["n"])
    with st.transaction("a member past the end") as txn:
        segs = txn.root["lsh/segments"]
        nb = int(segs[0, 0, 0])
        segs[0, 0, 1 + 3 * nb] = n + 5  # the first member of the first bucket of table 0
    with pytest.raises(DamagedPartError) as err:
        open_reader(str(path), keep_rows=False).sample(query_rows=[0], n_samples=5, seed=1)
    assert str(err.value).startswith(
        "Segment (0, 0) of array 'lsh/segments' is damaged: it names row "
        f"{n + 5}, outside rows 0..{n - 1}."
    )
    out = invoke("sample", "--store", path, "--query-row", 0, "--sampler", "rank")
    assert out.exit_code == CORRUPT_STORE and out.stdout == "", out.output
    assert out.stderr.startswith("error: Segment (0, 0) of array 'lsh/segments' in the store")
