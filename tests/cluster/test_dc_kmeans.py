import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs

from fairpipe import FairpipeInputError
from fairpipe.cluster import DCKMeans, solve_batch


def blobs(n=3000, d=6, k=5, seed=0):
    X, y = make_blobs(n_samples=n, n_features=d, centers=k, cluster_std=1.5, random_state=seed)
    return X.astype(np.float32), y


def assert_same_tree(a: DCKMeans, b: DCKMeans) -> None:
    assert len(a.centroids_by_level_) == len(b.centroids_by_level_)
    for level, (ca, cb) in enumerate(zip(a.centroids_by_level_, b.centroids_by_level_)):
        assert np.array_equal(ca, cb), f"centroids differ at level {level}"
        assert np.array_equal(a.masses_by_level_[level], b.masses_by_level_[level]), level


def fresh_without(X, ids, gone, **params):
    keep = ~np.isin(ids, gone)
    return DCKMeans(**params).fit(X[keep], ids=ids[keep])


@pytest.mark.parametrize("height, fanout", [(1, 16), (2, 6), (3, 4)])
def test_batch_deletion_equals_a_fresh_fit(height, fanout):
    X, _ = blobs()
    ids = np.arange(X.shape[0]) * 3 + 11
    params = dict(n_clusters=4, fanout=fanout, height=height, max_iter=5, n_init=3, seed=7)
    model = DCKMeans(**params).fit(X, ids=ids)
    gone = np.random.default_rng(height).choice(ids, size=40, replace=False)
    report = model.delete(gone)
    assert np.array_equal(np.sort(report.deleted), np.sort(gone))
    assert_same_tree(model, fresh_without(X, ids, gone, **params))
    # Only the deleted ids' leaves and their ancestors were recomputed.
    leaves = np.unique(model.leaf_of_[np.isin(ids, gone)])
    assert np.array_equal(report.changed[0], leaves)
    for level in range(1, height + 1):
        assert np.array_equal(report.changed[level], np.unique(report.changed[level - 1] // fanout))
    assert report.changed[-1].tolist() == [0]


def test_online_deletions_one_by_one_equal_a_fresh_fit_each_time():
    X, _ = blobs(n=800)
    ids = np.arange(800)
    params = dict(n_clusters=3, fanout=5, height=2, max_iter=4, n_init=2, seed=3)
    model = DCKMeans(**params).fit(X, ids=ids)
    gone = np.random.default_rng(1).choice(ids, size=12, replace=False)
    for i, g in enumerate(gone):
        report = model.delete([g])
        assert report.leaves_recomputed == 1 and report.nodes_recomputed == 3
        if i % 4 == 3:
            assert_same_tree(model, fresh_without(X, ids, gone[: i + 1], **params))
    assert_same_tree(model, fresh_without(X, ids, gone, **params))


def test_leaves_do_not_depend_on_row_order():
    X, _ = blobs(n=1000)
    ids = np.arange(1000) + 5
    perm = np.random.default_rng(0).permutation(1000)
    params = dict(n_clusters=4, fanout=8, height=2, max_iter=3, seed=2)
    assert_same_tree(
        DCKMeans(**params).fit(X, ids=ids), DCKMeans(**params).fit(X[perm], ids=ids[perm])
    )


def test_batched_kernel_gives_the_same_bits_alone_or_in_a_batch():
    rng = np.random.default_rng(4)
    sizes = np.array([50, 3, 0, 120, 7, 64])
    X = rng.normal(size=(sizes.sum(), 5))
    w = rng.integers(0, 4, size=sizes.sum()).astype(float)
    keys = np.arange(6) + 100
    together = solve_batch(X, w, sizes, keys, k=4, max_iter=6, seed=9)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for p in range(6):
        a, b = starts[p], starts[p + 1]
        alone = solve_batch(X[a:b], w[a:b], sizes[p : p + 1], keys[p : p + 1], 4, 6, 9)
        assert np.array_equal(alone.centroids[0], together.centroids[p])
        assert np.array_equal(alone.masses[0], together.masses[p])
        assert np.array_equal(alone.loss[0], together.loss[p])
    # Masses are the weights assigned: they add up to each problem's total weight.
    totals = np.add.reduceat(w, starts[:-1]) * (sizes > 0)
    assert np.allclose(together.masses.sum(axis=1), totals)


def test_a_leaf_with_at_most_k_points_keeps_them_and_an_empty_leaf_has_no_mass():
    X = np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0], [9.0, 9.0]])
    res = solve_batch(X, np.array([1.0, 0.0, 2.0, 1.0]), np.array([3, 0, 1]), np.arange(3), 3, 5, 0)
    # Problem 0 has two points of positive weight: they are its centroids, in order.
    assert np.array_equal(res.centroids[0, :2], X[[0, 2]])
    assert res.masses[0].tolist() == [1.0, 2.0, 0.0]
    assert res.masses[1].tolist() == [0.0, 0.0, 0.0]
    assert np.array_equal(res.centroids[2, 0], X[3]) and res.loss[2] == 0.0


def test_loss_is_close_to_scikit_learn_kmeans():
    X, _ = blobs(n=6000, d=8, k=6, seed=3)
    model = DCKMeans(n_clusters=6, fanout=8, height=2, max_iter=10, n_init=10, seed=0).fit(X)
    ref = KMeans(n_clusters=6, n_init=10, random_state=0).fit(X)
    assert model.loss(X) <= 1.05 * ref.inertia_
    assert np.bincount(model.predict(X), minlength=6).min() > 0


def test_deleting_unknown_or_already_deleted_ids_is_reported_not_fatal():
    X, _ = blobs(n=300)
    model = DCKMeans(n_clusters=3, fanout=4, height=1, seed=0).fit(X)
    first = model.delete([4, 5])
    again = model.delete([4, 999])
    assert first.deleted.tolist() == [4, 5]
    assert again.deleted.size == 0 and again.unknown.tolist() == [999]
    assert again.already_deleted.tolist() == [4] and again.nodes_recomputed == 0


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_clusters": 0}, "'n_clusters' parameter of DCKMeans must be a positive integer"),
        ({"fanout": -2}, "'fanout' parameter of DCKMeans must be an integer >= 2. Got -2 instead"),
        ({"height": 0}, "'height' parameter of DCKMeans must be a positive integer"),
        ({"max_iter": 0}, "'max_iter' parameter of DCKMeans must be a positive integer"),
        ({"fanout": 1000, "height": 4}, r"1000 \*\* 4 leaves; at most"),
        (
            {"n_clusters": 500},
            "n_clusters = 500 is larger than the 300 points given to DCKMeans.fit",
        ),
    ],
)
def test_bad_parameters(params, match):
    X, _ = blobs(n=300)
    with pytest.raises(FairpipeInputError, match=match):
        DCKMeans(**{"n_clusters": 3, "fanout": 4, "height": 1, **params}).fit(X)


def test_bad_ids_and_unfitted_model():
    X, _ = blobs(n=300)
    with pytest.raises(FairpipeInputError, match="not fitted yet"):
        DCKMeans().delete([1])
    model = DCKMeans(n_clusters=3, fanout=4, height=1).fit(X)
    with pytest.raises(
        FairpipeInputError, match="Id 1.5 in row 1 of the ids to delete is not an integer"
    ):
        model.delete(np.array([1.5]))
