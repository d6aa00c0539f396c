import numpy as np
import pytest
from sklearn.datasets import make_blobs

from fairpipe import FairpipeInputError
from fairpipe.cluster import QKMeans, choose_model, quantise


def blobs(n=4000, d=4, k=4, seed=0):
    X, _ = make_blobs(n_samples=n, n_features=d, centers=k, cluster_std=1.0, random_state=seed)
    return X


def replay(X, c0, thetas, eps, gamma, k):
    """Textbook quantised Lloyd from fixed seeds, one cluster at a time (the reference)."""
    n = X.shape[0]
    c, outs, losses = c0.copy(), [], []
    for theta in thetas:
        d2 = ((X[:, None, :] - c[None]) ** 2).sum(-1)
        label = d2.argmin(1)
        loss = d2.min(1).sum()
        if losses and loss > losses[-1]:
            break
        new = np.empty_like(c)
        for j in range(k):
            members = X[label == j]
            m = members.shape[0]
            mean = members.mean(0) if m else c[j]
            thr = gamma * n / k
            if m < thr:
                mean = (m / thr) * mean + (1 - m / thr) * c[j]
            new[j] = quantise(mean, theta[j], eps)
        outs.append(new)
        losses.append(loss)
        c = new
    return c, outs


def test_training_matches_the_textbook_replay():
    X = blobs()
    model = QKMeans(n_clusters=4, epsilon=0.05, balance=0.2, max_iter=8, seed=3).fit(X)
    c, outs = replay(X, model.c_in_[0], model.thetas_, 0.05, 0.2, 4)
    assert len(outs) == model.c_out_.shape[0]
    assert np.allclose(c, model.centroids_, atol=1e-9)


def test_certified_deletions_keep_what_a_replay_without_the_points_gives():
    X = blobs()
    ids = np.arange(X.shape[0])
    model = QKMeans(n_clusters=4, epsilon=0.5, balance=0.2, max_iter=8, seed=3).fit(X)
    c0, thetas = model.c_in_[0].copy(), model.thetas_.copy()
    candidates = np.setdiff1d(ids, model.seed_ids_)
    gone = np.random.default_rng(0).choice(candidates, size=30, replace=False)
    report = model.delete(gone)
    assert not report.retrained and report.certified == 30
    c, _ = replay(np.delete(X, gone, axis=0), c0, thetas, 0.5, 0.2, 4)
    assert np.allclose(c, model.centroids_, atol=1e-9)
    assert model.sizes_[0].sum() == X.shape[0] - 30


def test_a_failed_certification_retrains_to_a_fresh_fit():
    X = blobs(n=600, d=12)
    ids = np.arange(600) + 1000
    params = dict(n_clusters=3, epsilon=0.001, balance=0.2, max_iter=6, seed=1)
    model = QKMeans(**params).fit(X, ids=ids)
    gone = ids[:5]
    report = model.delete(gone)
    # A lattice this fine cannot absorb a deletion: it retrains, to what a fresh fit gives.
    assert report.retrained and report.certified == 0
    fresh = QKMeans(**params).fit(X[5:], ids=ids[5:])
    assert np.array_equal(model.centroids_, fresh.centroids_)


def test_deleting_a_kmeans_plus_plus_seed_retrains():
    X = blobs(n=1000)
    model = QKMeans(n_clusters=4, epsilon=0.5, seed=2).fit(X)
    seed = int(model.seed_ids_[0])
    report = model.delete([seed])
    assert report.retrained and report.certified == 0
    fresh = QKMeans(n_clusters=4, epsilon=0.5, seed=2).fit(
        np.delete(X, seed, 0), np.delete(np.arange(1000), seed)
    )
    assert np.array_equal(model.centroids_, fresh.centroids_)


def test_most_deletions_are_certified_in_low_dimension():
    X = blobs(n=20000, d=5, k=5)
    model = QKMeans(n_clusters=5, epsilon=0.05, balance=0.2, max_iter=10, seed=0).fit(X)
    gone = np.random.default_rng(1).choice(
        np.setdiff1d(np.arange(20000), model.seed_ids_), 200, replace=False
    )
    certified = sum(model.delete([g]).certified for g in gone)
    assert certified >= 180


@pytest.mark.parametrize(
    "params, match",
    [
        ({"balance": 0.0}, "'balance' parameter of QKMeans must be in \\(0, 1\\)"),
        ({"balance": 1.5}, "'balance' parameter of QKMeans must be in \\(0, 1\\)"),
        ({"epsilon": -1.0}, "'epsilon' parameter of QKMeans must be a positive float"),
        ({"max_iter": 0}, "'max_iter' parameter of QKMeans must be a positive integer"),
        ({"n_clusters": 50}, "n_clusters = 50 is larger than the 20 points given to QKMeans.fit"),
    ],
)
def test_bad_parameters(params, match):
    with pytest.raises(FairpipeInputError, match=match):
        QKMeans(**{"n_clusters": 2, **params}).fit(blobs(n=20))


def test_choose_model():
    assert choose_model(100_000, 25, 5) == "q"
    assert choose_model(5_000, 784, 10) == "dc"
    assert choose_model(100_000, 25, 5, certification_rate=0.95) == "dc"
    assert choose_model(5_000, 784, 10, certification_rate=0.999) == "q"


def test_certification_probe_changes_nothing_and_predicts_the_rate():
    X = blobs(n=20000, d=5, k=5)
    model = QKMeans(n_clusters=5, epsilon=0.05, balance=0.2, max_iter=10, seed=0).fit(X)
    before = {name: np.copy(getattr(model, name)) for name in ("sums_", "sizes_", "losses_")}
    rate = model.certification_rate(n_probe=100, seed=1)
    for name, value in before.items():
        assert np.array_equal(getattr(model, name), value)
    # Single deletions from the same state: the probe's answer for each is what delete() does.
    rows = np.random.default_rng(np.random.SeedSequence([1, 0x50B])).choice(20000, 100, False)
    realised = [QKMeans.from_arrays(model.to_arrays(), **model.get_params())
                .delete([model.ids_[r]]).certified for r in rows]  # fmt: skip
    assert rate == np.mean(realised)
    # A fine lattice in high dimension certifies little: the probe says so.
    wide = QKMeans(n_clusters=5, epsilon=0.001, seed=0).fit(blobs(n=2000, d=40, k=5))
    assert wide.certification_rate(n_probe=50) < 0.5


def test_restarts_keep_the_run_with_the_lowest_loss_and_certify_across_all_runs():
    X = blobs(n=3000, d=3, k=6, seed=5)
    ids = np.arange(3000)
    params = dict(n_clusters=6, epsilon=1.0, balance=0.2, max_iter=8, seed=4)
    model = QKMeans(n_init=4, **params).fit(X, ids=ids)
    single = QKMeans(n_init=1, **params).fit(X, ids=ids)
    assert np.array_equal(model.runs_[0].c_out, single.c_out_)  # run 0 is the single run
    finals = [run.final_loss for run in model.runs_]
    assert len(set(finals)) > 1 and model.best_ == int(np.argmin(finals))
    assert np.isclose(model.loss(X), min(finals), rtol=1e-12)
    assert set(model.seed_ids_) == set(np.concatenate([r.seed_ids for r in model.runs_]))
    # Through the stored state and back, then a batch of certified deletions: every run is what
    # replaying it from its own seeds without the points gives, and the best run is still best.
    model = QKMeans.from_arrays(model.to_arrays(), **model.get_params())
    gone = np.random.default_rng(0).choice(np.setdiff1d(ids, model.seed_ids_), 20, False)
    report = model.delete(gone)
    assert report.certified == 20 and not report.retrained  # a lattice this coarse absorbs them
    rest = np.delete(model.points_.astype(np.float64), gone, 0)
    replayed = [replay(rest, r.c_in[0], r.thetas, 1.0, 0.2, 6)[0] for r in model.runs_]
    losses = [((rest[:, None] - c[None]) ** 2).sum(-1).min(1).sum() for c in replayed]
    assert model.best_ == int(np.argmin(losses))
    for run, c, loss in zip(model.runs_, replayed, losses):
        assert np.allclose(run.c_out[-1], c, atol=1e-9)
        assert np.isclose(run.final_loss, loss, rtol=1e-9)
