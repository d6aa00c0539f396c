"""The ingest flow on a real LocalCluster with worker processes and a real Icechunk store."""

import json
import threading

import numpy as np
import pandas as pd
import pytest

from fairpipe import FairpipeInputError
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import IngestOptions
from fairpipe.flows.sample import load_sampler, sample_store
from fairpipe.storage import NotAStoreError, StoreBusyError, open_store
from fairpipe.storage.index import index_entries, read_segments
from fairpipe.storage.staging import STAGING_MARK

ARRAYS = (
    "points",
    "ids",
    "groups",
    "alive",
    "lsh/segment_lengths",
    "lsh/segments",
    "lsh/bucket_counts",
    "lsh/projections",
)


def snapshot(path):
    st = open_store(str(path))
    arrays = {name: st.read(name) for name in ARRAYS if name != "lsh/segments"}
    arrays["lsh/segments"] = read_segments(st.readonly_session())[1]
    return arrays, st.attrs()


def assert_same_store(a, b):
    arrays_a, attrs_a = snapshot(a)
    arrays_b, attrs_b = snapshot(b)
    for name in ARRAYS:
        assert np.array_equal(arrays_a[name], arrays_b[name]), name
    drop = {"sources", "chunk_rows"}  # the row chunking is a layout choice, not content
    assert {k: v for k, v in attrs_a.items() if k not in drop} == {
        k: v for k, v in attrs_b.items() if k not in drop
    }


def test_digits_store_round_trip(digits_store):
    path, result = digits_store
    assert result["n"] == 1797 and result["d"] == 64 and len(result["groups"]) == 10
    arrays, attrs = snapshot(path)
    from sklearn.datasets import load_digits

    assert np.array_equal(arrays["points"], load_digits().data.astype(np.float32))
    assert np.array_equal(arrays["ids"], np.arange(1797))
    assert attrs["group_names"] == [str(i) for i in range(10)]
    # The stored index holds what FairNN builds in memory from the same points.
    from fairpipe.neighbors import FairNN

    st = open_store(str(path))
    fresh = FairNN(n_hashes=8, n_tables=20, bucket_width=attrs["lsh"]["bucket_width"], seed=3)
    fresh.fit(arrays["points"])
    keys = fresh.keys_
    for t, (k, ids) in enumerate(index_entries(st.readonly_session())):
        order = np.lexsort((np.arange(1797), keys[:, t]))
        assert np.array_equal(k, keys[order, t]) and np.array_equal(ids, order), t
    nn, _ = load_sampler(str(path))
    got = nn.sample(query_rows=[5, 900], radius=30.0, n_samples=40, seed=1)
    want = fresh.sample(query_rows=[5, 900], radius=30.0, n_samples=40, seed=1)
    assert np.array_equal(got.ids, want.ids)


def test_one_and_two_worker_processes_and_chunk_sizes_give_identical_stores(
    prefect_server, tmp_path, digits_store
):
    path2, _ = digits_store
    opts = IngestOptions(seed=3, n_hashes=8, n_tables=20, chunk_rows=256)
    run_ingest("digits", str(tmp_path / "one"), opts, n_workers=1)
    assert_same_store(path2, tmp_path / "one")


def test_csv_with_ids_and_groups_and_parquet_agree(prefect_server, tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(600, 5)), columns=[f"f{i}" for i in range(5)])
    frame.insert(0, "person", np.arange(600) * 7 + 1000)
    frame["sex"] = np.where(rng.random(600) < 0.3, "female", "male")
    frame.to_csv(tmp_path / "people.csv", index=False)
    frame.to_parquet(tmp_path / "people.parquet", row_group_size=100)
    opts = IngestOptions(
        seed=1,
        n_hashes=4,
        n_tables=6,
        bucket_width=2.0,
        id_column="person",
        group_column="sex",
        chunk_rows=256,
    )
    res = run_ingest(str(tmp_path / "people.csv"), str(tmp_path / "a"), opts)
    run_ingest(str(tmp_path / "people.parquet"), str(tmp_path / "b"), opts)
    assert res["groups"] == {
        "female": int((frame.sex == "female").sum()),
        "male": int((frame.sex == "male").sum()),
    }
    arrays, attrs = snapshot(tmp_path / "a")
    assert np.array_equal(arrays["ids"], frame.person.to_numpy())
    # A table is standardised by default (every row is in the scaling sample of 600 rows).
    values = frame[[f"f{i}" for i in range(5)]].to_numpy().astype(np.float32).astype(np.float64)
    assert attrs["scale"]["method"] == "standard" and attrs["scale"]["fitted_rows"] == 600
    assert np.allclose(attrs["scale"]["center"], values.mean(0), rtol=0, atol=1e-12)
    assert np.allclose(attrs["scale"]["scale"], values.std(0), rtol=1e-12)
    assert np.allclose(arrays["points"], (values - values.mean(0)) / values.std(0), atol=1e-6)
    assert_same_store(tmp_path / "a", tmp_path / "b")
    out = sample_store(str(tmp_path / "a"), query_ids=[1007], radius=2.0, n_samples=5, seed=0)
    assert set(out["ids"]) <= set(frame.person) and len(out["ids"]) == 5


def test_failed_ingest_leaves_the_store_as_it_was_and_a_rerun_finishes(prefect_server, tmp_path):
    X = np.random.default_rng(1).normal(size=(900, 4)).astype(np.float32)
    np.save(tmp_path / "good.npy", X)
    opts = IngestOptions(seed=0, n_hashes=3, n_tables=4, bucket_width=2.0, chunk_rows=256)
    store = tmp_path / "s"
    run_ingest(str(tmp_path / "good.npy"), str(store), opts)
    before, attrs_before = snapshot(store)
    history_before = open_store(str(store)).history()
    more = np.random.default_rng(2).normal(size=(700, 4)).astype(np.float32)
    more[650, 2] = np.nan  # in the last chunk: earlier chunks are already written when it fails
    np.save(tmp_path / "bad.npy", more)
    with pytest.raises(Exception) as info:
        run_ingest(str(tmp_path / "bad.npy"), str(store), opts)
    assert "Row 651 of bad.npy holds a NaN value in column 3" in str(info.value)
    after, attrs_after = snapshot(store)
    assert attrs_after == attrs_before and open_store(str(store)).history() == history_before
    for name in ARRAYS:
        assert np.array_equal(before[name], after[name])
    assert open_store(str(store)).repo.list_branches() == {"main"}
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]  # the failed run's, removed
    # What an ingest killed by SIGKILL leaves (its staged keys), beside a folder of another
    # store's staging and one that is no staging: the next ingest of this store removes its own.
    killed = tmp_path / f".s{STAGING_MARK}k1ll3d_x"
    other = tmp_path / f".s2{STAGING_MARK}busy0001"
    lookalike = tmp_path / f".s{STAGING_MARK}mine.not"
    for folder in (killed, other, lookalike):
        folder.mkdir()
        (folder / "000000000000.npy").write_bytes(b"keys")
    more[650, 2] = 0.0
    np.save(tmp_path / "bad.npy", more)
    res = run_ingest(str(tmp_path / "bad.npy"), str(store), opts)
    assert res["n"] == 1600 and res["stale_staging_removed"] == 1
    assert not killed.exists() and other.exists() and lookalike.exists()
    arrays, _ = snapshot(store)
    assert np.array_equal(arrays["points"], np.vstack([X, more]))
    assert np.array_equal(arrays["ids"], np.arange(1600))


def test_wrong_dimension_and_duplicate_ids_for_an_existing_store(prefect_server, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((10, 3), np.float32) + np.arange(10)[:, None])
    np.save(tmp_path / "wide.npy", np.zeros((5, 4), np.float32))
    np.save(tmp_path / "ids.npy", np.arange(5) + 8)
    np.save(tmp_path / "b.npy", np.ones((5, 3), np.float32))
    opts = IngestOptions(n_hashes=2, n_tables=2, bucket_width=1.0)
    run_ingest(str(tmp_path / "a.npy"), str(tmp_path / "s"), opts)
    with pytest.raises(
        Exception, match="wide.npy holds 4-dimensional points; the store .* holds 3-dimensional"
    ):
        run_ingest(str(tmp_path / "wide.npy"), str(tmp_path / "s"), opts)
    with pytest.raises(Exception, match="Id 8 of b.npy is already in the store"):
        run_ingest(
            str(tmp_path / "b.npy"),
            str(tmp_path / "s"),
            IngestOptions(
                n_hashes=2, n_tables=2, bucket_width=1.0, ids_file=str(tmp_path / "ids.npy")
            ),
        )
    assert open_store(str(tmp_path / "s")).attrs()["n"] == 10


def test_not_a_store_and_a_second_writer(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("mine")
    with pytest.raises(NotAStoreError, match="is not a fairpipe store .*notes.txt"):
        open_store(str(tmp_path / "folder"), create=True)
    with pytest.raises(FairpipeInputError, match="There is no fairpipe store"):
        open_store(str(tmp_path / "nothing"))
    st = open_store(str(tmp_path / "s"), create=True)
    entered = threading.Event()
    release = threading.Event()

    def writer():
        with st.transaction("first"):
            entered.set()
            release.wait(10)

    th = threading.Thread(target=writer)
    th.start()
    entered.wait(10)
    try:
        with pytest.raises(StoreBusyError, match="is being written by another process .*pid"):
            with open_store(str(tmp_path / "s")).transaction("second"):
                pass
    finally:
        release.set()
        th.join()
    with open_store(str(tmp_path / "s")).transaction("third", lock_timeout=5):
        pass


def test_json_summary_is_serialisable(digits_store):
    _, result = digits_store
    parsed = json.loads(json.dumps(result, default=str))
    assert {"n", "d", "groups", "commit", "timings"} <= set(parsed)


def test_id_ranges_follow_appends_and_find_ids_from_the_chunks_that_may_hold_them(
    prefect_server, tmp_path
):
    """Each chunk of ids keeps its smallest and largest id through appends that start inside a
    chunk; finding a few ids reads only the chunks whose range may hold them; an append whose
    id clashes with an old chunk or the shared partial chunk is refused naming it; ranges
    written by a version that did not keep them (their ``rows`` behind ``n``) are not used."""
    from fairpipe.storage.arrays import read_array
    from fairpipe.storage.rows import ID_RANGES, StoredIds
    from fairpipe.storage.store import FairpipeStore

    rng = np.random.default_rng(5)
    ids = 10_000 + rng.permutation(100_000)[:1310]  # unsorted: wide ranges
    ids[:1000] = np.arange(1000) * 3  # increasing: narrow ranges, one chunk per id
    parts = [(0, 1000), (1000, 1300), (1300, 1310)]  # appends start inside chunks of 256
    for k, (a, b) in enumerate(parts):
        np.save(tmp_path / f"x{k}.npy", rng.normal(size=(b - a, 3)).astype(np.float32))
        np.save(tmp_path / f"i{k}.npy", ids[a:b])
    opts = dict(n_hashes=2, n_tables=2, bucket_width=1.0)
    run_ingest(str(tmp_path / "x0.npy"), str(tmp_path / "s"),
               IngestOptions(chunk_rows=256, ids_file=str(tmp_path / "i0.npy"), **opts))  # fmt: skip
    for k in (1, 2):
        run_ingest(str(tmp_path / f"x{k}.npy"), str(tmp_path / "s"),
                   IngestOptions(ids_file=str(tmp_path / f"i{k}.npy")))  # fmt: skip
    store = FairpipeStore.open(str(tmp_path / "s"))
    session = store.readonly_session()
    stored = read_array(session, "ids")
    ranges = read_array(session, ID_RANGES)
    chunks = [stored[a : a + 256] for a in range(0, 1310, 256)]
    assert np.array_equal(ranges, [[c.min(), c.max()] for c in chunks])

    found = StoredIds(session, 1310)
    rows, known = found.rows([ids[5], ids[700], -7])
    assert rows.tolist() == [5, 700] and known.tolist() == [True, True, False]
    assert found._all is None and sorted(found._chunks) == [0, 2]  # their chunks only
    rows, known = found.rows(ids)  # every chunk may hold one: all ids read once
    assert np.array_equal(rows, np.arange(1310)) and found._all is not None

    np.save(tmp_path / "two.npy", np.zeros((2, 3), np.float32))
    for clash in (int(ids[3]), int(ids[1301])):  # an old chunk; the partial last one
        np.save(tmp_path / "c.npy", np.array([10**9, clash]))
        with pytest.raises(Exception, match=f"Id {clash} of two.npy is already in the store"):
            run_ingest(str(tmp_path / "two.npy"), str(tmp_path / "s"),
                       IngestOptions(ids_file=str(tmp_path / "c.npy")))  # fmt: skip

    with store.transaction("an older writer") as txn:  # ranges left behind by another version
        txn.root[ID_RANGES].attrs["rows"] = 1000
    stale = StoredIds(store.readonly_session(), 1310)
    assert stale.ranges is None
    assert stale.rows([ids[1305]])[0].tolist() == [1305]


def test_kept_group_counts_are_not_used_once_another_version_wrote():
    """``live_per_group`` holds the ``n`` it was kept at: an older version's append moves ``n``
    (even when its earlier forget made the counts sum to ``n_alive`` again), and its forget
    makes them disagree with ``n_alive``: either way the groups are counted again."""
    from fairpipe.storage.rows import counts_of

    attrs = {"n": 20, "n_alive": 20, "live_per_group": {"rows": 20, "counts": [10, 10]}}
    assert counts_of(attrs).tolist() == [10, 10]
    assert counts_of({**attrs, "n_alive": 19}) is None  # forgot one
    assert counts_of({**attrs, "n": 21}) is None  # forgot one, appended one
    assert counts_of({**attrs, "live_per_group": [10, 10]}) is None
    assert counts_of({"n": 20, "n_alive": 20}) is None


def test_a_chunk_job_returns_bad_input_rather_than_raising_it_on_the_worker(tmp_path):
    """A worker logs an error a job raises, with its traceback, on the user's terminal: a chunk
    job returns its bad input instead, and the flow raises the first job's (jobs go in row order)."""
    from fairpipe.datasets import chunk_plan, plan_source
    from fairpipe.errors import FairpipeInputError
    from fairpipe.flows.jobs import BadInput, ingest_chunk, raise_bad_input

    X = np.ones((10, 3))
    X[3, 1] = X[8, 0] = np.nan
    np.save(tmp_path / "x.npy", X)
    plan = plan_source(str(tmp_path / "x.npy"))
    results = [ingest_chunk(None, chunk_plan(plan, a, b), None, a, b, 0, None, [])
               for a, b in ((5, 10), (0, 5))]  # fmt: skip
    assert [r[0] for r in results] == [None, None]
    assert all(isinstance(r[1], BadInput) for r in results)
    with pytest.raises(FairpipeInputError, match="^Row 9 of x.npy holds a NaN value in column 1"):
        raise_bad_input(results)


def test_a_first_ingest_that_fails_after_making_the_store_leaves_nothing(
    prefect_server, tmp_path, monkeypatch
):
    """The folders of the path it made, its repository, its staging: all removed; the error
    reaches the caller."""
    import os

    import fairpipe.flows.ingest

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fairpipe.flows.ingest, "index_new_rows", fail)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32))
    with pytest.raises(OSError, match="No space left"):
        run_ingest(str(tmp_path / "x.npy"), str(tmp_path / "a" / "b" / "c"),
                   IngestOptions(n_hashes=3, n_tables=4), n_workers=1, processes=False)  # fmt: skip
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]
