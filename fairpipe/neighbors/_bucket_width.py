"""A bucket width for E2LSH from the data: 3.2 times the median nearest-neighbour distance.

The paper tuned the width w to 3.1-3.3 times the query radius r; a useful default radius is the
typical distance from a point to its nearest neighbour. That distance is measured within a sample
of ``WIDTH_SAMPLE`` rows chosen by a hash of (seed, id), so the estimate depends on the data and
the seed, never on the file order or the chunking.

>>> X = np.arange(10, dtype=np.float32)[:, None] * 2.0
>>> estimate_bucket_width(X)
(2.0, 6.4)
"""

from __future__ import annotations

import numpy as np

from fairpipe.hashing import stable_hash

WIDTH_SAMPLE = 2000
WIDTH_PER_RADIUS = 3.2  # the paper tuned w to 3.1-3.3 times r
WIDTH_SALT = 0x5A


def width_sample_rows(ids: np.ndarray, seed: int, size: int = WIDTH_SAMPLE) -> np.ndarray:
    """Positions (sorted) of the ``size`` ids with the smallest hash of (seed, id)."""
    h = stable_hash(seed, np.asarray(ids), salt=WIDTH_SALT)
    return np.sort(np.argsort(h, kind="stable")[:size])


def nearest_distances(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row's distance to its nearest other row, the squared distances (m, m) with an
    infinite diagonal) of the float64 rows ``S``. The squared distances come from one matrix
    product; each nearest distance is then summed again from the two rows' differences, in
    coordinate order (``np.add.accumulate``), so that it does not depend on the machine's BLAS
    or its vector width."""
    sq = (S * S).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2 * S @ S.T
    np.fill_diagonal(d2, np.inf)
    diff = S - S[d2.argmin(1)]
    diff *= diff
    return np.sqrt(np.add.accumulate(diff, axis=1)[:, -1]), d2


def suggested_radius(nn: np.ndarray) -> float:
    """The median of the nearest distances ``nn`` that are not 0 (1.0 where all are)."""
    positive = nn[nn > 0]
    return float(np.median(positive)) if positive.size else 1.0


def estimate_bucket_width(sample: np.ndarray) -> tuple[float, float]:
    """(suggested radius, bucket width) from a sample of points: the median distance from a
    point to its nearest other point (ignoring duplicates) and 3.2 times it."""
    S = np.asarray(sample, dtype=np.float64)
    if S.shape[0] < 2:
        return 1.0, WIDTH_PER_RADIUS
    r = suggested_radius(nearest_distances(S)[0])
    return r, WIDTH_PER_RADIUS * r
