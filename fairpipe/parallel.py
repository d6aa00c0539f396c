"""What the compiled kernels share: one thread pool and one way to compile.

Kernels release the GIL, so a large batch of independent problems (k-means leaves, summary nodes,
ranked lists) is split into contiguous ranges solved on threads at once; each problem is solved
alone, so the split never changes a result.

``compiled`` is numba's ``njit`` with the settings every kernel of fairpipe uses: cached on disk,
no GIL, no bounds checks, and no ``fastmath``, so every sum keeps its order and rounding and a
result has the same bits wherever it is computed.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numba
import numpy as np

from fairpipe.hashing import SPLITMIX_M1, SPLITMIX_M2

THREADS = min(os.cpu_count() or 1, 8)

compiled = numba.njit(cache=True, nogil=True, boundscheck=False)

_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@compiled
def splitmix64_one(z):
    """:func:`fairpipe.hashing.splitmix64` of one uint64, inside compiled kernels."""
    z ^= z >> _S30
    z *= SPLITMIX_M1
    z ^= z >> _S27
    z *= SPLITMIX_M2
    z ^= z >> _S31
    return z


@lru_cache(maxsize=1)
def thread_pool() -> ThreadPoolExecutor:
    """The process's pool of ``THREADS`` threads for compiled kernels (created on first use)."""
    return ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="fairpipe-kernels")
