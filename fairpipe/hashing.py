"""Deterministic 64-bit hashing of (seed, key) pairs.

Where a point goes (its leaf, its rank, its place in a sample) must depend on its stable id and
the seed only, never on its position in a file or on the number of workers (the determinism
contract). SplitMix64's finaliser is a bijection on 64-bit integers with good avalanche, so hashing
``id XOR mix(seed)`` gives independent-looking values for every (seed, id).
"""

from __future__ import annotations

import numpy as np

SPLITMIX_M1 = np.uint64(0xBF58476D1CE4E5B9)  # SplitMix64's multipliers (also the compiled fold's)
SPLITMIX_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser applied elementwise to a uint64 array (wrapping arithmetic).

    >>> int(splitmix64(np.array([0], dtype=np.uint64))[0])
    0
    >>> int(splitmix64(np.array([1], dtype=np.uint64))[0])
    6238072747940578789
    """
    z = np.asarray(x, dtype=np.uint64).copy()
    z ^= z >> np.uint64(30)
    z *= SPLITMIX_M1
    z ^= z >> np.uint64(27)
    z *= SPLITMIX_M2
    z ^= z >> np.uint64(31)
    return z


def seed_key(seed: int, salt: int = 0) -> np.uint64:
    """A 64-bit key for a seed (and a salt naming its use), never zero for seed 0."""
    s = np.array([(int(seed) * 0x9E3779B97F4A7C15 + int(salt) + 1) & 0xFFFFFFFFFFFFFFFF], np.uint64)
    return np.uint64(splitmix64(s + _GOLDEN)[0])


def stable_hash(seed: int, ids: np.ndarray, salt: int = 0) -> np.ndarray:
    """Hash of (seed, salt, id) for each id, as uint64.

    >>> a = stable_hash(7, np.arange(5))
    >>> bool(np.array_equal(a, stable_hash(7, np.arange(5)))), bool(np.array_equal(a, stable_hash(8, np.arange(5))))
    (True, False)
    """
    keys = np.asarray(ids).astype(np.int64, copy=False).view(np.uint64)
    return splitmix64(keys ^ seed_key(seed, salt))
