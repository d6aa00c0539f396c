"""Compiled kernels of the index build: :func:`fairpipe.neighbors._segments.pack` and the key
fold of :meth:`E2LSH.hash_validated` for large batches (imported on first use, so that a query,
which reads segments and hashes one point, does not load numba).

A table of n entries is packed in O(n): two stable counting-sort passes by the top 32 bits of
the mixed key, then a stable insertion pass for the rare neighbours equal in those bits, then
one pass writing the segments. The result is the
same array a stable sort by key gives (rows in increasing order within a bucket).
"""

from __future__ import annotations

import numpy as np

from fairpipe.neighbors._lsh import CELL_CLAMP, U64
from fairpipe.parallel import compiled, splitmix64_one


@compiled
def stable_key_order(h):
    """(order, h[order]): a stable argsort of the uint64 keys ``h``: two stable counting-sort
    passes by 16-bit digits (bits 32-47, then 48-63), then an insertion pass that orders, by
    the whole key, the few neighbours equal in their top 32 bits (hashed keys: about m^2 / 2^33
    pairs of distinct keys). A 16-bit pass and a mergesort of each range take 0.42 s for 10M
    entries, this 0.29 s (the same order)."""
    m = h.shape[0]
    keys = h.copy()
    idx = np.arange(m)
    spare_keys = np.empty(m, dtype=np.uint64)
    spare_idx = np.empty(m, dtype=np.int64)
    digit = np.uint64(0xFFFF)
    for p in range(2):
        shift = np.uint64(32 + 16 * p)
        counts = np.zeros(65537, dtype=np.int64)
        for i in range(m):
            counts[np.int64((keys[i] >> shift) & digit) + 1] += 1
        for b in range(65536):
            counts[b + 1] += counts[b]
        for i in range(m):
            d = np.int64((keys[i] >> shift) & digit)
            j = counts[d]
            spare_keys[j] = keys[i]
            spare_idx[j] = idx[i]
            counts[d] = j + 1
        keys, spare_keys = spare_keys, keys
        idx, spare_idx = spare_idx, idx
    for i in range(1, m):
        if keys[i] < keys[i - 1]:
            k, x, j = keys[i], idx[i], i - 1
            while j >= 0 and keys[j] > k:
                keys[j + 1] = keys[j]
                idx[j + 1] = idx[j]
                j -= 1
            keys[j + 1] = k
            idx[j + 1] = x
    return idx, keys


@compiled
def fill_segments(hs, rows, bits):
    """(flat, offsets) of the entries (``hs`` sorted mixed keys, ``rows``) cut into ``2**bits``
    segments by the keys' top bits: :func:`fairpipe.neighbors._segments.pack`'s layout."""
    m = hs.shape[0]
    n_seg = 1 << bits
    shift = np.uint64(64 - bits) if bits > 0 else np.uint64(0)
    nb = np.zeros(n_seg, dtype=np.int64)
    ns = np.zeros(n_seg, dtype=np.int64)
    for i in range(m):
        s = np.int64(hs[i] >> shift) if bits > 0 else 0
        ns[s] += 1
        if i == 0 or hs[i] != hs[i - 1]:
            nb[s] += 1
    offsets = np.zeros(n_seg + 1, dtype=np.int64)
    for s in range(n_seg):
        offsets[s + 1] = offsets[s] + 1 + 3 * nb[s] + ns[s]
    flat = np.empty(offsets[n_seg], dtype=np.int32)
    for s in range(n_seg):
        flat[offsets[s]] = nb[s]
    placed_b = np.zeros(n_seg, dtype=np.int64)
    placed_e = np.zeros(n_seg, dtype=np.int64)
    words = hs.view(np.int32)
    for i in range(m):
        s = np.int64(hs[i] >> shift) if bits > 0 else 0
        o = offsets[s]
        if i == 0 or hs[i] != hs[i - 1]:
            j = placed_b[s]
            flat[o + 1 + 2 * j] = words[2 * i]
            flat[o + 2 + 2 * j] = words[2 * i + 1]
            placed_b[s] = j + 1
        flat[o + 1 + 3 * nb[s] + placed_e[s]] = rows[i]
        placed_e[s] += 1
        flat[o + 2 * nb[s] + placed_b[s]] = placed_e[s]  # the bucket's end so far
    return flat, offsets


@compiled
def merge_sorted(h1, r1, h2, r2):
    """(h, rows, ok): the entries of two runs each sorted by mixed key, merged by key, the
    first run's entries before the second's at equal keys (so rows stay increasing within a
    bucket when the first run's rows are all below the second's). ``ok`` is False, and the
    result unusable, when a run is not sorted by key."""
    n1, n2 = h1.shape[0], h2.shape[0]
    h = np.empty(n1 + n2, dtype=np.uint64)
    r = np.empty(n1 + n2, dtype=np.int64)
    for i in range(1, n1):
        if h1[i] < h1[i - 1]:
            return h, r, False
    for j in range(1, n2):
        if h2[j] < h2[j - 1]:
            return h, r, False
    i = j = k = 0
    while i < n1 and j < n2:
        if h2[j] < h1[i]:
            h[k] = h2[j]
            r[k] = r2[j]
            j += 1
        else:
            h[k] = h1[i]
            r[k] = r1[i]
            i += 1
        k += 1
    while i < n1:
        h[k] = h1[i]
        r[k] = r1[i]
        i += 1
        k += 1
    while j < n2:
        h[k] = h2[j]
        r[k] = r2[j]
        j += 1
        k += 1
    return h, r, True


@compiled
def fold_block(proj, X, offsets, a, b, col_bound, multipliers, n_tables, mask, shift, out,
               by_table, exact):  # fmt: skip
    """:meth:`E2LSH._fold` in one pass: ``out[i, t]`` (``out[t, i]`` when ``by_table``) = the
    bucket key of row i (of ``X``) in table t from its projections ``proj`` (rows, L * k)
    float32 (before the offsets): the floored cells (by the exact definition when ``exact``,
    from ``a``, ``b`` (float64 scaled projections and offsets) and ``col_bound``; else the
    float32 sum with ``offsets``), their wrapping uint64 sum with the multipliers, SplitMix64,
    the 48-bit mask and the table prefix. The same bits as the numpy version (whose float64
    sums of cells are exact, so equal to this sum; its cells are summed in the same order)."""
    k = multipliers.shape[0]
    d, m = X.shape[1], proj.shape[1]
    cells = np.empty(m, dtype=np.float64)
    upper = np.empty(m, dtype=np.float64)  # floor at the top of each cell's interval
    for i in range(proj.shape[0]):
        if exact:
            x_norm = 0.0
            for j in range(d):
                x_norm += np.float64(X[i, j]) * np.float64(X[i, j])
            x_norm = np.sqrt(x_norm) * (1 + 1e-6)
            near = 0
            for c in range(m):  # branch-free: vectorised
                v = np.float64(proj[i, c]) + b[c]
                bound = x_norm * col_bound[c] + 8 * U64 * (abs(v) + 1.0)
                cells[c] = np.floor(v - bound)
                upper[c] = np.floor(v + bound)
                near += upper[c] != cells[c]
            if near:  # cells near an integer: the in-order float64 sum decides
                for c in range(m):
                    if upper[c] != cells[c]:
                        s = 0.0
                        for j in range(d):
                            s += np.float64(X[i, j]) * a[j, c]
                        cells[c] = np.floor(s + b[c])
            for c in range(m):  # as E2LSH._cells: a defined int64 on every CPU
                cells[c] = min(max(cells[c], -CELL_CLAMP), CELL_CLAMP)
        else:
            for c in range(m):
                cells[c] = np.floor(proj[i, c] + offsets[c])
        for t in range(n_tables):
            acc = np.uint64(0)
            for h in range(k):
                acc += np.uint64(np.int64(cells[t * k + h])) * multipliers[h]
            key = (splitmix64_one(acc) & mask) | (np.uint64(t) << shift)
            if by_table:
                out[t, i] = key
            else:
                out[i, t] = key


def warm_index_kernels() -> None:
    """Load every kernel of the index build (from numba's cache; compiled on a first run) for
    the argument types the build passes, then let small batches use them too
    (:data:`fairpipe.neighbors._segments.KERNELS_WARM`). About 0.5 s: a command line does it
    while its Prefect server starts, so a small append need not choose numpy to avoid it."""
    from fairpipe.neighbors import _segments
    from fairpipe.neighbors._lsh import E2LSH, ROW_BLOCK

    h = np.array([3, 1], dtype=np.uint64)
    order, sorted_h = stable_key_order(h)
    fill_segments(sorted_h, order + np.int64(0), 1)
    merge_sorted(sorted_h, order, sorted_h, order)
    lsh = E2LSH(n_hashes=2, n_tables=2, bucket_width=1.0, seed=0).fit(3)
    X = np.zeros((2, 3), dtype=np.float32)
    proj = np.zeros((ROW_BLOCK, 4), dtype=np.float32)[:2]
    read_only = X.copy()
    read_only.setflags(write=False)  # rows read from a file or a store
    for rows in (X, read_only):
        whole = np.empty((2, 2), dtype=np.uint64)  # a batch of one block
        lsh._fold_compiled(proj, rows, whole, True)
        lsh._fold_compiled(proj, rows, whole, False)
        several = np.empty((2, 4), dtype=np.uint64)[:, :2]  # a block of a larger batch
        lsh._fold_compiled(proj, rows, several, True)
    _segments.KERNELS_WARM = True
