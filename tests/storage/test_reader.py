"""fairpipe.storage.open_reader: lazy queries over a committed store, against the in-memory FairNN."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2
from sklearn.datasets import make_blobs

from fairpipe import FairNN, FairpipeInputError
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import IngestOptions
from fairpipe.neighbors import MODES, chi_square_uniform
from fairpipe.storage import NotAStoreError, open_reader

LSH = dict(n_hashes=3, n_tables=6, bucket_width=2.5, seed=3)
THREADS = dict(n_workers=1, processes=False)


@pytest.fixture(scope="module", params=["one scale", "scales"])
def store(prefect_server, tmp_path_factory, request):
    """A store with forgotten rows and two appends held in two delta layers of the index (a row
    of the second forgotten too), and the FairNN holding the same rows: with its tables given
    (one scale), and with its index in scales 0.5, 1 and 2 (the tests' radius 1.5 reads the
    third scale's tables)."""
    tmp = tmp_path_factory.mktemp("reader")
    X, _ = make_blobs(n_samples=3000, n_features=5, centers=3, random_state=2)
    X = X.astype(np.float32)
    np.save(tmp / "a.npy", X[:2700])
    np.save(tmp / "b.npy", X[2700:2900])
    np.save(tmp / "c.npy", X[2900:])
    opts = IngestOptions(seed=3, n_hashes=3, n_tables=6, bucket_width=2.5, chunk_rows=512)
    if request.param == "scales":
        opts = IngestOptions(seed=3, n_hashes=3, radius=0.5, max_radius=2.0, chunk_rows=512)
    run_ingest(str(tmp / "a.npy"), str(tmp / "s"), opts, **THREADS)
    run_forget(str(tmp / "s"), [10, 2000], **THREADS)
    run_ingest(str(tmp / "b.npy"), str(tmp / "s"), IngestOptions(), **THREADS)
    run_ingest(str(tmp / "c.npy"), str(tmp / "s"), IngestOptions(), **THREADS)
    run_forget(str(tmp / "s"), [2900], **THREADS)
    lsh = open_reader(str(tmp / "s")).attrs["lsh"]
    assert lsh["delta_start"] == 2700
    assert [start for _, start, _ in lsh["deltas"]] == [2700, 2900]
    params = LSH
    if request.param == "scales":
        assert [s[0] for s in lsh["scales"]] == [0.5, 1.0, 2.0]
        params = {name: lsh[name] for name in ("n_hashes", "n_tables", "bucket_width")}
        params.update(seed=3, scales=tuple(map(tuple, lsh["scales"])))
    nn = FairNN(**params).fit(X)
    nn.delete([10, 2000, 2900])
    return tmp / "s", nn, X


@pytest.mark.parametrize("sampler", ["exact", "approx", "uniform", "weighted", "rank"])
def test_lazy_queries_draw_exactly_what_fairnn_draws(store, sampler):
    path, nn, X = store
    reader = open_reader(str(path))
    for mode in MODES:
        for rows in ([0], [2700], [5, 11, 2999]):
            kw = dict(radius=1.5, n_samples=25, seed=4, sampler=sampler, mode=mode,
                      with_neighbourhood=True)  # fmt: skip
            got = reader.sample(query_rows=rows, **kw)
            want = nn.sample(query_rows=rows, **kw)
            assert np.array_equal(got.ids, want.ids), (mode, rows)
            assert np.array_equal(got.neighbourhood_sizes, want.neighbourhood_sizes)
        Q = X[[3, 2600]] + 0.05
        got, want = reader.sample(Q, radius=1.5, n_samples=9, seed=1, sampler=sampler, mode=mode), \
            nn.sample(Q, radius=1.5, n_samples=9, seed=1, sampler=sampler, mode=mode)  # fmt: skip
        assert np.array_equal(got.ids, want.ids)
    assert not reader._nn or sampler == "rank"  # the lazy path read no whole array


def test_a_large_batch_reads_the_index_once_and_draws_what_the_lazy_path_draws(store,
                                                                              monkeypatch):  # fmt: skip
    import fairpipe.storage.reader as reader_module

    path, _, X = store
    rows = list(range(0, 2990, 37))  # 81 queries, none a forgotten row (10, 2000, 2900)
    kw = dict(radius=1.5, n_samples=12, seed=2, with_neighbourhood=True)
    batch = open_reader(str(path))
    got = batch.sample(query_rows=rows, **kw)
    assert len(rows) >= reader_module.PRELOAD_QUERIES and batch._nn
    # Only the scale of the radius is read (an index of it alone), unless one scale is all.
    (nn,) = batch._nn.values()
    assert nn.n_tables == batch.lsh.scale_for(1.5).n_tables
    monkeypatch.setattr(reader_module, "PRELOAD_QUERIES", 10**9)
    lazy = open_reader(str(path))
    want = lazy.sample(query_rows=rows, **kw)
    assert not lazy._nn and np.array_equal(got.ids, want.ids)
    assert np.array_equal(got.neighbourhood_sizes, want.neighbourhood_sizes)


def test_by_id_neighbourhood_and_a_uniform_exact_sampler(store):
    path, nn, _ = store
    reader = open_reader(str(path))
    hood = reader.neighbourhood(query_ids=[77], radius=1.5)[0]
    assert np.array_equal(np.sort(hood), np.sort(nn.neighbourhood(query_rows=[77], radius=1.5)[0]))
    res = reader.sample(query_ids=[77], radius=1.5, n_samples=20 * hood.size, seed=0)
    assert np.isin(res.ids[0], hood).all()
    stat, dof = chi_square_uniform(res.ids[0], hood)
    assert chi2.sf(stat, dof) > 1e-3  # uniform on the neighbourhood


def test_many_samples_enumerate_what_fairnn_enumerates_and_short_queries_say_why(store):
    """Many samples of a query: the reader lists M(q) once from its candidates and draws what
    FairNN draws from its own; a query with an empty neighbourhood reports it the same way."""
    path, nn, X = store
    reader = open_reader(str(path))
    for rows in ([0], [5, 2999]):
        kw = dict(radius=1.5, n_samples=20_000, seed=2)
        got, want = reader.sample(query_rows=rows, **kw), nn.sample(query_rows=rows, **kw)
        assert np.array_equal(got.ids, want.ids)
        assert all(st.extra["enumerated"] for st in got.stats)
        assert [(st.asked, st.drawn, st.why) for st in got.stats] == [(20_000, 20_000, None)] * len(
            rows
        )
    far = np.full((1, X.shape[1]), 1e3, np.float32)
    got = reader.sample(far, radius=1.5, n_samples=5, seed=2)
    assert (
        got.short()
        == nn.sample(far, radius=1.5, n_samples=5, seed=2).short()
        == [(0, 0, 5, "empty")]
    )


def test_a_long_lived_reader_reads_each_chunk_once(store, monkeypatch):
    """Later queries are served from what earlier ones read (segments and rows): asking the
    same queries again reads nothing."""
    import fairpipe.storage.candidates
    import fairpipe.storage.reader

    path, nn, _ = store
    reader = open_reader(str(path))
    kw = dict(radius=1.5, n_samples=10, seed=1, with_neighbourhood=True)
    first = reader.sample(query_rows=[0, 2700, 1500], **kw)
    fetched: list = []
    fetch = fairpipe.storage.candidates._fetch_chunks
    monkeypatch.setattr(fairpipe.storage.candidates, "_fetch_chunks",
                        lambda *a: (fetched.append(a[2]), fetch(*a)))  # fmt: skip
    monkeypatch.setattr(fairpipe.storage.reader, "read_checked_segments",
                        lambda *a: pytest.fail(f"read {a[1]}"))  # fmt: skip
    again = reader.sample(query_rows=[0, 2700, 1500], **kw)
    assert np.array_equal(first.ids, again.ids) and fetched == []
    assert np.array_equal(again.ids, nn.sample(query_rows=[0, 2700, 1500], **kw).ids)


def test_predict_reads_the_model_root(store, prefect_server):
    from fairpipe import DCKMeans
    from fairpipe.flows.fit import run_fit
    from fairpipe.flows.options import FitOptions

    path, nn, X = store
    run_fit(str(path), FitOptions(n_clusters=3, fanout=2, height=1, seed=1), **THREADS)
    reader = open_reader(str(path))
    alive = np.ones(X.shape[0], bool)
    alive[[10, 2000]] = False
    model = DCKMeans(n_clusters=3, fanout=2, height=1, n_init=10, max_iter=10, seed=1)
    model.fit(X[alive], ids=np.flatnonzero(alive))
    assert reader.predict(X[:50]).tolist() == model.predict(X[:50]).tolist()
    assert reader.predict(query_ids=[5]).tolist() == model.predict(X[5:6]).tolist()


def test_bad_queries_name_what_is_wrong(store, tmp_path):
    path, _, _ = store
    reader = open_reader(str(path))
    with pytest.raises(FairpipeInputError, match="Id 10 is not in the store .*forgotten"):
        reader.sample(query_ids=[10])
    with pytest.raises(FairpipeInputError, match="Id 123456 is not in the store"):
        reader.sample(query_ids=[123456])
    with pytest.raises(FairpipeInputError, match="Row 2000 \\(id 2000\\) .* has been forgotten"):
        reader.sample(query_rows=[2000])
    with pytest.raises(FairpipeInputError, match="Query row 3000 is out of range"):
        reader.sample(query_rows=[3000])
    with pytest.raises(FairpipeInputError, match="'radius' parameter .* positive float. Got 0"):
        reader.sample(query_rows=[1], radius=0)
    with pytest.raises(FairpipeInputError, match="5 features|dimension|features"):
        reader.sample(np.zeros(4, np.float32))
    with pytest.raises(FairpipeInputError, match="exactly one of"):
        reader.sample(query_rows=[1], query_ids=[1])
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "x.txt").write_text("x")
    with pytest.raises(NotAStoreError):
        open_reader(str(tmp_path / "folder"))


def test_a_small_neighbourhood_is_decided_from_the_sketch(store):
    """A query whose neighbourhood is small looks at every candidate's distance: the sketch
    decides them, and only the chunks of points holding undecided candidates are read."""
    path, nn, _ = store
    reader = open_reader(str(path))
    kw = dict(radius=0.4, n_samples=10, seed=0, with_neighbourhood=True)
    got = reader.sample(query_rows=[0], **kw)
    assert np.array_equal(got.ids, nn.sample(query_rows=[0], **kw).ids)
    extra = got.stats[0].extra
    assert got.neighbourhood_sizes[0] < 20 < extra["candidates"]
    assert extra["points_read"] < extra["candidates"] / 2, extra


def test_candidates_the_sketch_leaves_open_are_decided_by_its_residual(prefect_server, tmp_path):
    """At a radius where many candidates' distances lie (the median distance to the query, in
    32 dimensions), the sketch leaves a share of them open: the residual decides nearly all of
    those, so few points are read, and the draws and the neighbourhood are FairNN's (also at a
    radius that is exactly a candidate's distance, which only its point can decide)."""
    X = np.random.default_rng(6).normal(size=(4000, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    opts = IngestOptions(seed=1, n_hashes=2, n_tables=4, bucket_width=12.0, chunk_rows=1024)
    run_ingest(str(tmp_path / "x.npy"), str(tmp_path / "s"), opts, **THREADS)
    nn = FairNN(n_hashes=2, n_tables=4, bucket_width=12.0, seed=1).fit(X)
    d = np.sqrt(np.square(X - X[0]).sum(axis=1))
    seen = []
    for radius in (float(np.median(d)), float(np.sort(d)[1000])):  # dense; an exact tie
        reader = open_reader(str(tmp_path / "s"))
        assert reader.row_cache("sketch_residual") is not None
        kw = dict(radius=radius, n_samples=20, seed=5, with_neighbourhood=True)
        got = reader.sample(query_rows=[0], **kw)
        want = nn.sample(query_rows=[0], **kw)
        assert np.array_equal(got.ids, want.ids)
        assert np.array_equal(got.neighbourhood_sizes, want.neighbourhood_sizes)
        seen.append(got.stats[0].extra)
    dense, tie = seen
    assert dense["candidates"] > 1000 and dense["refined"] > 30, dense
    # Without the residual those 30+ open rows would fall in all four chunks of points.
    assert dense["points_read"] < dense["candidates"], dense
    assert tie["points_read"] > 0, tie  # the tie was decided on its point


# -- the light read path (fairpipe.storage.light): no zarr, no icechunk package ---------------------------
def test_the_light_path_reads_what_the_icechunk_path_reads(store, monkeypatch):
    """Every array a query reads, whole and by the selections the reader makes, gives the same
    values through the light view as through zarr on an Icechunk session; and a reader on
    each path draws the same samples with the same statistics."""
    import fairpipe.storage.reader
    from fairpipe.storage.arrays import read_array, read_many, read_rows_at
    from fairpipe.storage.light import QUERY_ARRAYS, LightSession, delta_arrays, open_light
    from fairpipe.storage.store import FairpipeStore

    path, _, _ = store
    opened = open_light(path)
    assert opened is not None
    light, attrs = opened
    full = FairpipeStore.open(str(path)).readonly_session()
    assert attrs == FairpipeStore.open(str(path)).attrs(full)
    names = [*QUERY_ARRAYS, *delta_arrays(attrs)]
    present = [name for name in names if name.split("/")[-1] in _members(full, name)]
    layers = ["lsh/segments", "lsh/delta_2700", "lsh/delta_2900"]
    assert {"points", "sketch", "ids", "alive", *layers} <= set(present)
    for name in set(present) - set(layers):  # the segments: by segment below
        a, b = read_array(light, name), read_array(full, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    for sel in [(slice(5, 3000, 7), 3), (slice(None, None, -3), slice(1, 4)), (-1,), (slice(10, 5),),
                (2999, slice(None))]:  # fmt: skip
        assert np.array_equal(read_array(light, "points", sel), read_array(full, "points")[sel])
    lengths = read_array(full, "lsh/segment_lengths")
    sels = [(t, p, slice(0, int(lengths[t, p]))) for t in range(lengths.shape[0])
            for p in range(lengths.shape[1])] + [(0, 0, slice(3, 9))]  # fmt: skip
    for layer in layers:
        for a, b in zip(read_many(light, layer, sels), read_many(full, layer, sels)):
            assert np.array_equal(a, b)
    rows = np.random.default_rng(0).permutation(3000)[:700]
    for name in ("points", "sketch", "ids", "alive"):
        assert np.array_equal(read_rows_at(light, name, rows), read_rows_at(full, name, rows))

    kw = dict(radius=1.5, n_samples=30, seed=2, with_neighbourhood=True)
    reader = open_reader(str(path))
    assert isinstance(reader.session, LightSession)
    got = reader.sample(query_rows=[0, 2700, 1234], **kw)
    monkeypatch.chdir(path.parent)  # a relative path, then another folder: preload still opens
    relative = open_reader(path.name)
    assert isinstance(relative.session, LightSession)
    monkeypatch.chdir(path.parent.parent)
    assert np.array_equal(relative.sample(query_rows=[0, 2700, 1234], **kw).ids, got.ids)
    relative.preload()
    assert np.array_equal(relative.sample(query_rows=[0, 2700, 1234], **kw).ids, got.ids)
    monkeypatch.setattr(fairpipe.storage.reader, "open_light", lambda *a: None)
    ordinary = open_reader(str(path))
    assert not isinstance(ordinary.session, LightSession)
    want = ordinary.sample(query_rows=[0, 2700, 1234], **kw)
    assert np.array_equal(got.ids, want.ids)
    assert np.array_equal(got.neighbourhood_sizes, want.neighbourhood_sizes)
    assert [s.extra for s in got.stats] == [s.extra for s in want.stats]


def _members(session, name: str) -> set[str]:
    from fairpipe.storage.arrays import open_group

    group = open_group(session)
    parent = name.rsplit("/", 1)[0] if "/" in name else ""
    return set((group[parent] if parent else group).keys())


def test_a_cold_query_loads_neither_zarr_nor_the_icechunk_package(store):
    """The light path's point: a query in a fresh process imports neither. Loading icechunk's
    compiled module first must not break the package imported after it in the same process
    (a compiled module is initialised once per process): the in-memory sampler (read through
    the light view too) draws the same samples, and a session opened through the package
    afterwards works."""
    import json
    import subprocess
    import sys

    path, _, _ = store
    code = (
        "import json, sys, numpy as np\n"
        "from fairpipe.storage import open_reader\n"
        f"r = open_reader({str(path)!r})\n"
        "lazy = r.sample(query_rows=[0, 2700], radius=1.5, n_samples=5, seed=1)\n"
        "loaded = sorted(m for m in ('zarr', 'icechunk') if m in sys.modules)\n"
        "r.preload()\n"
        "hot = r.sample(query_rows=[0, 2700], radius=1.5, n_samples=5, seed=1)\n"
        "assert r.full_session.snapshot_id == r.session.snapshot_id\n"
        "print(json.dumps({'loaded': loaded, 'same': bool(np.array_equal(lazy.ids, hot.ids)),\n"
        "                  'after': 'icechunk' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "loaded": [], "same": True, "after": True}  # fmt: skip


def test_what_the_light_path_cannot_read_is_read_the_ordinary_way(store, tmp_path):
    """Metadata the light view does not decode gives no view, and the reader then opens the
    store through Icechunk and zarr: a copy of the store whose bucket counts are re-encoded with
    gzip samples as the original does. A folder that is not a store gives no view either (the
    ordinary path names the problem)."""
    import shutil

    from zarr.codecs import GzipCodec

    from fairpipe.storage.arrays import read_array
    from fairpipe.storage.light import LightSession, open_light, plain_chunks
    from fairpipe.storage.store import FairpipeStore

    meta = {"zarr_format": 3, "shape": [4], "data_type": "int32", "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}  # fmt: skip
    assert plain_chunks("x", meta).encode_key((1,)) == "c/1"
    v2 = {**meta, "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}}}
    assert plain_chunks("x", v2).encode_key((1, 2)) == "1.2"
    assert np.isnan(plain_chunks("x", {**meta, "data_type": "float32", "fill_value": "NaN"}).fill)
    for bad in ({"codecs": meta["codecs"] + [{"name": "gzip", "configuration": {"level": 1}}]},
                {"codecs": [{"name": "sharding_indexed", "configuration": {}}]},
                {"codecs": [{"name": "bytes", "configuration": {"endian": "big"}}]},
                {"data_type": "string"}, {"zarr_format": 2}):  # fmt: skip
        assert plain_chunks("x", {**meta, **bad}) is None, bad

    path, _, _ = store
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    fp = FairpipeStore.open(str(copy))
    with fp.transaction("re-encode") as txn:
        counts = read_array(txn.session, "lsh/bucket_counts")
        del txn.root["lsh/bucket_counts"]
        txn.root.create_array("lsh/bucket_counts", shape=counts.shape, dtype=counts.dtype,
                              compressors=[GzipCodec()])[...] = counts  # fmt: skip
    assert open_light(copy) is None and open_light(path) is not None
    reader = open_reader(str(copy))
    assert not isinstance(reader.session, LightSession)
    kw = dict(radius=1.5, n_samples=10, seed=3)
    assert np.array_equal(reader.sample(query_rows=[7], **kw).ids,
                          open_reader(str(path)).sample(query_rows=[7], **kw).ids)  # fmt: skip
    (tmp_path / "plain").mkdir()
    assert open_light(tmp_path / "plain") is None and open_light(tmp_path / "none") is None
