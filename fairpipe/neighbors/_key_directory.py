"""Open-addressing hash directory from 64-bit bucket keys to bucket numbers.

A sorted array answers "where is key q" with a binary search: about log2(B) dependent cache misses
per key (24 at B = 13M buckets, most of a query's time at n = 1M). This directory answers it with
one: key q lives at or after its home slot ``(q * 0x9E3779B97F4A7C15) >> (64 - bits)`` (Fibonacci
hashing) in a table at most half full, found by linear probing. A lookup reads a window of
``WINDOW`` consecutive slots (one cache line) per key, so almost every key resolves in one
vectorised step; ``long_run`` marks the home slots whose keys were pushed past the window, the
only ones that need probing further.

The layout depends on the insertion order, the answers do not: a key is found exactly when it was
inserted, with the bucket number it was inserted with.

>>> d = KeyDirectory.build(np.array([7, 3, 11], dtype=np.uint64))
>>> d.find(np.array([11, 5, 7, 3], dtype=np.uint64))
array([ 2, -1,  0,  1])
"""

from __future__ import annotations

import numpy as np

EMPTY = np.uint64(0xFFFF_FFFF_FFFF_FFFF)  # table 65535 does not exist (at most 65535 tables)
GOLDEN = np.uint64(0x9E37_79B9_7F4A_7C15)
WINDOW = 8
WIDE = 64
_WINDOW_STEPS = np.arange(WINDOW, dtype=np.int64)
_WIDE_STEPS = np.arange(WINDOW, WINDOW + WIDE, dtype=np.int64)


def home_slots(keys: np.ndarray, bits: int) -> np.ndarray:
    return ((keys * GOLDEN) >> np.uint64(64 - bits)).astype(np.int64)


class KeyDirectory:
    """Build with :meth:`build`; :meth:`find` maps keys to bucket numbers (-1: absent)."""

    def __init__(self, slot_keys, slot_bucket, long_run, bits: int):
        self.slot_keys = slot_keys
        self.slot_bucket = slot_bucket
        self.long_run = long_run
        self.bits = bits

    @classmethod
    def build(cls, keys: np.ndarray) -> KeyDirectory:
        """Insert ``keys`` (distinct, none equal to ``EMPTY``): key i maps to bucket i."""
        keys = np.asarray(keys, dtype=np.uint64)
        n = keys.shape[0]
        bits = max(4, (2 * n - 1).bit_length())  # 2**bits >= 2n: at most half full
        size = 1 << bits
        slot_keys = np.full(size + 2 * WINDOW, EMPTY, dtype=np.uint64)
        slot_bucket = np.full(slot_keys.shape[0], -1, dtype=np.int32 if n < 2**31 else np.int64)
        long_run = np.zeros(size, dtype=bool)
        pending = np.arange(n, dtype=np.int64)
        home = home_slots(keys, bits)
        slot = home.copy()
        step = 0
        while pending.size:
            # Keep WINDOW empty slots past the last used one: a lookup window never runs off.
            if int(slot.max()) + 2 * WINDOW > slot_keys.shape[0]:
                grow = max(slot_keys.shape[0] // 4, 4 * WINDOW)
                slot_keys = np.append(slot_keys, np.full(grow, EMPTY, dtype=np.uint64))
                slot_bucket = np.append(slot_bucket, np.full(grow, -1, dtype=slot_bucket.dtype))
            free = np.flatnonzero(slot_keys[slot] == EMPTY)
            cand_slot, cand = slot[free], pending[free]
            slot_bucket[cand_slot] = cand  # keys competing for one free slot: one of them wins
            won = slot_bucket[cand_slot] == cand
            slot_keys[cand_slot[won]] = keys[cand[won]]
            if step >= WINDOW:
                long_run[home[cand[won]]] = True
            keep = np.ones(pending.shape[0], dtype=bool)
            keep[free[won]] = False
            pending, slot = pending[keep], slot[keep] + 1
            step += 1
        return cls(slot_keys, slot_bucket, long_run, bits)

    def find(self, q: np.ndarray) -> np.ndarray:
        """Bucket number of each key of the 1-d array ``q``, -1 where it was never inserted."""
        home = home_slots(q, self.bits)
        window = self.slot_keys[home[:, None] + _WINDOW_STEPS]
        hit = window == q[:, None]
        step = hit.argmax(axis=1)
        found = hit[np.arange(q.shape[0]), step]
        bucket = self.slot_bucket[home + step].astype(np.int64)
        if found.all():
            return bucket
        bucket[~found] = -1
        far = np.flatnonzero(~found & self.long_run[home])
        if far.size:
            # Keys pushed past the window: one wider vectorised look, then probe the rare rest.
            idx = np.minimum(home[far, None] + _WIDE_STEPS, self.slot_keys.shape[0] - 1)
            wide = self.slot_keys[idx]
            hit = wide == q[far, None]
            step = hit.argmax(axis=1)
            got = hit[np.arange(far.shape[0]), step]
            bucket[far[got]] = self.slot_bucket[idx[got, step[got]]]
            rest = ~got & (wide != EMPTY).all(axis=1)
            for i, start in zip(far[rest], home[far[rest]] + WINDOW + WIDE):
                bucket[i] = self._probe(q[i], int(start))
        return bucket

    def _probe(self, key: np.uint64, slot: int) -> int:
        while True:
            chunk = self.slot_keys[slot : slot + 8 * WINDOW]
            at = np.flatnonzero((chunk == key) | (chunk == EMPTY))
            if at.size:
                j = slot + int(at[0])
                return int(self.slot_bucket[j]) if self.slot_keys[j] == key else -1
            slot += 8 * WINDOW
