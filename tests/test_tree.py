"""fairpipe.tree.refresh, the one tree engine, against a rebuild from scratch (the reference):
over a node store that counts what it reads and writes, a refresh after a batch of changed
leaves gives the tree a fresh build gives, and touches only the leaves' ancestors."""

import numpy as np
import pytest

from fairpipe.tree import children, nodes_per_level, refresh


class SumRule:
    """A parent is the sum of its children."""

    def __init__(self, fanout):
        self.fanout = fanout

    def parents(self, level, nodes, kids):
        return kids.reshape(nodes.shape[0], self.fanout).sum(axis=1)


class CountingStore:
    def __init__(self, fanout, height):
        self.levels = [np.zeros(n) for n in nodes_per_level(fanout, height)]
        self.written = [set() for _ in self.levels]

    def read(self, level, nodes):
        return self.levels[level][nodes]

    def write(self, level, nodes, batch):
        self.levels[level][nodes] = batch
        self.written[level].update(nodes.tolist())

    def empty(self, level, nodes):
        self.levels[level][nodes] = 0.0


def build(fanout, height, values):
    """The reference: every level summed from scratch."""
    levels = [np.asarray(values, dtype=float)]
    for _ in range(height):
        levels.append(levels[-1].reshape(-1, fanout).sum(axis=1))
    return levels


@pytest.mark.parametrize(("fanout", "height"), [(2, 1), (3, 3), (8, 2)])
def test_a_refresh_equals_a_rebuild_and_touches_only_the_ancestors(fanout, height):
    rng = np.random.default_rng(fanout * 10 + height)
    n = fanout**height
    values = rng.integers(1, 100, n).astype(float)
    store = CountingStore(fanout, height)
    all_leaves = np.arange(n)
    refresh(fanout, height, all_leaves, all_leaves, values, SumRule(fanout), store)
    for got, want in zip(store.levels, build(fanout, height, values)):
        np.testing.assert_array_equal(got, want)

    for _ in range(5):
        changed = rng.choice(n, size=rng.integers(1, max(2, n // 3)), replace=True)
        emptied = np.unique(changed)[::2]  # every other one loses its last row
        solved = np.setdiff1d(changed, emptied)
        values[emptied] = 0.0
        values[solved] = rng.integers(1, 100, solved.size)
        store.written = [set() for _ in store.levels]
        out = refresh(fanout, height, changed, solved, values[solved], SumRule(fanout), store)
        for got, want in zip(store.levels, build(fanout, height, values)):
            np.testing.assert_array_equal(got, want)
        ancestors = [np.unique(changed)]
        for _level in range(height):
            ancestors.append(np.unique(ancestors[-1] // fanout))
        for level in range(height + 1):
            np.testing.assert_array_equal(out[level], ancestors[level])
            assert store.written[level] <= set(ancestors[level].tolist())


def test_children_are_listed_node_after_node():
    np.testing.assert_array_equal(children(np.array([2, 0]), 3), [6, 7, 8, 0, 1, 2])
