"""The point sketch: its distance bounds hold, and deciding by them gives the kernel's answers."""

import numpy as np
import pytest

from fairpipe import FairNN
from fairpipe.neighbors import (
    ambiguous,
    residual_bounds,
    sketch_bounds,
    sketch_levels,
    sketch_points,
    sq_distances,
)


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


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e4, 1e7, 1e30])
def test_the_residual_bounds_hold_and_are_far_tighter(scale):
    """The residual's bounds contain the exact distance at every scale, on rows with one value,
    two values and a subnormal range too, and leave a small fraction of the rows the sketch
    leaves open at a threshold where distances are dense. The sketch is the same with or
    without its residual."""
    rng = np.random.default_rng(2)
    X = (rng.normal(size=(6000, 64)) * scale + rng.normal() * 5 * scale).astype(np.float32)
    X[0] = 3.0
    X[1, :32], X[1, 32:] = -scale, scale
    X[2] = np.float32(1e-42) * np.arange(64)  # a subnormal range: 1 / step overflows
    q = (X[7] + rng.normal(size=64) * 0.3 * scale).astype(np.float32)
    sketch, residual = sketch_levels(X)
    assert np.array_equal(sketch, sketch_points(X))
    assert residual is not None and residual.shape == (6000, 64 + 4)
    d2 = np.square(X.astype(np.float64) - q.astype(np.float64)).sum(axis=1)
    lower1, upper1 = sketch_bounds(sketch, q)
    lower2, upper2 = residual_bounds(sketch, residual, q)
    for lower, upper in ((lower1, upper1), (lower2, upper2)):
        assert np.isfinite(lower).all() and np.isfinite(upper).all()
        assert (lower <= d2 * (1 + 1e-9)).all() and (d2 <= upper * (1 + 1e-9)).all()
    width1, width2 = np.sqrt(upper1) - np.sqrt(lower1), np.sqrt(upper2) - np.sqrt(lower2)
    assert np.median(width1[3:] / width2[3:]) > 100  # rows 0-2 have width 0 or a floor
    t = float(np.median(d2))
    open1, open2 = ambiguous(lower1, upper1, [t]).sum(), ambiguous(lower2, upper2, [t]).sum()
    assert open1 > 100 and open2 < open1 / 10, (open1, open2)


def test_rows_whose_range_overflows_are_left_to_their_points():
    """A row with values near +-3e38 of both signs has a range beyond float32 (its step was inf
    and its bounds NaN, which no threshold test catches): its bounds are [0, inf], so a query
    always reads its point; a row just inside the range keeps finite, valid bounds."""
    X = np.zeros((3, 8), np.float32)
    X[0, :2] = 3e38, -3e38
    X[1, :2] = 1e30, -2e38
    X[2] = np.arange(8)
    q = np.ones(8, np.float32)
    sketch, residual = sketch_levels(X)
    d2 = np.square(X.astype(np.float64) - q.astype(np.float64)).sum(axis=1)
    for lower, upper in (sketch_bounds(sketch, q), residual_bounds(sketch, residual, q)):
        assert lower[0] == 0 and upper[0] == np.inf
        assert (lower <= d2 * (1 + 1e-9)).all() and (d2 <= upper * (1 + 1e-9)).all()
        assert np.isfinite(upper[1:]).all()
        assert ambiguous(lower, upper, [1.0, 1e76]).tolist() == [True, False, False]
    nan = np.array([np.nan, 1.0])
    assert ambiguous(nan, nan[::-1], [0.5]).tolist() == [True, True]


def test_a_tiny_step_keeps_its_codes_and_a_subnormal_one_gets_zeros():
    """Only an inverse step that overflows is capped: a row with a tiny normal step (1e-31) is
    quantized as any other, one with a subnormal step (1 / step = inf) gets codes 0."""
    X = np.array([[0.0, 255e-31, 127.6e-31], [0.0, 255e-42, 127.6e-42]], np.float32)
    sketch, residual = sketch_levels(X)
    assert sketch[0, :3].tolist() == [0, 255, 128] and sketch[1, :3].tolist() == [0, 0, 0]
    q = np.zeros(3, np.float32)
    d2 = np.square(X.astype(np.float64)).sum(axis=1)
    for lower, upper in (sketch_bounds(sketch, q), residual_bounds(sketch, residual, q)):
        assert (lower <= d2).all() and (d2 <= upper).all()


class SketchedPoints:
    """Points seen only through the sketch, plus the exact rows the bounds leave open."""

    def __init__(self, X, residual: bool = False):
        self.X, self.exact = X, 0
        self.sketch, self.residual = sketch_levels(X, residual)

    def __getitem__(self, rows):
        return self.X[rows]

    def __getattr__(self, name):  # shape, dtype, ...: the array's
        return getattr(self.X, name)

    def sq_distances(self, rows, query, thresholds):
        lower2, upper2 = sketch_bounds(self.sketch[rows], query)
        exact = ambiguous(lower2, upper2, thresholds)
        if self.residual is not None:  # narrowed as the store reader narrows them
            lo2, up2 = residual_bounds(self.sketch[rows[exact]], self.residual[rows[exact]], query)
            lower2[exact], upper2[exact] = (
                np.maximum(lower2[exact], lo2),
                np.minimum(upper2[exact], up2),
            )
            exact = ambiguous(lower2, upper2, thresholds)
        self.exact += int(exact.sum())
        out = ((lower2 + upper2) / 2).astype(np.float32)
        out[exact] = sq_distances(self.X, rows[exact], query, thresholds)
        return out


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("mode", ["approximate", "exact"])
def test_sampling_through_the_sketch_draws_what_the_points_draw(mode, residual):
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
        nn.points_ = sketched = SketchedPoints(X, residual)
        got = nn.sample(query_rows=[5, 9], radius=radius, n_samples=30, seed=3, mode=mode,
                        with_neighbourhood=True)  # fmt: skip
        nn.points_ = X
        assert np.array_equal(got.ids, want.ids), radius
        assert np.array_equal(got.neighbourhood_sizes, want.neighbourhood_sizes)
        exact += sketched.exact
    assert exact > 0  # the ties were decided on the points
