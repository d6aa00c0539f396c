"""Direct chunk reads (fairpipe.storage.arrays.read_rows_at / read_many) against zarr's own reads of the
same arrays: every codec the direct path decodes, chunks never written, and the arrays it leaves
to zarr."""

from __future__ import annotations

import numpy as np
import pytest
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

import fairpipe.storage.arrays as arrays_module
import fairpipe.storage.writes as writes_module
from fairpipe.storage.arrays import open_array, open_group, read_many, read_rows_at
from fairpipe.storage.chunks import _plain_chunks, checksummed
from fairpipe.storage.store import FairpipeStore

fetch_chunks = arrays_module._fetch_chunks

PLAIN = {
    "none": None,
    "blosc": BloscCodec(cname="lz4", clevel=1, shuffle="shuffle"),
    "zstd": ZstdCodec(level=1),
    "gzip": GzipCodec(level=1),  # not decoded directly: zarr reads it
}
# Each again with a crc32c checksum last, as every array of a store has it.
CODECS = {**PLAIN, **{f"{name}_crc": checksummed(codec) for name, codec in PLAIN.items()}}


def without_time(objects: dict, codec: str) -> dict:
    """Gzip's objects without the second they were written (header bytes 4-7), nor the checksum
    that covers it."""
    end = -4 if codec.endswith("_crc") else None
    return {k: v[:4] + v[8:end] for k, v in objects.items()}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A committed store with a (103, 7) float32 array, a (103,) int64 array and a 3-d int32
    array per codec (chunks of 10 rows; a few chunks never written), and a (103, 7) array split
    along its columns too."""
    store = FairpipeStore.open(str(tmp_path_factory.mktemp("chunks") / "s"), create=True)
    rng = np.random.default_rng(0)
    s = store.repo.writable_session("main")
    root = open_group(s, mode="a")
    for name, codec in CODECS.items():
        kw = {"compressors": codec} if codec is not None else {"compressors": None}
        x = root.create_array(f"x_{name}", shape=(103, 7), chunks=(10, 7), dtype="float32", **kw)
        x[:] = rng.normal(size=(103, 7)).astype(np.float32)
        y = root.create_array(f"y_{name}", shape=(103,), chunks=(10,), dtype="int64",
                              fill_value=-1, **kw)  # fmt: skip
        y[:40] = rng.integers(-(2**40), 2**40, size=40)  # rows 40.. never written: the fill
        y[90:] = np.arange(13)
        z = root.create_array(f"z_{name}", shape=(4, 5, 300), chunks=(1, 1, 64), dtype="int32",
                              fill_value=7, **kw)  # fmt: skip
        z[:, :3, :200] = rng.integers(0, 1000, size=(4, 3, 200), dtype=np.int32)
    w = root.create_array("wide", shape=(103, 7), chunks=(10, 3), dtype="float32")
    w[:] = rng.normal(size=(103, 7)).astype(np.float32)
    sh = root.create_array("sharded", shape=(103, 7), chunks=(10, 7), shards=(20, 7),
                           dtype="float32")  # fmt: skip
    sh[:] = rng.normal(size=(103, 7)).astype(np.float32)
    s.commit("arrays")
    return store.readonly_session()


@pytest.mark.parametrize("codec", list(CODECS))
def test_rows_equal_zarrs_orthogonal_read(session, codec):
    rng = np.random.default_rng(1)
    for name in (f"x_{codec}", f"y_{codec}"):
        arr = open_array(session, name)
        assert (_plain_chunks(arr) is None) == codec.startswith("gzip")
        for rows in ([0], [102], [5, 5, 3, 99, 0], rng.integers(0, 103, 500), np.arange(103)):
            rows = np.asarray(rows)
            want = arr.get_orthogonal_selection((rows,) + (slice(None),) * (arr.ndim - 1))
            got = read_rows_at(session, name, rows)
            assert got.dtype == want.dtype and np.array_equal(got, want)
        assert read_rows_at(session, name, np.zeros(0, np.int64)).shape == (0, *arr.shape[1:])


def test_unwritten_chunks_read_as_the_fill_value(session):
    assert np.array_equal(read_rows_at(session, "y_none", np.array([45, 61, 89])), [-1, -1, -1])
    got = read_many(session, "z_blosc", [(0, 4, slice(0, 64)), (1, 2, slice(250, 300))])
    assert np.array_equal(got[0], np.full(64, 7)) and got[1].shape == (50,)
    assert np.array_equal(got[1], np.full(50, 7))


@pytest.mark.parametrize("codec", list(CODECS))
def test_selections_equal_zarrs_reads(session, codec, monkeypatch):
    arr = open_array(session, f"z_{codec}")
    fetched = []
    monkeypatch.setattr(arrays_module, "_fetch_chunks", lambda *a: fetched.append(a[2]) or
                        fetch_chunks(*a))  # fmt: skip
    inside = [(0, 0, slice(0, 64)), (3, 2, slice(130, 190)), (2, 1, slice(64, 65)),
              (1, 4, slice(256, 300)), (0, 2, 5)]  # fmt: skip
    spanning = [(1, 1, slice(0, 200)), (2, 0, slice(60, 129))]  # along the last axis: pieces
    across = [(slice(0, 2), 1, slice(0, 10))]  # two chunks in another axis: zarr reads the list
    for sels in (inside, inside + spanning, inside + across):
        got = read_many(session, f"z_{codec}", sels)
        for sel, g in zip(sels, got):
            want = np.asarray(arr[sel])
            assert g.shape == want.shape and np.array_equal(g, want)
    direct = [(0, 0, 0), (3, 2, 2), (2, 1, 1), (1, 4, 4), (0, 2, 0)]
    pieces = [(1, 1, 0), (1, 1, 1), (1, 1, 2), (1, 1, 3), (2, 0, 0), (2, 0, 1), (2, 0, 2)]
    assert fetched == ([] if codec.startswith("gzip") else [direct, direct + pieces])


@pytest.mark.parametrize("name", ["wide", "sharded"])
def test_arrays_split_along_columns_or_sharded_are_read_by_zarr(session, name):
    arr = open_array(session, name)
    assert _plain_chunks(arr) is None or name == "wide"
    rows = np.array([3, 77, 3, 50])
    assert np.array_equal(read_rows_at(session, name, rows), arr.get_orthogonal_selection(
        (rows, slice(None))))  # fmt: skip


def test_rows_out_of_range_are_an_error(session):
    with pytest.raises(IndexError, match="103"):
        read_rows_at(session, "x_none", np.array([0, 103]))
    with pytest.raises(IndexError, match="-1"):
        read_rows_at(session, "x_blosc", np.array([-1]))


@pytest.mark.parametrize("codec", list(CODECS))
def test_direct_writes_leave_the_objects_zarr_writes(tmp_path, codec):
    """write_block against zarr's own write of the same values, per codec: whole chunks are
    encoded and put directly (gzip, and blocks not made of whole chunks, go through zarr), a
    chunk of the fill value is deleted as zarr deletes it, and every stored object is the same,
    byte for byte."""
    from zarr.buffer import default_buffer_prototype

    from fairpipe.storage.chunks import on_zarr_loop

    store = FairpipeStore.open(str(tmp_path / "s"), create=True)
    s = store.repo.writable_session("main")
    root = open_group(s, mode="a")
    kw = {"compressors": CODECS[codec]}
    rng = np.random.default_rng(1)
    first = rng.integers(0, 1000, size=(2, 3, 256), dtype=np.int32)
    again = rng.integers(0, 1000, size=(2, 3, 256), dtype=np.int32)
    again[1, 2, 64:128] = 7  # the fill value: a chunk that held numbers must disappear
    for name in ("by_zarr", "direct"):
        root.create_array(name, shape=(4, 5, 300), chunks=(1, 1, 64), dtype="int32",
                          fill_value=7, **kw)  # fmt: skip
    expected = np.full((4, 5, 300), 7, dtype=np.int32)
    for block, at in ((first, (1, 0, 0)), (again, (1, 0, 0)), (first[:, :2, :100], (0, 3, 0))):
        region = tuple(slice(a, a + n) for a, n in zip(at, block.shape))
        open_array(s, "by_zarr", mode="r+")[region] = block
        writes_module.write_block(s, "direct", at, block)
        expected[region] = block
    proto = default_buffer_prototype()

    async def objects(name: str) -> dict:
        keys = [k async for k in s.store.list_prefix(name) if "/c/" in k]
        return {k.split("/", 1)[1]: (await s.store.get(k, proto)).to_bytes() for k in keys}

    by_zarr, direct = on_zarr_loop(objects("by_zarr")), on_zarr_loop(objects("direct"))
    if codec.startswith("gzip"):  # its header holds the second it was written (bytes 4-7)
        by_zarr, direct = (without_time(objs, codec) for objs in (by_zarr, direct))
    assert by_zarr == direct and len(direct) >= 2 * 3 * 4 - 1
    # the chunk now all fill value was deleted (by both)
    assert "c/2/2/1" not in direct and "c/2/2/0" in direct
    assert np.array_equal(open_array(s, "direct")[:], expected)
    assert np.array_equal(open_array(s, "by_zarr")[:], expected)
    # A float array whose fill value is NaN: a chunk of NaN is a chunk of the fill value.
    values = rng.normal(size=(20, 3)).astype(np.float32)
    values[10:] = np.nan
    for name in ("f_by_zarr", "f_direct"):
        root.create_array(name, shape=(40, 3), chunks=(10, 3), dtype="float32",
                          fill_value=np.nan, **kw)  # fmt: skip
        open_array(s, name, mode="r+")[:20] = 1.0
    open_array(s, "f_by_zarr", mode="r+")[:20] = values
    writes_module.write_rows(s, "f_direct", 0, values)
    f_zarr, f_direct = on_zarr_loop(objects("f_by_zarr")), on_zarr_loop(objects("f_direct"))
    assert f_zarr == f_direct and sorted(f_direct) == ["c/0/0"]


@pytest.mark.parametrize("codec", list(CODECS))
def test_rows_written_inside_chunks_leave_the_objects_zarr_writes(tmp_path, codec, monkeypatch):
    """write_rows of row ranges starting and ending inside chunks (an append's ids, groups,
    points and sketches), as a store grows: the same objects as zarr's own writes, byte for
    byte, for 1-d and 2-d arrays of several dtypes, a chunk never written before, one left
    holding only the fill value (deleted, as zarr does) and the rows beyond the array's end."""
    from zarr.buffer import default_buffer_prototype

    from fairpipe.storage.chunks import on_zarr_loop

    store = FairpipeStore.open(str(tmp_path / "s"), create=True)
    s = store.repo.writable_session("main")
    root = open_group(s, mode="a")
    kw = {"compressors": CODECS[codec]}
    rng = np.random.default_rng(2)
    proto = default_buffer_prototype()

    async def objects(name: str) -> dict:
        keys = [k async for k in s.store.list_prefix(name) if "/c/" in k]
        return {k.split("/", 1)[1]: (await s.store.get(k, proto)).to_bytes() for k in keys}

    direct_writes = []
    real = writes_module._write_rows_direct
    monkeypatch.setattr(writes_module, "_write_rows_direct",
                        lambda *a: direct_writes.append(1) or real(*a))  # fmt: skip
    kinds = {"i8": ((), "int64", 0), "f4": ((3,), "float32", 0.0), "b1": ((), "bool", False),
             "u1": ((5,), "uint8", 0)}  # fmt: skip
    for kind, (tail, dtype, fill) in kinds.items():
        for how in ("by_zarr", "direct"):
            root.create_array(f"{how}_{kind}", shape=(0, *tail), chunks=(8, *tail),
                              dtype=dtype, fill_value=fill, **kw)  # fmt: skip
        n = 0
        for m in (3, 13, 1, 8, 21, 2):  # appends starting and ending anywhere in chunks
            block = rng.integers(0, 3, size=(m, *tail)).astype(dtype)
            if m == 2:
                block[:] = fill  # ... the last chunk ends with the fill value only
            for how in ("by_zarr", "direct"):
                arr = open_array(s, f"{how}_{kind}", mode="r+")
                arr.resize((n + m, *tail))
                if how == "by_zarr":
                    arr[n : n + m] = block
                else:
                    writes_module.write_rows(s, arr.path, n, block)
            n += m
        by_zarr, direct = (
            on_zarr_loop(objects(f"by_zarr_{kind}")),
            on_zarr_loop(objects(f"direct_{kind}")),
        )
        if codec.startswith("gzip"):  # the second it was written (header bytes 4-7)
            by_zarr, direct = (without_time(objs, codec) for objs in (by_zarr, direct))
        assert by_zarr == direct and len(direct) >= 5, kind
        assert np.array_equal(open_array(s, f"direct_{kind}")[:],
                              open_array(s, f"by_zarr_{kind}")[:])  # fmt: skip
    assert len(direct_writes) == (0 if codec.startswith("gzip") else 4 * 6)  # gzip: zarr


@pytest.mark.parametrize(
    "name", ["x_none", "x_blosc", "y_zstd", "y_gzip", "wide", "sharded", "x_none_crc", "y_zstd_crc"]
)
def test_rewriting_rows_changes_those_rows_and_writes_only_their_chunks(tmp_path, name):
    # fairpipe.storage.writes.rewrite_rows_at (what erasing rows uses): the edited rows change, every
    # other value stays, the edge chunk (3 rows of a 100-row chunk) included, and only the
    # chunks holding a row become new objects (plainly encoded arrays; others go through zarr).
    store = FairpipeStore.open(str(tmp_path / "s"), create=True)
    rng = np.random.default_rng(1)
    s = store.repo.writable_session("main")
    root = open_group(s, mode="a")
    kw: dict = {"x_none": {"compressors": None}, "x_blosc": {"compressors": CODECS["blosc"]},
                "y_zstd": {"compressors": CODECS["zstd"]}, "y_gzip": {"compressors": CODECS["gzip"]},
                "wide": {}, "sharded": {}, "x_none_crc": {"compressors": CODECS["none_crc"]},
                "y_zstd_crc": {"compressors": CODECS["zstd_crc"]}}[name]  # fmt: skip
    # Chunks large enough not to be inlined in Icechunk's manifests (so each is a file).
    shape, chunks = ((10003,), (1000,)) if name.startswith("y") else ((1003, 64), (100, 64))
    if name == "wide":
        chunks = (100, 32)
    if name == "sharded":
        kw = {"shards": (200, 64)}
    values = rng.normal(size=shape).astype(np.float32)
    root.create_array(name, shape=shape, chunks=chunks, dtype="float32", **kw)[...] = values
    s.commit("values")
    folder = tmp_path / "s" / "chunks"
    before = {p.name for p in folder.iterdir()}
    s = store.repo.writable_session("main")
    last, block = shape[0] - 1, chunks[0]  # rows in chunks 0 and 2 and the edge chunk, any order
    rows = np.array([last - 1, 3, 5, 2 * block + 1, last])

    def edit(chunk: np.ndarray, local: np.ndarray) -> None:
        chunk[local] = -1.0

    writes_module.rewrite_rows_at(s, name, rows, edit)
    values[rows] = -1.0
    assert np.array_equal(np.asarray(open_array(s, name)[...]), values)
    s.commit("edited")
    new = {p.name for p in folder.iterdir()} - before
    if _plain_chunks(open_array(store.readonly_session(), name)) is not None and name != "wide":
        # the three chunks holding the rows, nothing else (a small edge chunk may be inlined in
        # the manifest instead of being a file)
        assert 2 <= len(new) <= 3
    with pytest.raises(IndexError, match=f"Row {shape[0]} is out of range"):
        writes_module.rewrite_rows_at(store.repo.writable_session("main"), name, [shape[0]], edit)


def test_zarrs_event_loop_runner_is_where_the_store_reaches_it():
    """fairpipe.storage.chunks.on_zarr_loop is the one use of zarr's internal ``zarr.core.sync.sync``;
    an upgrade that moves or changes it fails here, naming zarr."""
    import asyncio
    import threading

    import zarr

    from fairpipe.storage.chunks import on_zarr_loop

    async def where() -> tuple[str, int]:
        await asyncio.sleep(0)
        return threading.current_thread().name, 42

    try:
        thread, value = on_zarr_loop(where())
    except (ImportError, AttributeError, TypeError) as exc:
        pytest.fail(f"zarr {zarr.__version__} moved or changed zarr.core.sync.sync ({exc}): "
                    "update fairpipe.storage.chunks.on_zarr_loop, the one place fairpipe runs zarr's loop")  # fmt: skip
    assert value == 42 and thread != threading.main_thread().name, (
        f"zarr {zarr.__version__}: sync() no longer runs on zarr's own loop thread"
    )
