"""One deletion-equivalence suite over both node stores of the tree engine
(:func:`fairpipe.tree.refresh`): a DC-k-means tree held in memory (:class:`LevelArrays`, through
``DCKMeans.delete``) and the same tree in a store (:class:`StoredLevels`, refreshed as the forget
and ingest flows refresh it: the reached leaves solved from their live rows, then
:func:`refresh_levels` reading and writing only the nodes it touches). After every batch, each
equals a fresh fit on the rows left, bit for bit. No Prefect: a store is built here directly."""

from __future__ import annotations

import numpy as np
import pytest

from fairpipe.cluster import DCKMeans, refresh_levels, solve_leaves
from fairpipe.storage.models import StoredLevels, read_model, write_model
from fairpipe.storage.store import FairpipeStore
from fairpipe.tree import leaf_of, reached_leaves

PARAMS = dict(n_clusters=3, fanout=3, height=2, max_iter=10, n_init=2, seed=7)


class InMemory:
    def __init__(self, tmp_path, X, ids):
        self.model = DCKMeans(**PARAMS).fit(X, ids=ids)

    def delete(self, gone: np.ndarray) -> int:
        return self.model.delete(gone).leaves_recomputed

    def arrays(self) -> dict:
        return self.model.to_arrays(data=False)


class InStore:
    def __init__(self, tmp_path, X, ids):
        self.X, self.ids, self.alive = X, ids, np.ones(ids.size, bool)
        self.store = FairpipeStore.open(str(tmp_path / "s"), create=True)
        with self.store.transaction("fit") as txn:
            write_model(txn.root, DCKMeans(**PARAMS).fit(X, ids=ids))

    def delete(self, gone: np.ndarray) -> int:
        rows = np.flatnonzero(np.isin(self.ids, gone) & self.alive)
        self.alive[rows] = False
        seed, n_leaves = PARAMS["seed"], PARAMS["fanout"] ** PARAMS["height"]
        leaves, live = reached_leaves(self.ids, self.alive, rows, seed, n_leaves)
        leaf = leaf_of(self.ids[live], seed, n_leaves)
        solved = np.unique(leaf)  # as the Dask shuffle gives them: leaves left empty get none
        c, m = solve_leaves(self.X[live], self.ids[live], leaf, solved, PARAMS["n_clusters"],
                            PARAMS["max_iter"], seed)  # fmt: skip
        with self.store.transaction("forget") as txn:
            levels = StoredLevels(txn.root)
            changed = refresh_levels(PARAMS, levels, leaves, solved, c, m)
        # Only the ancestors of the reached leaves: one node a level above them at most per leaf.
        assert all(nodes.size <= leaves.size for nodes in changed)
        return int(leaves.size)

    def arrays(self) -> dict:
        model = read_model(self.store.readonly_session(), "dc")
        assert isinstance(model, DCKMeans)
        return model.to_arrays(data=False)


@pytest.mark.parametrize("node_store", [InMemory, InStore], ids=["memory", "store"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_batch_leaves_the_tree_a_fresh_fit_would_build(tmp_path, node_store, seed):
    rng = np.random.default_rng(seed)
    n = 600
    X = np.concatenate([rng.normal(c, 0.4, size=(n // 3, 4)) for c in (-2.0, 0.0, 3.0)])
    X = X.astype(np.float32)  # as a store keeps points
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    tree = node_store(tmp_path, X, ids)
    left = np.ones(n, bool)
    # A single id, a small batch, a batch that empties whole leaves, and a repeat.
    by_leaf = leaf_of(ids, PARAMS["seed"], PARAMS["fanout"] ** PARAMS["height"])
    batches = [
        ids[[5]],
        rng.choice(ids, 40, replace=False),
        ids[by_leaf == by_leaf[0]],
        ids[[5]],
    ]
    for gone in batches:
        fresh_gone = np.isin(ids, gone) & left
        tree.delete(gone)
        left &= ~np.isin(ids, gone)
        fresh = DCKMeans(**PARAMS).fit(X[left], ids=ids[left]).to_arrays(data=False)
        got = tree.arrays()
        assert got.keys() == fresh.keys()
        for name in fresh:
            assert np.array_equal(got[name], fresh[name]), (name, int(fresh_gone.sum()))
