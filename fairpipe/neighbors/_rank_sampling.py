"""Random-rank fair sampling with independence across repeated queries.

Aumuller, Har-Peled, Mahabadi, Pagh, Silvestri, "Sampling a Near Neighbor in High Dimensions - Who
is the Fairest of Them All?" (ACM TODS 2022): fix a random permutation ``rank`` of all points; the
answer to a query is the near point of lowest rank in the union of its buckets. After reporting p
of rank i, swap p's rank with a uniformly random rank in [i, n): the permutation restricted to the
points not yet reported stays uniform, so repeated queries give independent uniform samples.
"""

from __future__ import annotations

import heapq

import numpy as np

from fairpipe.hashing import stable_hash


class RankState:
    """The evolving permutation; rank i is held by row ``row_at[i]``.

    Deleted rows (``alive`` False) hold the last ranks and never move, so the live rows' ranks are
    the permutation a fresh index of the live rows would start from.
    """

    def __init__(self, ids: np.ndarray, seed: int, alive: np.ndarray | None = None):
        order = np.argsort(stable_hash(seed, ids, salt=0x4A4B), kind="stable")
        if alive is not None:
            live = np.asarray(alive, dtype=bool)[order]
            order = np.concatenate([order[live], order[~live]])
        self.n_live = int(order.shape[0] if alive is None else np.count_nonzero(alive))
        self.row_at = order.astype(np.int64)
        self.rank = np.empty_like(self.row_at)
        self.rank[self.row_at] = np.arange(self.row_at.shape[0], dtype=np.int64)

    def sample(
        self, candidates: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> np.ndarray:
        """``n_samples`` successive answers over the near ``candidates`` (unique rows)."""
        if candidates.size == 0:
            return np.zeros(0, dtype=np.int64)
        n = self.n_live
        in_cand = set(candidates.tolist())
        heap = list(zip(self.rank[candidates].tolist(), candidates.tolist()))
        heapq.heapify(heap)
        out = np.empty(n_samples, dtype=np.int64)
        swaps = rng.random(n_samples)
        rank, row_at = self.rank, self.row_at
        for s in range(n_samples):
            while True:
                r, p = heap[0]
                if rank[p] == r:
                    break
                heapq.heappop(heap)
            out[s] = p
            j = r + int(swaps[s] * (n - r))
            other = int(row_at[j])
            rank[p], rank[other] = j, r
            row_at[r], row_at[j] = other, p
            heapq.heapreplace(heap, (j, p))
            if other != p and other in in_cand:
                heapq.heappush(heap, (r, other))
        return out
