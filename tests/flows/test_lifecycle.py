"""Appends and deletions in any order leave every artifact equal to a fresh build on the live rows.

The flows run on real Prefect + Dask (threads, to keep hypothesis affordable; the worker-process
paths are the same functions and are covered by the other flow tests). After each sequence the
store's DC tree, fair summary, Q model and LSH index are compared exactly with those of a new
store built from its live rows (same seed, same options).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.datasets import make_blobs

from fairpipe.cluster import QKMeans
from fairpipe.errors import FairpipeInputError
from fairpipe.flows.fit import run_fit
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import FitOptions, ForgetOptions, IngestOptions, SummarizeOptions
from fairpipe.flows.status import store_status
from fairpipe.flows.summarize import run_summarize
from fairpipe.storage.arrays import open_group, read_array
from fairpipe.storage.index import index_entries
from fairpipe.storage.models import read_model
from fairpipe.storage.queue import pending
from fairpipe.storage.reader import open_reader
from fairpipe.storage.store import FairpipeStore
from fairpipe.storage.summary import has_summary
from fairpipe.storage.writes import write_rows

NAMES = np.array(["a", "b", "c"])
THREADS = dict(n_workers=1, processes=False)
LSH = dict(n_hashes=3, n_tables=4, bucket_width=3.0, chunk_rows=128, seed=4)
FIT = FitOptions(n_clusters=3, fanout=3, height=2, max_iter=4, n_init=2, seed=4)


def pool(n=900, seed=1):
    """Points, ids and group names to draw batches from."""
    X, _ = make_blobs(n_samples=n, n_features=4, centers=5, random_state=seed)
    rng = np.random.default_rng(seed)
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    return X.astype(np.float32), ids, NAMES[rng.integers(0, 3, size=n)]


def write_batch(folder, name, X, ids, labels):
    for suffix, arr in (("", X), ("_ids", ids), ("_groups", labels)):
        np.save(folder / f"{name}{suffix}.npy", arr)
    return str(folder / f"{name}.npy")


def ingest(folder, store, name, X, ids, labels, **lsh):
    src = write_batch(folder, name, X, ids, labels)
    opts = IngestOptions(ids_file=str(folder / f"{name}_ids.npy"),
                         groups_file=str(folder / f"{name}_groups.npy"), **lsh)  # fmt: skip
    return run_ingest(src, str(store), opts, **THREADS)


def summarize_options(folder):
    bounds = folder / "bounds.json"
    bounds.write_text(json.dumps({name: [1, 4] for name in NAMES}))
    return SummarizeOptions(k=6, bounds=str(bounds), fanout=3, height=2, eval_size=64, seed=4)


def artifacts(path) -> dict:
    """Every model array of the store, its live rows' sketch and its index as (key, id) pairs
    per table."""
    s = FairpipeStore.open(str(path)).readonly_session()
    out: dict = {}
    attrs = dict(FairpipeStore.open(str(path)).attrs(s))
    kind = attrs.get("model")
    if kind is not None:
        model = read_model(s, kind)
        for name, arr in model.to_arrays(data=False).items():
            out[f"model/{name}"] = np.asarray(arr)
    if has_summary(s):
        out["summary/ids"] = read_array(s, "summary/ids")
        for level in range(3):
            for name in ("candidates", "evaluation", "value", "calls"):
                out[f"summary/{level}/{name}"] = read_array(s, f"summary/level_{level}/{name}")
    alive = read_array(s, "alive")  # the live rows' sketch, by id
    out["sketch"] = read_array(s, "sketch")[alive][np.argsort(read_array(s, "ids")[alive])]
    for t, (keys, ids) in enumerate(index_entries(s)):
        out[f"index/{t}/keys"], out[f"index/{t}/ids"] = keys, ids
    return out


def head(path) -> str:
    return FairpipeStore.open(str(path)).history()[0]["id"]


def live_rows(path):
    st_ = FairpipeStore.open(str(path))
    s = st_.readonly_session()
    alive = read_array(s, "alive")
    names = np.array(st_.attrs(s)["group_names"])
    return (read_array(s, "points")[alive], read_array(s, "ids")[alive],
            names[read_array(s, "groups")[alive]])  # fmt: skip


def fresh_build(folder, path, model: str, summary: bool):
    """A new store built from ``path``'s live rows, with the same settings and artifacts."""
    X, ids, labels = live_rows(path)
    fresh = folder / f"fresh-{path.name}"
    ingest(folder, fresh, f"live-{path.name}", X, ids, labels, **LSH)
    if model:
        run_fit(str(fresh), FitOptions(**{**FIT.__dict__, "model": model}), **THREADS)
    if summary:
        run_summarize(str(fresh), summarize_options(folder), **THREADS)
    return fresh


def assert_kept_figures(path):
    """What a store keeps to avoid reading every row: the live rows per group (the root's
    ``live_per_group``) equal a count of every row, and each chunk of ids' ``id_ranges`` its
    smallest and largest id."""
    from fairpipe.storage.rows import ID_RANGES, counts_of, live_group_counts

    st_ = FairpipeStore.open(str(path))
    s = st_.readonly_session()
    attrs = st_.attrs(s)
    kept = counts_of(attrs)
    assert kept is not None
    assert kept.tolist() == live_group_counts(s, len(attrs["group_names"]))
    ids, chunk = read_array(s, "ids"), int(attrs["chunk_rows"])
    ranges = [[c.min(), c.max()] for c in np.split(ids, np.arange(chunk, ids.size, chunk))]
    assert np.array_equal(read_array(s, ID_RANGES), ranges)


def assert_same_artifacts(a, b):
    assert_kept_figures(a)
    assert_kept_figures(b)
    got, want = artifacts(a), artifacts(b)
    assert sorted(got) == sorted(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def run_sequence(folder, ops, model="dc", summary=True):
    """Ingest the first batch, fit (and summarize), then apply ``ops``: ("append", n) takes the
    next n rows of the pool, ("forget", fraction) forgets that fraction of the live ids."""
    X, ids, labels = pool()
    store = folder / "store"
    ingest(folder, store, "b0", X[:300], ids[:300], labels[:300], **LSH)
    if model:
        run_fit(str(store), FitOptions(**{**FIT.__dict__, "model": model}), **THREADS)
    if summary:
        run_summarize(str(store), summarize_options(folder), **THREADS)
    used, rng = 300, np.random.default_rng(len(ops))
    for i, (op, amount) in enumerate(ops):
        if op == "append" and used + amount <= X.shape[0]:
            sl = slice(used, used + amount)
            res = ingest(folder, store, f"b{i + 1}", X[sl], ids[sl], labels[sl])
            used += amount
            if model == "dc":
                assert 0 < res["leaves_recomputed"] <= 9
        elif op == "forget":
            _, live, _ = live_rows(store)
            n_gone = max(1, int(amount * live.shape[0]))
            if live.shape[0] - n_gone >= 60:
                run_forget(str(store), rng.choice(live, size=n_gone, replace=False), **THREADS)
    return store


def test_appends_and_forgets_equal_a_fresh_build(prefect_server, tmp_path):
    ops = [("append", 200), ("forget", 0.1), ("append", 7), ("forget", 0.02)]
    store = run_sequence(tmp_path, ops)
    assert_same_artifacts(store, fresh_build(tmp_path, store, "dc", True))


APPEND = st.tuples(st.just("append"), st.sampled_from([1, 40, 150]))
FORGET = st.tuples(st.just("forget"), st.sampled_from([0.01, 0.1, 0.3]))


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(st.one_of(APPEND, FORGET), min_size=2, max_size=4))
def test_random_interleavings_equal_a_fresh_build(prefect_server, tmp_path_factory, ops):
    folder = tmp_path_factory.mktemp("interleaving")
    store = run_sequence(folder, ops)
    assert_same_artifacts(store, fresh_build(folder, store, "dc", True))


def test_q_model_after_an_append_is_a_fresh_fit_and_forgets_as_the_estimator(
    prefect_server, tmp_path
):
    store = run_sequence(tmp_path, [("append", 150)], model="q", summary=False)
    fresh = fresh_build(tmp_path, store, "q", False)
    assert_same_artifacts(store, fresh)
    X, ids, _ = live_rows(store)
    model = QKMeans(**read_model(FairpipeStore.open(str(store)).readonly_session(), "q")
                    .get_params()).fit(X.astype(np.float64), ids=ids)  # fmt: skip
    run_forget(str(store), ids[:5], **THREADS)
    model.delete(ids[:5])
    stored = read_model(FairpipeStore.open(str(store)).readonly_session(), "q")
    assert np.array_equal(stored.centroids_, model.centroids_)


def test_bad_appends_write_nothing(prefect_server, tmp_path):
    X, ids, labels = pool(400)
    store = tmp_path / "store"
    ingest(tmp_path, store, "b0", X[:200], ids[:200], labels[:200], **LSH)
    run_summarize(str(store), summarize_options(tmp_path), **THREADS)
    before = head(store)

    def refused(match, **kw):
        with pytest.raises(FairpipeInputError, match=match):
            run_ingest(kw.pop("src"), str(store), IngestOptions(**kw), **THREADS)
        assert head(store) == before

    src = write_batch(tmp_path, "more", X[200:], ids[200:], labels[200:])
    extra = dict(ids_file=str(tmp_path / "more_ids.npy"))
    grouped = dict(extra, groups_file=str(tmp_path / "more_groups.npy"))
    refused("--seed 5 contradicts .* built with --seed 4", src=src, seed=5, **grouped)
    refused("--n-tables 9 contradicts", src=src, n_tables=9, **grouped)
    refused(
        "--bucket-width 1.5 contradicts .* --bucket-width 3.0", src=src, bucket_width=1.5, **grouped
    )
    refused("--chunk-rows 64 contradicts", src=src, chunk_rows=64, **grouped)
    refused("has groups \\(a, b, c\\).*--group-column .*--groups-file", src=src, **extra)
    np.save(tmp_path / "new_groups.npy", np.where(labels[200:] == "a", "z", labels[200:]))
    refused("group\\(s\\) \\['z'\\], which the summary", src=src,
            groups_file=str(tmp_path / "new_groups.npy"), **extra)  # fmt: skip
    np.save(tmp_path / "wide.npy", np.hstack([X[200:], X[200:, :1]]))
    refused("holds 5-dimensional points; the store .* holds 4", src=str(tmp_path / "wide.npy"),
            **grouped)  # fmt: skip
    # Settings equal to the store's are accepted, and a new group is added and reported (no
    # summary in this store).
    plain = tmp_path / "plain"
    ingest(tmp_path, plain, "p0", X[:200], ids[:200], labels[:200], **LSH)
    res = run_ingest(src, str(plain), IngestOptions(seed=4, n_hashes=3, bucket_width=3.0,
                     groups_file=str(tmp_path / "new_groups.npy"), **extra), **THREADS)  # fmt: skip
    assert res["new_groups"] == ["z"] and res["groups"]["z"] == int((labels[200:] == "a").sum())


def test_a_forget_never_leaves_a_row_in_a_bucket_its_key_does_not_name(prefect_server, tmp_path):
    """A forget finds each row's buckets by rehashing its point. Were the stored keys made by
    another definition (here: the point changed behind the store's back), the row would stay
    in its old bucket; the forget stops with an error naming the row and writes nothing."""
    X, ids, labels = pool(200)
    store = tmp_path / "store"
    ingest(tmp_path, store, "b0", X, ids, labels, **LSH)
    repo = FairpipeStore.open(str(store))
    with repo.transaction("tamper") as txn:
        write_rows(txn.session, "points", 7, X[7:8] + 50.0)
    before = head(store)
    with pytest.raises(RuntimeError, match="Row 7 is not in the bucket of table"):
        run_forget(str(store), [int(ids[7])], **THREADS)
    assert head(store) == before and pending(str(store)) == []  # withdrawn: the default
    # Kept (--unapplied keep), the request stays pending (nothing is lost): the next drain
    # meets it first, and stops the same way until the store is repaired.
    with pytest.raises(RuntimeError, match="Row 7 is not in the bucket of table"):
        run_forget(str(store), [int(ids[7])], ForgetOptions(unapplied="keep"), **THREADS)
    (kept,) = pending(str(store))
    with pytest.raises(RuntimeError, match="Row 7 is not in the bucket of table"):
        run_forget(str(store), [int(ids[8])], **THREADS)
    assert head(store) == before and pending(str(store)) == [kept]


@pytest.mark.parametrize("jobs", [False, True])
def test_a_store_with_float32_keys_forgets_a_row_its_recomputed_key_misses(
    prefect_server, tmp_path, monkeypatch, jobs
):
    """A store made before the exact keys (``lsh.projection`` absent: float32 keys, which on
    some BLAS depend on where a row sat in a block) may hold a row in a bucket other than the
    one its recomputed key names. Its forget reads that table's stored keys instead of stopping
    (a stopped forget would block the deletion queue for good): the row leaves the buckets it
    is in, and every other entry stays."""
    import fairpipe.flows.forget

    if jobs:  # the index rewrite as Dask jobs
        monkeypatch.setattr(fairpipe.flows.forget, "DISTRIBUTED_INDEX_ROWS", 1)
    X, ids, labels = pool(200)
    store = tmp_path / "store"
    ingest(tmp_path, store, "b0", X, ids, labels, **LSH)
    repo = FairpipeStore.open(str(store))
    with repo.transaction("made before the exact keys") as txn:
        lsh = dict(txn.root.attrs["lsh"])
        del lsh["projection"]
        txn.root.attrs["lsh"] = lsh
        write_rows(txn.session, "points", 7, X[7:8] + 50.0)  # its keys now miss its buckets
    before = index_entries(repo.readonly_session())
    layout = store_status(str(store))["layout"]
    assert layout["keys"] == "float32" and not layout["current"]
    run_forget(str(store), [int(ids[7]), int(ids[8])], **THREADS)
    after = index_entries(FairpipeStore.open(str(store)).readonly_session())
    for (k0, i0), (k1, i1) in zip(before, after, strict=True):
        keep = ~np.isin(i0, ids[[7, 8]])
        assert np.array_equal(k1, k0[keep]) and np.array_equal(i1, i0[keep])


def test_negative_ids_are_refused_at_ingest(prefect_server, tmp_path):
    X, ids, labels = pool(50)
    ids[7] = -3
    with pytest.raises(FairpipeInputError, match="Id -3 in row 8 of .* is negative"):
        ingest(tmp_path, tmp_path / "neg", "n", X, ids, labels, **LSH)
    assert not (tmp_path / "neg").exists()


def test_segmented_index_through_appends_and_forgets(prefect_server, tmp_path, monkeypatch):
    """With small segments (many per table), the index is re-cut as appends grow the store,
    patched by small appends and forgets, and always equals a fresh build."""
    import fairpipe.neighbors._segments as segments

    monkeypatch.setattr(segments, "TARGET_SEGMENT_ROWS", 16)
    ops = [("append", 400), ("forget", 0.1), ("append", 3), ("append", 150), ("forget", 0.01)]
    store = run_sequence(tmp_path, ops, model="", summary=False)
    attrs = FairpipeStore.open(str(store)).attrs()
    assert attrs["lsh"]["segment_bits"] >= 5
    assert_same_artifacts(store, fresh_build(tmp_path, store, "", False))


@pytest.mark.parametrize("jobs", [False, True])
def test_appends_fill_the_deltas_until_one_rebuilds(prefect_server, tmp_path, monkeypatch, jobs):
    """Appends of up to 1/8 of the rows go to delta layers (only the new layer and the ones it
    merges are written): a layer merges the newest ones holding no more rows than it; forgets
    reach rows in every layer; the append that would pass 1/8, or merge a layer of more than
    half of that, merges everything into the segments.
    Each state equals a fresh build. Small appends and forgets are done by the flow itself;
    ``jobs``: as Dask jobs, as large ones are. The indexed entries a delta or a rebuild reads
    back come a few tables at a time (as a large delta's do), here 20 entries; the flow builds
    its tables in three blocks on threads."""
    import fairpipe.flows.forget
    import fairpipe.flows.ingest
    import fairpipe.neighbors._segments as segments
    import fairpipe.storage.layers
    import fairpipe.storage.segments

    monkeypatch.setattr(segments, "TARGET_SEGMENT_ROWS", 16)
    monkeypatch.setattr(fairpipe.storage.segments, "READ_AHEAD_ENTRIES", 20)
    monkeypatch.setattr(fairpipe.storage.layers, "DELTA_SHARE", 8)
    monkeypatch.setattr(fairpipe.flows.ingest, "FLOW_THREADS", 3)
    if jobs:
        monkeypatch.setattr(fairpipe.flows.ingest, "LOCAL_ROWS", 0)
        monkeypatch.setattr(fairpipe.flows.ingest, "LOCAL_ENTRIES", 0)
        monkeypatch.setattr(fairpipe.flows.forget, "DISTRIBUTED_INDEX_ROWS", 1)
    X, ids, labels = pool(n=1000)
    store = tmp_path / "store"

    def deltas():
        lsh = FairpipeStore.open(str(store)).attrs()["lsh"]
        return [tuple(d) for d in lsh.get("deltas", [])]

    ingest(tmp_path, store, "b0", X[:800], ids[:800], labels[:800], **LSH)
    res = ingest(tmp_path, store, "b1", X[800:820], ids[800:820], labels[800:820])
    assert deltas() == [("delta_800", 800, 1)]  # 20 rows: 2 segments of ~16
    assert res["segments_written"] == LSH["n_tables"] << 1
    run_forget(str(store), [ids[3], ids[805], ids[819]], **THREADS)  # main and delta rows
    res = ingest(tmp_path, store, "b2", X[820:830], ids[820:830], labels[820:830])
    assert deltas() == [("delta_800", 800, 1), ("delta_820", 820, 0)]  # 20 rows > 10: kept
    assert res["segments_written"] == LSH["n_tables"]
    run_forget(str(store), [ids[801], ids[825]], **THREADS)  # rows of both deltas
    assert_same_artifacts(store, fresh_build(tmp_path, store, "", False))
    assert_every_array_is_its_real_extent(store)
    ingest(tmp_path, store, "b3", X[830:845], ids[830:845], labels[830:845])
    assert deltas() == [("delta_800", 800, 2)]  # 10 <= 15, then 20 <= 25: both merged
    lsh_group = open_group(FairpipeStore.open(str(store)).readonly_session())["lsh"]
    assert sorted(n for n in lsh_group.array_keys() if n.startswith("delta")) == [
        "delta_800", "delta_800_bucket_counts", "delta_800_lengths"]  # fmt: skip
    (tmp_path / "merged").mkdir()
    assert_same_artifacts(store, fresh_build(tmp_path / "merged", store, "", False))
    # 60 rows would merge the 45 into 105 rows, more than 3/4 of 900 / 8: a rebuild
    ingest(tmp_path, store, "b4", X[845:905], ids[845:905], labels[845:905])
    lsh = FairpipeStore.open(str(store)).attrs()["lsh"]
    assert "deltas" not in lsh and "delta_start" not in lsh and lsh["segment_bits"] == 6
    lsh_group = open_group(FairpipeStore.open(str(store)).readonly_session())["lsh"]
    assert not [name for name in lsh_group.array_keys() if name.startswith("delta")]
    (tmp_path / "later").mkdir()
    assert_same_artifacts(store, fresh_build(tmp_path / "later", store, "", False))
    assert_every_array_is_its_real_extent(store)


def assert_every_array_is_its_real_extent(store) -> None:
    """Every array of the store read whole, as a user inspecting it with zarr would: each
    layer's segments are (tables, segments, the longest rounded up to whole chunks), zeros after
    each segment's length (what they hold is compared with a fresh build elsewhere)."""
    import zarr

    from fairpipe.storage.layers import layer_arrays

    session = FairpipeStore.open(str(store)).readonly_session()
    root = zarr.open_group(session.store, mode="r")
    for name, node in root.members(max_depth=None):
        if isinstance(node, zarr.Array):
            assert node.nbytes < 1 << 30, (name, node.shape)
            node[...]  # noqa: B018 (a read of the whole array)
    layers = ["main"] + [
        d[0] for d in FairpipeStore.open(str(store)).attrs()["lsh"].get("deltas", [])
    ]
    for layer in layers:
        segments, lengths = (root[f"lsh/{n}"] for n in layer_arrays(layer)[:2])
        used = lengths[...]
        chunk = segments.chunks[2]
        assert segments.shape == (*used.shape, -(-int(used.max()) // chunk) * chunk)
        values = segments[...]
        for t, p in zip(*np.nonzero(used)):
            assert not values[t, p, used[t, p] :].any(), (layer, t, p)


def test_a_store_with_the_older_single_delta_is_read_and_merged(prefect_server, tmp_path):
    """A store written before the delta layers (one delta named ``delta``, attributes
    ``delta_bits``/``delta_start``): queries read it, a forget reaches its rows, and the next
    append merges it into a layer (its arrays dropped); every state equals a fresh build."""
    from fairpipe.storage.layers import layer_arrays
    from fairpipe.storage.segments import (
        create_index,
        drop_arrays,
        write_bucket_counts,
        write_segment_lengths,
    )
    from fairpipe.storage.writes import write_block

    X, ids, labels = pool()
    store = tmp_path / "store"
    ingest(tmp_path, store, "b0", X[:400], ids[:400], labels[:400], **LSH)
    ingest(tmp_path, store, "b1", X[400:420], ids[400:420], labels[400:420])
    st_ = FairpipeStore.open(str(store))
    with st_.transaction("as an older version wrote it") as txn:  # delta_400 -> delta
        lengths = read_array(txn.session, "lsh/delta_400_lengths")
        counts = read_array(txn.session, "lsh/delta_400_bucket_counts")
        width = -(-int(lengths.max()) // 65536) * 65536
        block = read_array(txn.session, "lsh/delta_400", (slice(None), slice(0, lengths.shape[1]),
                                                          slice(0, width)))  # fmt: skip
        create_index(txn.root, LSH["n_tables"], "delta")
        write_block(txn.session, "lsh/delta", (0, 0, 0), block)
        write_segment_lengths(txn.root, lengths, "delta")
        write_bucket_counts(txn.root, counts, "delta")
        drop_arrays(txn.root, layer_arrays("delta_400"))
        lsh = dict(txn.root.attrs["lsh"])
        (_, start, bits), *_ = lsh.pop("deltas")
        txn.root.attrs["lsh"] = {**lsh, "delta_bits": bits, "delta_start": start}
    reader = open_reader(str(store))
    assert "deltas" not in reader.attrs["lsh"]
    # rows of that delta, each finding itself (its own row kept in)
    found = reader.neighbourhood(query_rows=[405, 415], radius=4.0, include_query=True)
    assert ids[405] in found[0] and ids[415] in found[1]
    run_forget(str(store), [ids[3], ids[410]], **THREADS)
    assert_same_artifacts(store, fresh_build(tmp_path, store, "", False))
    ingest(tmp_path, store, "b2", X[420:440], ids[420:440], labels[420:440])  # 20 <= 20: merged
    lsh = FairpipeStore.open(str(store)).attrs()["lsh"]
    assert lsh["deltas"] == [["delta_400", 400, lsh["deltas"][0][2]]] and "delta_bits" not in lsh
    lsh_group = open_group(FairpipeStore.open(str(store)).readonly_session())["lsh"]
    assert not {"delta", "delta_lengths", "delta_bucket_counts"} & set(lsh_group.array_keys())
    (tmp_path / "later").mkdir()
    assert_same_artifacts(store, fresh_build(tmp_path / "later", store, "", False))
    assert_every_array_is_its_real_extent(store)
