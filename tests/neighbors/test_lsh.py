import math

import numpy as np
import pytest

from fairpipe import E2LSH, FairpipeInputError
from fairpipe.hashing import splitmix64
from fairpipe.neighbors import BucketIndex, KeyDirectory, build_table, remove_rows
from fairpipe.neighbors._key_directory import home_slots
from fairpipe.neighbors._lsh import COMPILED_FOLD_ROWS
from fairpipe.neighbors._segments import (
    NotInBucket,
    build_segments,
    entries,
    mix,
    pack,
    patch,
    segment_of,
)


def data(n=3000, d=24, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def test_same_seed_same_keys_other_seed_other_keys():
    X = data()
    a = E2LSH(n_hashes=6, n_tables=12, bucket_width=3.0, seed=5).fit(X).hash(X)
    b = E2LSH(n_hashes=6, n_tables=12, bucket_width=3.0, seed=5).fit(X).hash(X)
    c = E2LSH(n_hashes=6, n_tables=12, bucket_width=3.0, seed=6).fit(X).hash(X)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("chunk", [1, 7, 256, 777, 3000])
def test_keys_do_not_depend_on_chunking(chunk):
    X = data()
    lsh = E2LSH(n_hashes=15, n_tables=30, bucket_width=2.0, seed=1).fit(X)
    whole = lsh.hash(X)
    parts = np.vstack([lsh.hash(X[i : i + chunk]) for i in range(0, X.shape[0], chunk)])
    assert np.array_equal(whole, parts)


def exact_reference_keys(lsh: E2LSH, X: np.ndarray) -> np.ndarray:
    """Keys by the exact definition, in plain Python: each cell the floor of the float64 sum,
    in coordinate order, of x_j * (a_j / w) (float32 operands, exact products) plus b / w,
    clamped to +-2**62."""
    a, b = lsh._scaled_a.astype(np.float64), lsh._scaled_b.astype(np.float64)
    k, L = lsh.n_hashes, lsh.n_tables
    acc = np.zeros((X.shape[0], L), dtype=np.uint64)
    for i in range(X.shape[0]):
        for t in range(L):
            total = 0
            for h in range(k):
                c = t * k + h
                v = 0.0
                for j in range(X.shape[1]):
                    v += float(X[i, j]) * float(a[j, c])
                cell = min(max(math.floor(v + float(b[c])), -(2**62)), 2**62)  # clamped
                total = (total + (cell % 2**64) * int(lsh.multipliers_[h])) % 2**64
            acc[i, t] = total
    prefix = np.arange(L, dtype=np.uint64) << np.uint64(48)
    return (splitmix64(acc) & np.uint64((1 << 48) - 1)) | prefix


@pytest.mark.parametrize("width", [1e-4, 2.0])  # nearly every cell near an integer; a few
@pytest.mark.parametrize("n", [300, COMPILED_FOLD_ROWS + 300])  # the numpy and compiled folds
def test_keys_are_the_exact_definition_wherever_a_row_sits(width, n, monkeypatch):
    """A row's keys do not depend on its place in a batch, the batch's size or the BLAS
    threads: BLAS's float32 product does (on some CPUs by the row's position in the block), so
    cells near an integer are decided by the in-order float64 sum. Checked against a plain
    Python reference of the definition, at offsets that move rows within their blocks."""
    from fairpipe.neighbors import _segments

    monkeypatch.setattr(_segments, "KERNELS_WARM", False)  # n picks the fold
    X = data(n=n + 40, d=24, seed=7)
    lsh = E2LSH(n_hashes=5, n_tables=8, bucket_width=width, seed=2).fit(X)
    want = exact_reference_keys(lsh, X[:40])
    first = lsh.hash(X[:n])
    for s in (1, 5, 13, 37):
        got = lsh.hash(X[s : s + n])
        assert np.array_equal(got[: 40 - s], want[s:]), s
        assert np.array_equal(got[: n - s], first[s:]), s
    assert np.array_equal(first[:40], want)
    assert np.array_equal(np.vstack([lsh.hash(X[i : i + 1]) for i in range(40)]), want)


@pytest.mark.parametrize("by_table", [False, True])
def test_keys_hashed_on_threads_are_those_of_one_thread(by_table, monkeypatch):
    """hash_validated on several threads (the flow's own append) splits the rows in ranges of
    whole blocks: every key equals the one-thread key, for sizes that leave a partial block, a
    range per thread or fewer ranges than threads, and both projections."""
    from concurrent.futures import ThreadPoolExecutor as Pool

    from fairpipe.neighbors import _lsh, _segments

    monkeypatch.setattr(_segments, "KERNELS_WARM", True)  # the compiled fold at every size
    X = data(n=3 * _lsh.THREAD_ROWS + 77, d=20, seed=11)
    started = []  # the thread ranges taken

    class Counted(Pool):
        def submit(self, fn, *args, **kwargs):
            started.append(args[1:3])
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr("concurrent.futures.ThreadPoolExecutor", Counted)
    for projection in ("exact", "float32"):
        lsh = E2LSH(n_hashes=5, n_tables=7, bucket_width=0.9, seed=4, projection=projection).fit(X)
        for n in (1, _lsh.THREAD_ROWS * 2 - 1, _lsh.THREAD_ROWS * 2, X.shape[0]):
            want = lsh.hash_validated(X[:n], by_table=by_table)
            for threads in (2, 3, 8):
                started.clear()
                got = lsh.hash_validated(X[:n], by_table=by_table, threads=threads)
                assert np.array_equal(got, want), (projection, n, threads)
                parts = min(threads, n // _lsh.THREAD_ROWS)
                assert len(started) == (parts if parts > 1 else 0)
                if started:  # contiguous ranges of whole blocks covering every row
                    assert started[0][0] == 0 and started[-1][1] == n
                    assert all(b == c for (_, b), (c, _) in zip(started, started[1:]))
                    assert all(a % _lsh.ROW_BLOCK == 0 for a, _ in started)


def test_a_float32_product_that_overflows_is_summed_in_float64():
    """Finite points whose float32 product overflows (inf - inf: NaN) while the exact sum is
    small: both folds take the in-order float64 sum (found by a review: the numpy fold kept
    the NaN cell)."""
    lsh = E2LSH(n_hashes=4, n_tables=16, bucket_width=1.0, seed=3).fit(2)
    a = lsh._scaled_a
    c = int(np.flatnonzero((np.abs(a[0]) > 1.2) & (np.abs(a[1]) > 1.2))[0])
    scale = 2.0**128 / 2.0 ** float(np.ceil(np.log2(float(np.abs(a[:, c]).max()))))
    x = np.array([[np.sign(a[0, c]) * abs(a[1, c]) * scale,
                   -np.sign(a[1, c]) * abs(a[0, c]) * scale]], np.float32)  # fmt: skip
    assert np.isfinite(x).all()
    with np.errstate(all="ignore"):
        assert not np.isfinite((x @ a)[0, c])
        want = exact_reference_keys(lsh, x)
        assert np.array_equal(lsh.hash(x), want)  # the numpy fold
        assert np.array_equal(lsh.hash(np.repeat(x, COMPILED_FOLD_ROWS + 1, axis=0))[:1], want)


def test_many_near_cells_at_a_large_dimension_stay_small():
    """At d = 2,000 with points far from the origin most cells are near an integer (the
    bound grows with d and ||x||): the numpy fold sums them in parts (it took 5.7 GiB for one
    block at once) and still gives the definition."""
    X = (np.random.default_rng(2).normal(size=(60, 2000)) + 10.0).astype(np.float32)
    lsh = E2LSH(n_hashes=3, n_tables=4, bucket_width=4.0, seed=1).fit(X)
    assert np.array_equal(lsh.hash(X[:5]), exact_reference_keys(lsh, X[:5]))


def test_the_float32_projection_of_older_stores_is_kept():
    """Stores made before the exact projection keep their keys' definition: floor of the
    float32 product plus the float32 offset (same batch, so the same BLAS sums)."""
    X = data(n=500, d=12, seed=3)
    lsh = E2LSH(n_hashes=4, n_tables=6, bucket_width=0.7, seed=1, projection="float32").fit(X)
    block = np.zeros((256, 12), np.float32)
    block[:200] = X[:200]
    proj = np.matmul(block, lsh._scaled_a)[:200]
    proj += lsh._scaled_b
    cells = np.floor(proj).astype(np.int64).view(np.uint64).reshape(200, 6, 4)
    folded = np.einsum("ntk,k->nt", cells, lsh.multipliers_)
    prefix = np.arange(6, dtype=np.uint64) << np.uint64(48)
    want = (splitmix64(folded) & np.uint64((1 << 48) - 1)) | prefix
    assert np.array_equal(lsh.hash(X[:200]), want)
    with pytest.raises(FairpipeInputError, match="'projection' parameter of E2LSH"):
        E2LSH(projection="float64").fit(X)


def test_keys_match_a_scalar_reference():
    X = data(n=50, d=5)
    lsh = E2LSH(n_hashes=3, n_tables=4, bucket_width=1.5, seed=2).fit(X)
    keys = lsh.hash(X)
    cells = np.floor((X.astype(np.float64) @ lsh.projections_ + lsh.offsets_) / lsh.bucket_width)
    cells = cells.reshape(50, 4, 3)
    # Two points share a table's key exactly when they share all k cells of that table.
    for t in range(4):
        same_cells = (cells[:, None, t, :] == cells[None, :, t, :]).all(-1)
        same_keys = keys[:, None, t] == keys[None, :, t]
        assert np.array_equal(same_cells, same_keys)
    assert np.array_equal(keys >> np.uint64(48), np.tile(np.arange(4, dtype=np.uint64), (50, 1)))


def test_bucket_index_finds_every_bucket_mate():
    X = data(n=800, d=4)
    lsh = E2LSH(n_hashes=2, n_tables=5, bucket_width=2.0, seed=0).fit(X)
    keys = lsh.hash(X)
    index = BucketIndex.build(keys)
    lo, size = index.lookup(keys[17])
    for t in range(5):
        mates = np.sort(index.members[lo[t] : lo[t] + size[t]])
        assert np.array_equal(mates, np.flatnonzero(keys[:, t] == keys[17, t]))
    lo, size = index.lookup(np.array([12345], dtype=np.uint64))
    assert size[0] == 0


def test_build_table_leaves_out_dead_rows():
    keys = np.array([4, 4, 9, 4], dtype=np.uint64)
    k, s, m = build_table(keys, alive=np.array([True, False, True, True]))
    assert k.tolist() == [4, 9] and s.tolist() == [0, 2, 3] and m.tolist() == [0, 3, 2]


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_hashes": 0}, "'n_hashes' parameter of E2LSH must be a positive integer"),
        ({"n_tables": -3}, "'n_tables' parameter of E2LSH must be an integer from 1 to 65535"),
        ({"bucket_width": 0.0}, "'bucket_width' parameter of E2LSH must be a positive float"),
        ({"bucket_width": float("nan")}, "'bucket_width' parameter of E2LSH must be a positive"),
    ],
)
def test_bad_parameters(params, match):
    with pytest.raises(FairpipeInputError, match=match):
        E2LSH(**{"n_hashes": 2, "n_tables": 2, "bucket_width": 1.0, **params}).fit(3)


def test_hash_rejects_wrong_dimension_and_nan():
    lsh = E2LSH(n_hashes=2, n_tables=2, bucket_width=1.0).fit(3)
    with pytest.raises(FairpipeInputError, match="4 values per row; 3-dimensional"):
        lsh.hash(np.zeros((2, 4)))
    bad = np.zeros((3, 3))
    bad[2, 1] = np.inf
    with pytest.raises(
        FairpipeInputError, match="Row 3 of E2LSH.hash holds an inf value in column 2"
    ):
        lsh.hash(bad)


def test_float64_fold_equals_the_wrapping_uint64_fold():
    """The fast exact fold and the uint64 fallback (used for huge cells) give the same keys."""
    X = np.random.default_rng(4).normal(scale=50.0, size=(600, 9)).astype(np.float32)
    lsh = E2LSH(n_hashes=7, n_tables=12, bucket_width=0.5, seed=2).fit(X)
    fast = lsh.hash(X)
    lsh._cell_limit = 0.0  # force the fallback
    assert np.array_equal(fast, lsh.hash(X))
    # Cells beyond the exact range (width tiny against the data) take the fallback and still hash.
    tiny = E2LSH(n_hashes=7, n_tables=12, bucket_width=1e-9, seed=2).fit(X)
    keys = tiny.hash(X)
    assert len(np.unique(keys[:, 0])) == X.shape[0]


def test_point_buckets_agree_with_the_key_lookup():
    X = data(n=2000, d=6)
    keys = E2LSH(n_hashes=3, n_tables=7, bucket_width=1.5, seed=3).fit(X).hash(X)
    alive = np.ones(2000, bool)
    alive[::5] = False
    index = BucketIndex.build(keys, alive)
    pb = index.point_buckets(2000)
    assert np.array_equal(pb[alive], index.find(keys[alive]))
    assert (pb[~alive] == -1).all()
    # A bucket number's key is the key: same table, same bucket.
    assert np.array_equal(index.bucket_keys[pb[alive]], keys[alive])


def _reference_find(sorted_keys, q):
    pos = np.minimum(np.searchsorted(sorted_keys, q), sorted_keys.size - 1)
    return np.where(sorted_keys[pos] == q, pos, -1)


def test_key_directory_matches_binary_search():
    rng = np.random.default_rng(4)
    keys = np.unique(rng.integers(0, 2**63, size=200_000, dtype=np.uint64))
    d = KeyDirectory.build(keys)
    q = np.concatenate(
        [keys[rng.integers(0, keys.size, 5000)], rng.integers(0, 2**63, 5000, dtype=np.uint64)]
    )
    assert np.array_equal(d.find(q), _reference_find(keys, q))


def test_key_directory_handles_long_probe_runs():
    # Keys chosen to share a few home slots: probe runs far longer than the lookup window.
    rng = np.random.default_rng(5)
    cand = np.unique(rng.integers(0, 2**63, size=400_000, dtype=np.uint64))
    bits = (2 * 300 - 1).bit_length()
    keys = np.sort(cand[np.isin(home_slots(cand, bits), [3, 4, 90])][:300])
    assert keys.size == 300
    d = KeyDirectory.build(keys)
    assert d.bits == bits and d.long_run.any()
    q = np.concatenate([keys, cand[~np.isin(cand, keys)][:2000]])
    assert np.array_equal(d.find(q), _reference_find(keys, q))


@pytest.mark.parametrize("seed", range(5))
def test_removing_rows_gives_the_table_a_fresh_build_gives(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    keys = rng.integers(0, int(rng.integers(1, 60)), size=n).astype(np.uint64)
    alive = rng.random(n) < 0.8
    dead = alive & (rng.random(n) < rng.choice([0.05, 0.5, 1.0]))  # sometimes every row
    got = remove_rows(*build_table(keys, alive), dead)
    want = build_table(keys, alive & ~dead)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def test_a_removal_checks_each_row_is_in_its_keys_bucket():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 40, size=300).astype(np.uint64)
    flat, offsets = build_segments(keys, np.arange(300), bits=0)
    seg, h = flat[offsets[0] : offsets[1]], mix(keys)
    rows = np.array([260, 5, 17])  # any order
    kept = np.setdiff1d(np.arange(300), rows)
    fresh = build_segments(keys[kept], kept, bits=0)[0]
    assert np.array_equal(patch(seg, 0, rows, removed_h=h[rows]), fresh)
    other = h[rows].copy()
    other[2] = h[(keys != keys[17]).argmax()]  # row 17 under another bucket's key
    with pytest.raises(NotInBucket) as e:
        patch(seg, 0, rows, removed_h=other)
    assert e.value.row == 17
    with pytest.raises(NotInBucket) as e:  # not a member at all
        patch(seg, 0, np.array([5, 300]), removed_h=h[[5, 17]])
    assert e.value.row == 300
    with pytest.raises(NotInBucket):  # an empty segment
        patch(np.zeros(1, np.int32), 0, np.array([0]), removed_h=h[:1])
    with pytest.raises(NotInBucket) as e:  # a row given twice is not in its bucket twice
        patch(seg, 0, np.array([17, 5, 5]), removed_h=h[[17, 5, 5]])
    assert e.value.row == 5


@pytest.mark.parametrize("seed", range(20))
def test_a_patched_segment_is_the_segment_a_fresh_build_gives(seed):
    # patch() finds each removed row in its own bucket (a binary search by (bucket, row)):
    # compared with a fresh build of the remaining entries, segment by segment, and with the
    # NotInBucket error naming the first bad row (in the order given) when one is not there.
    rng = np.random.default_rng(seed)
    n, bits = int(rng.integers(1, 3000)), int(rng.integers(0, 3))
    keys = rng.integers(0, int(rng.integers(1, 300)), size=n).astype(np.uint64)
    rows = np.sort(rng.choice(2**31 - 1, n, replace=False))
    flat, offsets = build_segments(keys, rows, bits=bits)
    h = mix(keys)
    gone = rng.choice(n, int(rng.integers(1, n + 1)), replace=False)  # any order
    kept = np.setdiff1d(np.arange(n), gone)
    fresh, fresh_offsets = build_segments(keys[kept], rows[kept], bits=bits)
    seg_of = segment_of(h[gone], bits)
    for p in range(1 << bits):
        seg = flat[offsets[p] : offsets[p + 1]]
        mine = gone[seg_of == p]
        want = fresh[fresh_offsets[p] : fresh_offsets[p + 1]]
        got = patch(seg, bits, rows[mine], removed_h=h[mine]) if mine.size else seg
        assert got.dtype == np.int32 and np.array_equal(got, want)
        if mine.size:
            bad = rows[mine].copy()
            bad[-1] = 2**31 - 1  # no row of the table
            with pytest.raises(NotInBucket) as e:
                patch(seg, bits, bad, removed_h=h[mine])
            assert e.value.row == 2**31 - 1


@pytest.mark.parametrize("width", [2.0, 1e-7])  # exact float64 sums, then the wrapping path
def test_compiled_fold_gives_the_numpy_fold_bits(width):
    X = data(n=COMPILED_FOLD_ROWS + 1500, d=16, seed=4)
    lsh = E2LSH(n_hashes=9, n_tables=11, bucket_width=width, seed=3).fit(X)
    whole = lsh.hash(X)  # above COMPILED_FOLD_ROWS: the compiled fold
    parts = np.vstack([lsh.hash(X[i : i + 1000]) for i in range(0, X.shape[0], 1000)])
    assert np.array_equal(whole, parts)
    # Transposed (what an ingest stages), by both folds.
    assert np.array_equal(lsh.hash_validated(X, by_table=True), whole.T)
    assert np.array_equal(lsh.hash_validated(X[:1000], by_table=True), whole[:1000].T)


def reference_segments(h, rows, bits):
    """Segments straight from their definition: entries sorted by (h, row), cut by top bits."""
    order = np.lexsort((rows, h))
    h, rows = h[order], rows[order]
    seg = segment_of(h, bits)
    out = []
    for p in range(1 << bits):
        hp, rp = h[seg == p], rows[seg == p]
        keys, starts, sizes = np.unique(hp, return_index=True, return_counts=True)
        out.append(np.concatenate([[keys.size], keys.view(np.int32), np.cumsum(sizes), rp]))
    return out


@pytest.mark.parametrize("kernel", ["numpy", "compiled"])
@pytest.mark.parametrize("seed", range(6))
def test_packed_segments_match_their_definition(seed, kernel, monkeypatch):
    from fairpipe.neighbors import _segments

    monkeypatch.setattr(_segments, "NUMPY_PACK_ENTRIES", 10**9 if kernel == "numpy" else -1)
    monkeypatch.setattr(_segments, "KERNELS_WARM", False)
    rng = np.random.default_rng(seed)
    m = int(rng.integers(0, 4000))
    distinct = [1, 5, max(m // 3, 1), 2**62][seed % 4]  # one huge bucket .. all distinct
    h = mix(rng.integers(0, distinct, m, dtype=np.uint64))
    rows = rng.permutation(3 * m)[:m] if seed % 2 else np.arange(m)
    bits = int(rng.integers(0, 7))
    flat, offsets = pack(h, rows, bits, sorted_rows=not seed % 2)
    ref = reference_segments(h, rows, bits)
    assert offsets.shape[0] == len(ref) + 1
    for p, want in enumerate(ref):
        assert np.array_equal(flat[offsets[p] : offsets[p + 1]], want.astype(np.int32))


def test_a_rebuilds_entries_that_span_their_count_keep_their_rows():
    # index_tables packs a layer's entries (in key order) followed by new rows: their rows
    # increase within a key only. Where they happen to span exactly their count (row 0 in the
    # lowest bucket, no row deleted), pack used to take each row as rows[0] + its position.
    rng = np.random.default_rng(12)
    n = 70_000  # above NUMPY_PACK_ENTRIES: the compiled path
    keys = rng.integers(0, 50, n).astype(np.uint64)
    keys[0] = np.argmin(mix(np.arange(50, dtype=np.uint64)))  # row 0 comes first in key order
    flat, offsets = build_segments(keys, np.arange(n), bits=0)
    h, r = entries(flat[offsets[0] : offsets[1]])
    assert r[0] == 0 and not (np.diff(r) > 0).all()
    H = np.concatenate([h, mix(rng.integers(0, 50, 10).astype(np.uint64))])
    R = np.concatenate([r, np.arange(n, n + 10)])
    got, got_offsets = pack(H, R, 0, sorted_rows=True)
    assert np.array_equal(got[got_offsets[0] : got_offsets[1]],
                          reference_segments(H, R, 0)[0].astype(np.int32))  # fmt: skip


def test_the_compiled_key_order_is_a_stable_argsort_also_within_equal_top_bits():
    """The compiled pack sorts by the keys' top 32 bits, then orders neighbours equal in those
    bits by the whole key: keys made to share their top 32 bits (with low bits in every order,
    repeats among them) come out as numpy's stable argsort, as do ordinary hashed keys with
    repeated buckets; and a table of consecutive rows gets the rows a gather gives."""
    from fairpipe.neighbors._pack import stable_key_order

    rng = np.random.default_rng(11)
    top = rng.integers(0, 2**32, size=40, dtype=np.uint64) << np.uint64(32)
    shared = top[rng.integers(0, 40, 5000)] | rng.integers(0, 50, 5000, dtype=np.uint64)
    hashed = mix(rng.integers(0, 3000, 200_000, dtype=np.uint64))
    for h in (shared, shared[::-1].copy(), hashed, np.zeros(0, np.uint64), hashed[:1]):
        order, keys = stable_key_order(h)
        want = np.argsort(h, kind="stable")
        assert np.array_equal(order, want) and np.array_equal(keys, h[want])
    rows = np.arange(1000, 1000 + hashed.size)
    flat, offsets = pack(hashed, rows, 4, sorted_rows=True)
    ref = reference_segments(hashed, rows, 4)
    for p, want in enumerate(ref):
        assert np.array_equal(flat[offsets[p] : offsets[p + 1]], want.astype(np.int32))


def test_warm_kernels_fold_and_pack_small_batches_as_numpy_does(monkeypatch):
    """Once the compiled kernels are loaded (a command line loads them while its Prefect server
    starts), a small batch is hashed and packed by them: the same keys and segments as numpy's
    path, for both projections, by table or by row, one block or several."""
    from fairpipe.neighbors import _pack, _segments

    monkeypatch.setattr(_segments, "KERNELS_WARM", False)
    X = data(n=700, d=12, seed=3)
    rng = np.random.default_rng(3)
    want = {}
    for projection in ("exact", "float32"):
        lsh = E2LSH(n_hashes=4, n_tables=6, bucket_width=0.7, seed=1, projection=projection).fit(X)
        for n in (1, 200, 700):
            for by_table in (False, True):
                want[projection, n, by_table] = lsh.hash_validated(X[:n], by_table=by_table)
    rows = np.sort(rng.permutation(5000)[:3000])
    h = mix(rng.integers(0, 400, 3000, dtype=np.uint64))
    packed = pack(h, rows, 3, sorted_rows=True)
    _pack.warm_index_kernels()
    assert _segments.KERNELS_WARM
    calls = {"fold": 0, "fill": 0}  # the compiled paths are the ones taken
    fold, fill = E2LSH._fold_compiled, _pack.fill_segments

    def counted_fold(*args):
        calls["fold"] += 1
        return fold(*args)

    def counted_fill(*args):
        calls["fill"] += 1
        return fill(*args)

    monkeypatch.setattr(E2LSH, "_fold_compiled", counted_fold)
    monkeypatch.setattr(_pack, "fill_segments", counted_fill)
    for projection in ("exact", "float32"):
        lsh = E2LSH(n_hashes=4, n_tables=6, bucket_width=0.7, seed=1, projection=projection).fit(X)
        for n in (1, 200, 700):
            for by_table in (False, True):
                got = lsh.hash_validated(X[:n], by_table=by_table)
                assert np.array_equal(got, want[projection, n, by_table])
    for a, b in zip(pack(h, rows, 3, sorted_rows=True), packed):
        assert np.array_equal(a, b)
    assert calls["fold"] >= 12 and calls["fill"] == 1


@pytest.mark.parametrize("kernel", ["numpy", "compiled"])
@pytest.mark.parametrize("seed", range(8))
def test_packed_runs_equal_one_pack_of_all_their_entries(seed, kernel, monkeypatch):
    """pack_runs (layers read back, each sorted by key, then the new consecutive rows in any
    order, merged instead of sorted) gives the arrays pack gives for all the entries; also when
    a run is not sorted after all (the compiled merge notices and packs them the plain way)."""
    from fairpipe.neighbors import _pack, _segments, pack_runs

    monkeypatch.setattr(_segments, "KERNELS_WARM", kernel == "compiled")
    if kernel == "compiled":
        monkeypatch.setattr(_segments, "NUMPY_PACK_ENTRIES", -1)
    rng = np.random.default_rng(seed)
    distinct = [3, 50, 10**6, 2**62][seed % 4]
    sizes = rng.integers(0, 900, size=int(rng.integers(1, 5))).tolist()
    runs, start = [], 0
    for i, m in enumerate(sizes + [int(rng.integers(0, 700))]):
        h = mix(rng.integers(0, distinct, m, dtype=np.uint64))
        rows = start + np.arange(m, dtype=np.int64)
        if i < len(sizes):  # a layer read back: sorted by key, rows increasing within a key,
            rows = np.sort(rng.permutation(2 * m)[:m]) + start  # with gaps (forgotten rows)
            order = np.argsort(h, kind="stable")
            h, rows = h[order], rows[order]
        runs.append((h, rows))
        start += 2 * m + 1
    if seed in (4, 7) and runs[0][0].shape[0] > 2:  # a run's buckets out of key order
        h, rows = runs[0]
        keys = np.unique(h)
        rank = np.argsort(rng.permutation(keys.shape[0]))[np.searchsorted(keys, h)]
        order = np.argsort(rank, kind="stable")  # whole buckets moved, rows kept in order
        runs[0] = (h[order], rows[order])
    bits = int(rng.integers(0, 5))
    h_all = np.concatenate([h for h, _ in runs])
    rows_all = np.concatenate([r for _, r in runs])
    merges = []
    real = _pack.merge_sorted
    monkeypatch.setattr(_pack, "merge_sorted", lambda *a: merges.append(1) or real(*a))
    got = pack_runs(runs, bits)
    want = pack(h_all, rows_all, bits)  # sorts by row first: the definition
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert bool(merges) == (kernel == "compiled" and len(runs) > 1)


def test_a_segment_whose_words_changed_is_named_before_anything_indexes_with_it():
    """fairpipe.neighbors._segments.segment_problem: what decode and the kernels after it rely
    on, checked at once; each damaged variant of a sound segment is named."""
    from fairpipe.neighbors._segments import build_segments, segment_problem

    keys = np.array([5, 3, 5, 9, 3, 3], dtype=np.uint64)
    flat, offsets = build_segments(keys, np.arange(6), 0)
    seg = flat[offsets[0] : offsets[1]]
    nb = int(seg[0])
    assert segment_problem(seg, 6) is None and segment_problem(seg[:0], 6) is None
    assert segment_problem(np.array([0], np.int32), 6) is None  # an emptied segment

    def changed(at: int, value: int) -> np.ndarray:
        out = seg.copy()
        out[at] = value
        return out

    size = seg.shape[0]
    assert segment_problem(changed(0, nb + 7), 6) == f"it counts {nb + 7} buckets in {size} words"
    assert segment_problem(changed(0, -1), 6) == f"it counts -1 buckets in {size} words"
    assert "ends do not increase" in segment_problem(changed(1 + 2 * nb, 0), 6)
    assert "ends do not increase" in segment_problem(changed(1 + 3 * nb - 1, 9), 6)
    assert segment_problem(changed(1 + 3 * nb, 6), 6) == "it names row 6, outside rows 0..5"
    assert segment_problem(changed(1 + 3 * nb, -2), 6) == "it names row -2, outside rows 0..5"
    assert segment_problem(changed(1 + 3 * nb, 6)) is None  # rows unchecked without n
    swapped = seg.copy()
    swapped[1:3], swapped[3:5] = seg[3:5], seg[1:3]
    assert segment_problem(swapped, 6) == "its bucket keys do not increase"


# -- scales: one family of tables per radius ---------------------------------------------------
SCALES = ((0.5, 2.0, 4), (1.0, 4.0, 3), (2.0, 8.0, 5))


def test_the_first_scale_hashes_as_an_index_of_one_scale_and_each_scale_with_its_width():
    """An index in scales keeps the first scale's functions as an index of that scale alone
    (a store made before scales reads the same keys), and each other scale's keys are those
    of an E2LSH of its width drawn from the scale's own seed stream: the same whichever
    scales follow it."""
    X = np.random.default_rng(0).normal(size=(3000, 6)).astype(np.float32)
    scaled = E2LSH(n_hashes=3, n_tables=12, bucket_width=2.0, seed=5, scales=SCALES).fit(X)
    keys = scaled.hash(X)
    alone = E2LSH(n_hashes=3, n_tables=4, bucket_width=2.0, seed=5).fit(X)
    assert np.array_equal(keys[:, :4], alone.hash(X))
    fewer = E2LSH(n_hashes=3, n_tables=7, bucket_width=2.0, seed=5, scales=SCALES[:2]).fit(X)
    assert np.array_equal(keys[:, :7], fewer.hash(X))
    for first, last in ((4, 12), (7, 12), (5, 9), (0, 12)):
        part = scaled.tables(first, last)
        assert np.array_equal(part.hash(X), keys[:, first:last])
        assert np.array_equal(
            part.hash_validated(X, by_table=True, threads=2), keys[:, first:last].T
        )
    # A wider scale puts more of a point's neighbours in its bucket.
    near = X + 0.3 * np.random.default_rng(1).normal(size=X.shape).astype(np.float32)
    shared = (scaled.hash(near) == keys).mean(axis=0)
    assert shared[:4].mean() < shared[4:7].mean() < shared[7:].mean()


@pytest.mark.parametrize(
    "scales",
    [
        ((1.0, 3.0, 4), (2.0, 8.0, 8)),
        ((1.0, 2.0, 4), (0.5, 8.0, 8)),
        ((1.0, 2.0, 4), (2.0, 8.0, 0)),
        ((1.0, 2.0, 4), (2.0, 8.0)),
        ((1.0, 2.0, 4), (2.0, -1.0, 8)),
    ],
)
def test_bad_scales_are_refused(scales):
    with pytest.raises(FairpipeInputError, match="The 'scales' parameter of E2LSH must be"):
        E2LSH(n_hashes=3, n_tables=12, bucket_width=2.0, scales=scales).fit(4)


def test_a_radius_reads_the_scale_of_the_least_radius_at_least_its_own():
    lsh = E2LSH(n_hashes=3, n_tables=12, bucket_width=2.0, scales=SCALES)
    got = [(s.index, s.first, s.last) for s in map(lsh.scale_for, (0.1, 0.5, 0.7, 1.0, 1.9, 9.0))]
    assert got == [(0, 0, 4), (0, 0, 4), (1, 4, 7), (1, 4, 7), (2, 7, 12), (2, 7, 12)]
    assert lsh.radius_range() == 2.0
    one = E2LSH(n_hashes=3, n_tables=12, bucket_width=2.0)
    assert (one.scale_for(50.0).first, one.scale_for(50.0).last) == (0, 12)
    assert one.radius_range() is None


def test_fair_nn_draws_uniformly_from_the_buckets_of_its_radius_scale_only():
    """FairNN over an index in scales: a query at radius rho finds exactly the points within
    rho that share a bucket with it in a table of rho's scale (computed here from the keys),
    and its samples are uniform on them (chi-square)."""
    from scipy.stats import chi2

    from fairpipe.neighbors import FairNN, chi_square_uniform

    X = 0.4 * np.random.default_rng(3).normal(size=(4000, 5)).astype(np.float32)
    nn = FairNN(n_hashes=3, n_tables=12, bucket_width=2.0, seed=2, scales=SCALES).fit(X)
    keys = E2LSH(**nn._lsh().get_params()).fit(X).hash(X)
    for rho in (0.45, 0.9, 1.8):
        scale = nn.scale_for(rho)
        q = 11
        shared = (keys[:, scale.first : scale.last] == keys[q, scale.first : scale.last]).any(1)
        within = np.einsum("ij,ij->i", X - X[q], X - X[q]) <= np.float32(rho) ** 2
        want = np.flatnonzero(shared & within & (np.arange(X.shape[0]) != q))
        (got,) = nn.neighbourhood(query_rows=[q], radius=rho)
        assert np.array_equal(np.sort(got), want), rho
        assert want.size >= 5, (rho, want.size)
        ids = nn.sample(query_rows=[q], radius=rho, n_samples=200 * want.size, seed=4).ids
        stat, dof = chi_square_uniform(ids[0], want)
        assert stat < chi2.ppf(0.999, dof), (rho, stat, dof)
