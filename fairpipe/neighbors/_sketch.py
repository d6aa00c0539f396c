"""A one-byte-per-coordinate sketch of each point, for deciding distances without the point.

A query with a small neighbourhood must look at every candidate's distance (to know which are
within r), and reading the candidates' float32 points is most of a cold query's time: they
spread over nearly every chunk of points. The sketch is 4x smaller. Each row is quantized on its
own range: ``code = round((x - lo) / step)`` with ``step = (max - min) / 255``; the row keeps
``lo``, ``step`` and ``err``, an upper bound on the norm of its quantization error
``||x - x_hat||``. By the triangle inequality the true distance to a query lies in
``[||q - x_hat|| - err, ||q - x_hat|| + err]``; only rows whose interval straddles a threshold
(``ambiguous``) need their exact point. The sketch row is ``d`` code bytes then the three
float32 values as 12 bytes (``SKETCH_EXTRA``), so one array holds it.

The **residual** (:func:`sketch_levels`, :func:`residual_bounds`) refines it for the rows it
leaves open: a signed byte per coordinate, ``r = round((x - x_hat) / (step / 256))``, and a
bound ``err2`` on ``||x - x_fine||`` with ``x_fine = x_hat + r * step / 256``: bounds about
200 times tighter for ``d + 4`` more bytes a row. A query whose radius sits where candidates are dense
(the neighbourhood of the default store's tightest cluster: a tenth of its candidates open
after the sketch, in every chunk of points) reads the residual of those instead of their points
(a quarter of the bytes), and the points of the few it still leaves open.
"""

from __future__ import annotations

import numpy as np

SKETCH_EXTRA = 12  # lo, step, err as float32 bytes after the d codes
RESIDUAL_EXTRA = 4  # err2 as float32 bytes after the d residual codes
FINE = 256  # the residual's step is the sketch's step / FINE (a power of two: exact)
# Relative margin around a squared threshold inside which a row counts as ambiguous: covers the
# float32 rounding of the exact distance the sampling kernel computes (at most about d * 2**-24
# relative for the sum of d non-negative squares) and of the bounds here, so a row decided by
# its bounds falls on the same side as the kernel's own float32 distance would.
MARGIN = 1e-4
BOUNDS_BLOCK = 2048  # rows per block of :func:`sketch_bounds`


def sketch_points(X: np.ndarray) -> np.ndarray:
    """The sketch rows of float32 points ``X`` (n, d): uint8 (n, d + ``SKETCH_EXTRA``)."""
    return sketch_levels(X, residual=False)[0]


def sketch_levels(X: np.ndarray, residual: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """(sketch rows, residual rows) of float32 points ``X`` (n, d): uint8 (n, d +
    ``SKETCH_EXTRA``) as :func:`sketch_points`, and uint8 (n, d + ``RESIDUAL_EXTRA``) (None
    unless ``residual``): ``d`` int8 codes then ``err2`` as float32 bytes."""
    X = np.asarray(X, dtype=np.float32)
    n, d = X.shape
    out = np.empty((n, d + SKETCH_EXTRA), dtype=np.uint8)
    fine = np.empty((n, d + RESIDUAL_EXTRA), dtype=np.uint8) if residual else None
    if n == 0:
        return out, fine
    lo, hi = X.min(axis=1), X.max(axis=1)
    with np.errstate(over="ignore"):
        step = (hi - lo) / np.float32(255)
    scale = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float64)
    # A row whose range overflows float32 (values beyond +-1.7e38 of both signs) has step inf,
    # and inf * 0 made NaN bounds: it is sketched as the constant 0 (step 0, lo 0, codes those
    # of x itself, clipped), its bound ||x|| (in float64). Other rows are left as they were.
    wide = ~np.isfinite(step)
    if wide.any():
        step[wide], lo = 0, np.where(wide, np.float32(0), lo)
    codes = X - lo[:, None]
    # A row whose range is subnormal enough that 1 / step overflows has inverse inf, and 0 * inf
    # made NaN codes and a NaN bound (a candidate then decided wrongly): there it is 1e30, its
    # codes are 0 and its bound the norm of x - lo. Every finite inverse is unchanged, so are the
    # other rows' bits.
    with np.errstate(over="ignore"):
        inverse = np.float32(1) / np.where(step > 0, step, np.float32(1))
    codes *= np.where(np.isinf(inverse), np.float32(1e30), inverse)[:, None]
    np.rint(codes, out=codes)
    np.clip(codes, 0, 255, out=codes)
    out[:, :d] = codes
    # The error of the reconstruction lo + step * code, in float32 here (about a third of the
    # time of float64): bounded up for the float64 one the query makes, which differs from it
    # by at most a few float32 ulps of the row's largest magnitude per coordinate.
    codes *= step[:, None]
    codes += lo[:, None]
    np.subtract(X, codes, out=codes)
    err = np.sqrt(np.einsum("ij,ij->i", codes, codes, dtype=np.float64))
    slack = np.sqrt(d) * scale * 2.0**-20
    err = err * (1 + 1e-5) + slack + 1e-30
    with np.errstate(over="ignore"):  # a bound beyond float32 is inf: the point decides
        err32 = np.nextafter(err.astype(np.float32), np.float32(np.inf))
    meta = np.stack([lo, step, err32], axis=1)
    out[:, d:] = meta.astype(np.float32).view(np.uint8).reshape(n, SKETCH_EXTRA)
    if fine is None:
        return out, None
    # The residual x - x_hat (``codes`` now), in steps of step / FINE. Its error bound has the
    # same slack as the sketch's: the float32 x_hat here differs from the query's float64 one
    # by about 1.5 float32 ulps of the row's largest magnitude per coordinate, the other
    # roundings (r * step / FINE, the subtractions) are ulps of the residual, far smaller; a
    # row's r is any integer (a tiny step makes it 0), its err2 is measured after it.
    inverse = np.minimum(FINE / np.where(step > 0, step, 1).astype(np.float64), 3e38)
    with np.errstate(over="ignore"):  # a wide row (step 0): any r, its err2 is ||x||
        r = codes * inverse.astype(np.float32)[:, None]
    np.rint(r, out=r)
    np.clip(r, -127, 127, out=r)
    fine[:, :d] = r.astype(np.int8).view(np.uint8)
    r *= (step / np.float32(FINE))[:, None]
    codes -= r
    err2 = np.sqrt(np.einsum("ij,ij->i", codes, codes, dtype=np.float64)) * (1 + 1e-5)
    err2 = err2 + slack + 1e-30
    with np.errstate(over="ignore"):
        err2 = np.nextafter(err2.astype(np.float32), np.float32(np.inf))
    fine[:, d:] = err2.view(np.uint8).reshape(n, RESIDUAL_EXTRA)
    return out, fine


def sketch_bounds(sketch: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds (float64) of the squared distances from ``query`` to the rows
    whose sketch rows are ``sketch``.

    Computed in blocks of ``BOUNDS_BLOCK`` rows: the float64 temporaries of a block stay in the
    cache, where those of 100k candidates at once (200 MB) cost a cold process more in page
    faults than the arithmetic (0.07-0.37 s against 0.02 s at d = 128). Each row's arithmetic
    is the same either way, so are its bounds."""
    return _bounds(sketch, None, query)


def residual_bounds(sketch: np.ndarray, residual: np.ndarray,
                    query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Lower and upper bounds (float64) of the squared distances from ``query`` to the rows
    whose sketch rows are ``sketch`` and residual rows ``residual`` (:func:`sketch_levels`):
    as :func:`sketch_bounds`, around ``x_fine = x_hat + r * step / FINE`` (in float64:
    the product is exact, the sums are rounded once each)."""
    return _bounds(sketch, residual, query)


def _bounds(sketch: np.ndarray, residual: np.ndarray | None,
            query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """:func:`sketch_bounds` (``residual`` None) or :func:`residual_bounds`."""
    d = sketch.shape[1] - SKETCH_EXTRA
    query = np.asarray(query, dtype=np.float64)
    lower2 = np.empty(sketch.shape[0], dtype=np.float64)
    upper2 = np.empty(sketch.shape[0], dtype=np.float64)
    for a in range(0, sketch.shape[0], BOUNDS_BLOCK):
        block = sketch[a : a + BOUNDS_BLOCK]
        meta = np.ascontiguousarray(block[:, d:]).view(np.float32).astype(np.float64)
        lo, step, err = meta[:, 0], meta[:, 1], meta[:, 2]
        approx = lo[:, None] + step[:, None] * block[:, :d]
        if residual is not None:
            fine = residual[a : a + BOUNDS_BLOCK]
            err = np.ascontiguousarray(fine[:, d:]).view(np.float32)[:, 0].astype(np.float64)
            approx += (step / FINE)[:, None] * np.ascontiguousarray(fine[:, :d]).view(np.int8)
        diff = approx - query
        dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        lower2[a : a + BOUNDS_BLOCK] = np.square(np.maximum(dist - err, 0.0))
        upper2[a : a + BOUNDS_BLOCK] = np.square(dist + err)
    return lower2, upper2


def ambiguous(lower2: np.ndarray, upper2: np.ndarray, thresholds) -> np.ndarray:
    """Rows whose squared distance bounds do not settle ``d2 <= t`` for every threshold ``t``
    (with the relative ``MARGIN``), and rows whose bounds are not numbers (their point decides)."""
    out = np.isnan(lower2) | np.isnan(upper2)
    for t in thresholds:
        t = float(t)
        out |= (lower2 <= t * (1 + MARGIN)) & (upper2 > t * (1 - MARGIN))
    return out
