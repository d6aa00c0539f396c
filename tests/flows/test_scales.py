"""An index in scales: built by ingest up to --max-radius, extended by
:func:`fairpipe.storage.scales.add_scales` over every layer and live row as a fresh hash of the
live rows gives it, kept through appends and forgets, and read one scale at a time."""

from __future__ import annotations

import numpy as np
import pytest

from fairpipe import FairpipeInputError
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import IngestOptions
from fairpipe.neighbors import true_balls
from fairpipe.storage.arrays import open_group, read_array
from fairpipe.storage.index import index_entries
from fairpipe.storage.layers import deltas_of, load_lsh
from fairpipe.storage.reader import open_reader
from fairpipe.storage.scales import add_scales
from fairpipe.storage.store import FairpipeStore

THREADS = dict(n_workers=1, processes=False)


def clusters(n: int, seed: int) -> np.ndarray:
    """Points in clusters of three spreads (a radius fits one, not the others)."""
    rng = np.random.default_rng(seed)
    centres = 12 * rng.normal(size=(6, 8))
    label = rng.integers(6, size=n)
    spread = np.array([0.3, 1.0, 3.0])[label % 3]
    return (rng.normal(size=(n, 8)) * spread[:, None] + centres[label]).astype(np.float32)


def expected_entries(session) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every table's (key, id) pairs sorted, from the stored hash functions applied to the
    live rows afresh: what the index must hold."""
    attrs = dict(open_group(session).attrs)
    lsh = load_lsh(session, attrs)
    alive = read_array(session, "alive")
    ids = read_array(session, "ids")[alive]
    keys = lsh.hash(read_array(session, "points")[alive])
    out = []
    for t in range(keys.shape[1]):
        order = np.lexsort((ids, keys[:, t]))
        out.append((keys[order, t], ids[order]))
    return out


def same_entries(got, want) -> None:
    assert len(got) == len(want)
    for t, ((k0, i0), (k1, i1)) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(k0, k1) and np.array_equal(i0, i1), f"table {t}"


def test_scales_added_to_a_store_with_deltas_and_forgotten_rows_equal_a_fresh_hash(
    prefect_server, tmp_path
):
    """A store with a main layer, a delta and forgotten rows, extended by two scales: its old
    tables are as they were, its new ones hold every live row (each in its own layer) as the
    hash functions put them, and a forget after the extension removes rows from every table."""
    X = clusters(6000, 0)
    np.save(tmp_path / "a.npy", X[:5000])
    np.save(tmp_path / "b.npy", X[5000:])
    np.save(tmp_path / "b_ids.npy", np.arange(5000, 6000, dtype=np.int64))
    store = tmp_path / "s"
    opts = IngestOptions(seed=3, max_radius=None, chunk_rows=1024)
    first = run_ingest(str(tmp_path / "a.npy"), str(store), opts, **THREADS)
    r = first["lsh"]["radius"]
    assert first["lsh"]["max_radius"] == pytest.approx(4 * r)
    assert [s[0] for s in first["lsh"]["scales"]] == pytest.approx([r, 2 * r, 4 * r])
    run_ingest(str(tmp_path / "b.npy"), str(store), IngestOptions(ids_file=str(tmp_path / "b_ids.npy")),
               **THREADS)  # fmt: skip
    run_forget(str(store), [3, 4000, 5001], **THREADS)
    st = FairpipeStore.open(str(store))
    assert deltas_of(st.attrs()), "the append should have made a delta layer"
    before = index_entries(st.readonly_session())
    old_tables = len(before)

    res = add_scales(st, 16 * r)
    assert [s[0] for s in res["added"]] == pytest.approx([8 * r, 16 * r])
    assert res["before"] == pytest.approx(4 * r) and res["n_tables"] > old_tables
    session = FairpipeStore.open(str(store)).readonly_session()
    after = index_entries(session)
    same_entries(after[:old_tables], before)
    same_entries(after, expected_entries(session))
    attrs = FairpipeStore.open(str(store)).attrs()
    assert attrs["lsh"]["max_radius"] == pytest.approx(16 * r)
    assert sum(s[2] for s in attrs["lsh"]["scales"]) == attrs["lsh"]["n_tables"]

    again = add_scales(FairpipeStore.open(str(store)), 10 * r)  # already reached: nothing
    assert again["added"] == [] and again["commit"] is None

    run_forget(str(store), [7, 5002], **THREADS)
    session = FairpipeStore.open(str(store)).readonly_session()
    after = index_entries(session)
    same_entries(after, expected_entries(session))
    assert not any(np.isin([7, 5002, 3, 4000, 5001], ids).any() for _, ids in after)

    # An append after the extension hashes its rows into every scale's tables.
    np.save(tmp_path / "c.npy", clusters(300, 5))
    np.save(tmp_path / "c_ids.npy", np.arange(9000, 9300, dtype=np.int64))
    run_ingest(str(tmp_path / "c.npy"), str(store), IngestOptions(ids_file=str(tmp_path / "c_ids.npy")),
               **THREADS)  # fmt: skip
    session = FairpipeStore.open(str(store)).readonly_session()
    same_entries(index_entries(session), expected_entries(session))


def test_every_radius_of_the_range_reaches_its_ball_and_beyond_it_says_so(prefect_server, tmp_path):
    """At r, 2 r, 4 r and between them, the samples come from (nearly) everyone within the
    radius: the mean share of B(q, radius) among the found points is at least the recall
    target less its sampling spread; the reader's ``reach`` says which radii are in range."""
    X = clusters(8000, 1)
    np.save(tmp_path / "x.npy", X)
    store = tmp_path / "s"
    res = run_ingest(str(tmp_path / "x.npy"), str(store), IngestOptions(seed=1), **THREADS)
    r = res["lsh"]["radius"]
    reader = open_reader(str(store))
    rng = np.random.default_rng(2)
    queries = rng.choice(X.shape[0], 60, replace=False)
    for factor in (0.5, 1.0, 1.5, 2.0, 3.0, 4.0):
        radius = factor * r
        balls = true_balls(X, X[queries], radius)
        found = reader.neighbourhood(query_rows=queries, radius=radius, include_query=True)
        shares = [np.isin(b, f).mean() for b, f in zip(balls, found) if b.size > 1]
        assert len(shares) >= 20, factor
        assert np.mean(shares) >= 0.95, (factor, np.mean(shares))
        reach = reader.reach(radius)
        assert reach["in_range"] and reach["expected_recall"] >= 0.98 - 1e-9, (factor, reach)
    beyond = reader.reach(8 * r)
    assert beyond["in_range"] is False and beyond["expected_recall"] < 0.98
    assert beyond["max_radius"] == pytest.approx(4 * r)


def test_a_largest_radius_below_the_radius_is_refused(prefect_server, tmp_path):
    np.save(tmp_path / "x.npy", clusters(500, 2))
    with pytest.raises(FairpipeInputError, match="--max-radius 0.01 is below --radius 1"):
        run_ingest(str(tmp_path / "x.npy"), str(tmp_path / "s"),
                   IngestOptions(radius=1.0, max_radius=0.01), **THREADS)  # fmt: skip
