"""fit / forget / predict flows on real Prefect + Dask, against the in-memory estimators."""

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from zarr.errors import ArrayNotFoundError

from fairpipe.cluster import DCKMeans, QKMeans
from fairpipe.datasets import read_ids
from fairpipe.flows.fit import run_fit
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import FitOptions, ForgetOptions, IngestOptions
from fairpipe.flows.predict import predict_store
from fairpipe.flows.sample import load_sampler
from fairpipe.neighbors import build_segments
from fairpipe.storage.erasure import set_retention
from fairpipe.storage.index import read_segments
from fairpipe.storage.layers import load_lsh
from fairpipe.storage.lock import StoreBusyError, WriterLock, lock_path_for
from fairpipe.storage.models import read_model
from fairpipe.storage.store import FairpipeStore

DC = dict(n_clusters=4, fanout=4, height=2, max_iter=5, n_init=3, seed=5)


def make_store(tmp_path, name="s", n=1500):
    X, _ = make_blobs(n_samples=n, n_features=6, centers=4, random_state=1)
    X = X.astype(np.float32)
    np.save(tmp_path / f"{name}.npy", X)
    np.save(tmp_path / f"{name}_ids.npy", np.arange(n) * 2 + 100)
    opts = IngestOptions(
        n_hashes=4, n_tables=8, chunk_rows=512, ids_file=str(tmp_path / f"{name}_ids.npy")
    )
    run_ingest(str(tmp_path / f"{name}.npy"), str(tmp_path / name), opts)
    return tmp_path / name, X, np.arange(n) * 2 + 100


def fit_options(**kw):
    p = {**DC, **kw}
    return FitOptions(
        n_clusters=p["n_clusters"], fanout=p["fanout"], height=p["height"], max_iter=p["max_iter"],
        n_init=p["n_init"], seed=p["seed"],
    )  # fmt: skip


def tree_of(path):
    st = FairpipeStore.open(str(path))
    stored = read_model(st.readonly_session(), "dc")
    assert isinstance(stored, DCKMeans)
    return stored.get_params(), stored.centroids_by_level_, stored.masses_by_level_


def assert_tree_equals(path, model: DCKMeans):
    _, C, M = tree_of(path)
    for level in range(len(C)):
        assert np.array_equal(C[level], model.centroids_by_level_[level]), level
        assert np.array_equal(M[level], model.masses_by_level_[level]), level


def test_fit_then_forget_equal_the_in_memory_tree_and_erase_the_rows(
    prefect_server, tmp_path, monkeypatch
):
    path, X, ids = make_store(tmp_path)
    run_fit(str(path), fit_options(), n_workers=2)
    model = DCKMeans(**DC).fit(X, ids=ids)
    assert_tree_equals(path, model)
    # One worker process gives the same tree.
    other, _, _ = make_store(tmp_path, "one")
    run_fit(str(other), fit_options(), n_workers=1)
    assert_tree_equals(other, model)

    gone = [ids[3], ids[700], ids[701], 999_999]
    res = run_forget(str(path), gone)
    assert res["deleted"] == sorted(map(int, gone[:3])) and res["unknown"] == [999_999]
    report = model.delete(gone[:3])
    assert res["leaves_recomputed"] == report.leaves_recomputed
    assert res["nodes_recomputed"] == report.nodes_recomputed
    assert_tree_equals(path, model)

    st = FairpipeStore.open(str(path))
    rows = [3, 700, 701]
    assert not st.read("alive")[rows].any() and (st.read("points")[rows] == 0).all()
    assert_index_is_a_fresh_build(path, X)
    assert st.attrs()["n_alive"] == X.shape[0] - 3
    nn, _ = load_sampler(str(path))
    assert not np.isin(rows, nn.index_.members).any()
    res = nn.sample(query_rows=[4], radius=50.0, n_samples=500, mode="buckets")
    assert not np.isin(np.asarray(gone[:3]), res.ids).any()
    # A larger batch goes to Dask (forced here): the same tree as the in-process path.
    import fairpipe.flows.update

    monkeypatch.setattr(fairpipe.flows.update, "LOCAL_LEAF_ROWS", 0)
    res = run_forget(str(path), [ids[50], ids[900]])
    report = model.delete([ids[50], ids[900]])
    assert res["leaves_recomputed"] == report.leaves_recomputed
    assert_tree_equals(path, model)
    assert_index_is_a_fresh_build(path, X)
    monkeypatch.undo()
    # Forgetting the same ids again changes no data: a request with its receipt only.
    points = FairpipeStore.open(str(path)).read("points")
    again = run_forget(str(path), gone[:3])
    assert again["deleted"] == [] and sorted(again["already_deleted"]) == sorted(gone[:3])
    assert np.array_equal(FairpipeStore.open(str(path)).read("points"), points)


def assert_index_is_a_fresh_build(path, X):
    """The stored segments (patched in place by forget) equal a build from scratch on the live
    rows, bit for bit, with nothing left past any segment's end."""
    st = FairpipeStore.open(str(path))
    s = st.readonly_session()
    attrs = st.attrs(s)
    rows = np.flatnonzero(st.read("alive"))
    keys = load_lsh(s, attrs).hash(X[rows])
    lengths, block = read_segments(s)
    bits = int(attrs["lsh"]["segment_bits"])
    counts = st.read("lsh/bucket_counts")
    for t in range(keys.shape[1]):
        flat, off = build_segments(keys[:, t], rows, bits)
        for p in range(1 << bits):
            assert np.array_equal(block[t, p, : lengths[t, p]], flat[off[p] : off[p + 1]]), (t, p)
            assert not block[t, p, lengths[t, p] :].any(), (t, p)
        assert counts[t] == flat[off[:-1]].sum(), t


def test_purge_history_leaves_no_snapshot_holding_the_forgotten_rows_whatever_the_retention(
    prefect_server, tmp_path
):
    path, X, ids = make_store(tmp_path, n=1200)
    st = FairpipeStore.open(str(path))

    def snapshots_with_row(row):
        """Messages of the snapshots whose points still hold ``row``."""
        found = []
        for snap in st.history():
            session = st.readonly_session(snap["id"])
            try:
                points = st.read("points", session=session)
            except ArrayNotFoundError:  # the repository's first snapshots, before any array
                continue
            if (points[row] != 0).any():
                found.append(snap["message"])
        return found

    set_retention(st, "24h")
    run_forget(str(path), [ids[3]])
    assert snapshots_with_row(3)  # within the retention, time travel still reads the erased row
    res = run_forget(str(path), [ids[10]], ForgetOptions(purge_history=True))
    purged = res["purged"]
    assert purged["snapshots_after"] == 2 < purged["snapshots_before"]
    assert purged["chunks_deleted"] > 0 and purged["bytes_deleted"] > 0
    assert snapshots_with_row(3) == [] and snapshots_with_row(10) == []
    # The tip is intact: every other row, the erased groups, and sampling still work.
    st = FairpipeStore.open(str(path))
    keep = np.setdiff1d(np.arange(1200), [3, 10])
    assert np.array_equal(st.read("points")[keep], X[keep])
    assert st.read("groups")[[3, 10]].tolist() == [-1, -1]
    assert_index_is_a_fresh_build(path, X)
    nn, _ = load_sampler(str(path))
    assert not np.isin([ids[3], ids[10]], nn.sample(query_rows=[4], radius=50.0, n_samples=300,
                                                    mode="buckets").ids).any()  # fmt: skip


def res_commit(path):
    return FairpipeStore.open(str(path)).history()[0]["id"]


def test_crash_mid_forget_leaves_the_last_commit_and_a_rerun_finishes(
    prefect_server, tmp_path, monkeypatch
):
    path, X, ids = make_store(tmp_path)
    run_fit(str(path), fit_options(), n_workers=1, processes=False)
    st = FairpipeStore.open(str(path))
    before = {n: st.read(n) for n in ("points", "alive", "lsh/segment_lengths")}
    before["segments"] = read_segments(st.readonly_session())[1]
    history = st.history()

    import fairpipe.flows.update

    def boom(*args, **kwargs):
        raise RuntimeError("injected crash after the rows were erased and the index rebuilt")

    monkeypatch.setattr(fairpipe.flows.update, "refresh_levels", boom)
    with pytest.raises(Exception, match="injected crash"):
        run_forget(str(path), [ids[5]], n_workers=1, processes=False)
    st = FairpipeStore.open(str(path))
    assert st.history() == history
    for name, arr in before.items():
        now = read_segments(st.readonly_session())[1] if name == "segments" else st.read(name)
        assert np.array_equal(now, arr), name
    monkeypatch.undo()
    run_forget(str(path), [ids[5]], n_workers=1, processes=False)
    assert_tree_equals(path, DCKMeans(**DC).fit(np.delete(X, 5, 0), ids=np.delete(ids, 5)))


def test_q_model_fit_and_forget_match_the_estimator(prefect_server, tmp_path):
    path, X, ids = make_store(tmp_path, n=3000)
    params = dict(n_clusters=4, epsilon=0.5, balance=0.2, max_iter=8, seed=2)
    fitted = run_fit(
        str(path), FitOptions(n_clusters=4, model="q", epsilon=0.5, max_iter=8, seed=2)
    )
    model = QKMeans(**params).fit(X, ids=ids)
    assert fitted["certification_rate"] == model.certification_rate()
    p = predict_store(str(path), queries=X[:50])
    assert p["model"] == "q" and p["clusters"] == model.predict(X[:50]).tolist()
    gone = [i for i in ids[10:14] if i not in model.seed_ids_]
    res = run_forget(str(path), gone)
    report = model.delete(gone)
    assert res["certified"] == report.certified and res["retrained"] == report.retrained
    p = predict_store(str(path), queries=X[:50])
    assert p["clusters"] == model.predict(X[:50]).tolist()


def test_forget_without_a_model_and_bad_inputs(prefect_server, tmp_path):
    path, X, ids = make_store(tmp_path)
    res = run_forget(str(path), [ids[0]])  # LSH-only forget works without a fitted model
    assert res["deleted"] == [int(ids[0])] and res["model"] is None
    with pytest.raises(Exception, match="has no fitted model"):
        predict_store(str(path), query_rows=[1])
    with pytest.raises(Exception, match="None of the 2 ids to forget is in the store"):
        run_forget(str(path), [1, 3])
    with pytest.raises(Exception, match="n_clusters = 5000 is larger than the 1499 live points"):
        run_fit(str(path), FitOptions(n_clusters=5000))
    with pytest.raises(Exception, match="'balance' parameter of QKMeans must be in"):
        run_fit(str(path), FitOptions(n_clusters=3, model="q", balance=1.0))
    with pytest.raises(Exception, match="Id 'x' in --ids is not an integer"):
        read_ids(text="1,x")
    with pytest.raises(Exception, match="does not exist"):
        read_ids(path=str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(Exception, match="holds no ids"):
        read_ids(path=str(tmp_path / "empty.txt"))
    assert read_ids(text="4, 5,6").tolist() == [4, 5, 6]
    with WriterLock(lock_path_for(str(path), path), str(path), 0.0):
        with pytest.raises(StoreBusyError):
            run_forget(str(path), [ids[1]], ForgetOptions(lock_timeout=0.0))
    assert FairpipeStore.open(str(path)).read("alive")[1]
