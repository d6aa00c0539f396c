"""The point sketch: its distance bounds hold, and deciding by them gives the kernel's answers."""

import numpy as np
import pytest

from fairpipe import FairNN
from fairpipe.neighbors import ambiguous, sketch_bounds, sketch_points, sq_distances


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e4, 1e7])
def test_bounds_hold_at_every_scale(scale):
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(4000, 40)) * scale + rng.normal() * 5 * scale).astype(np.float32)
    X[0] = 3.0  # a constant row: step 0
    X[1, :20] = -scale  # two values only
    X[1, 20:] = scale
    q = (X[7] + rng.normal(size=40) * 0.3 * scale).astype(np.float32)
    lower2, upper2 = sketch_bounds(sketch_points(X), q)
    d2 = np.square(X.astype(np.float64) - q.astype(np.float64)).sum(axis=1)
    assert (lower2 <= d2 * (1 + 1e-9)).all() and (d2 <= upper2 * (1 + 1e-9)).all()
    assert np.median(upper2 / np.maximum(lower2, 1e-300)) < 1.1  # and they are tight
    t = float(np.median(d2))
    amb = ambiguous(lower2, upper2, [t])
    assert 0 < amb.sum() < X.shape[0] // 5
    settled = ~amb
    assert np.array_equal((lower2[settled] <= t), (d2[settled] <= t))


class SketchedPoints:
    """Points seen only through the sketch, plus the exact rows the bounds leave open."""

    def __init__(self, X):
        self.X, self.sketch, self.exact = X, sketch_points(X), 0

    def __getitem__(self, rows):
        return self.X[rows]

    def __getattr__(self, name):  # shape, dtype, ...: the array's
        return getattr(self.X, name)

    def sq_distances(self, rows, query, thresholds):
        lower2, upper2 = sketch_bounds(self.sketch[rows], query)
        exact = ambiguous(lower2, upper2, thresholds)
        self.exact += int(exact.sum())
        out = ((lower2 + upper2) / 2).astype(np.float32)
        out[exact] = sq_distances(self.X, rows[exact], query, thresholds)
        return out


@pytest.mark.parametrize("mode", ["approximate", "exact"])
def test_sampling_through_the_sketch_draws_what_the_points_draw(mode):
    """Radii at the distances of actual points (exact ties) and at the median distance: the
    kernel given the sketch draws exactly what it draws given the points."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(3000, 16)).astype(np.float32)
    nn = FairNN(n_hashes=2, n_tables=8, bucket_width=6.0, seed=2).fit(X)
    d = np.sqrt(np.square(X - X[5]).sum(axis=1))
    exact = 0
    tie = float(np.sort(d)[40])  # a point at distance r, and one at c * r below
    for radius in [tie, tie / 2, float(np.median(d)), 2.0]:
        want = nn.sample(query_rows=[5, 9], radius=radius, n_samples=30, seed=3, mode=mode,
                         with_neighbourhood=True)  # fmt: skip
        nn.points_ = sketched = SketchedPoints(X)
        got = nn.sample(query_rows=[5, 9], radius=radius, n_samples=30, seed=3, mode=mode,
                        with_neighbourhood=True)  # fmt: skip
        nn.points_ = X
        assert np.array_equal(got.ids, want.ids), radius
        assert np.array_equal(got.neighbourhood_sizes, want.neighbourhood_sizes)
        exact += sketched.exact
    assert exact > 0  # the ties were decided on the points
