"""Where appended rows go in the index (:func:`fairpipe.storage.layers.plan_layers`): delta layers that
merge as a binary counter, at most MAX_DELTAS of them, and a rebuild past 1/DELTA_SHARE."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fairpipe.storage.layers import MAIN, MAX_DELTAS, plan_layers


def attrs_of(deltas) -> dict:
    lsh: dict = {"segment_bits": 5}
    if deltas:
        lsh.update(deltas=[list(d) for d in deltas], delta_start=deltas[0][1])
    return {"lsh": lsh}


def appended(n0: int, sizes) -> list:
    """(plan, rows written) of each append of ``sizes`` rows into a store of n0 rows."""
    deltas: tuple = ()
    n, out = n0, []
    for m in sizes:
        plan = plan_layers(attrs_of(deltas), n, n + m, n + m)
        deltas = plan.deltas
        out.append((plan, n + m - plan.start))
        n += m
    return out


def test_a_new_store_builds_its_main_layer():
    plan = plan_layers(None, 0, 1000, 1000)
    assert (plan.sources, plan.target, plan.deltas) == ((), MAIN, ())
    assert plan.layout() == {"segment_bits": plan.bits}


@pytest.mark.parametrize("seed", range(6))
def test_layers_stay_contiguous_few_and_decreasing(seed):
    """Each append keeps the older layers as they are, reads back exactly the newer ones it
    merges, and leaves at most MAX_DELTAS layers of consecutive rows, each holding more rows
    than the next."""
    rng = np.random.default_rng(seed)
    n, deltas = 100_000, ()
    sizes = rng.integers(1, 400, size=60) if seed % 2 else np.full(60, 200)
    for m in sizes.tolist():
        plan = plan_layers(attrs_of(deltas), n, n + m, n + m)
        if plan.target == MAIN:
            assert plan.deltas == () and plan.sources == (MAIN, *(d[0] for d in deltas))
        else:
            older = [d for d in deltas if d[1] < plan.start]
            assert list(plan.deltas[:-1]) == older
            assert plan.sources == tuple(d[0] for d in deltas if d[1] >= plan.start)
            assert plan.dropped == [name for name in plan.sources if name != plan.target]
            starts = [start for _, start, _ in plan.deltas]
            assert [name for name, _, _ in plan.deltas] == [f"delta_{s}" for s in starts]
            assert plan.deltas[-1] == (plan.target, plan.start, plan.bits)
            assert len(plan.deltas) <= MAX_DELTAS
            rows = np.diff([*starts, n + m])
            assert (rows > 0).all() and (np.diff(rows) < 0).all()
            assert plan.layout() == {"segment_bits": 5, "delta_start": starts[0],
                                      "deltas": [list(d) for d in plan.deltas]}  # fmt: skip
        deltas, n = plan.deltas, n + m


def test_equal_appends_merge_as_a_binary_counter():
    """Appends of m rows each: after k appends the layers hold the binary digits of k times m
    (while at most MAX_DELTAS); over 2**j appends every row is written 1 + j / 2 times on
    average (a rewrite of the whole delta per append would be (2**j + 1) / 2)."""
    m, k = 100, 8
    got = appended(10**6, [m] * k)
    for i, (plan, _) in enumerate(got, start=1):
        sizes = np.diff([start for _, start, _ in plan.deltas] + [10**6 + i * m]) // m
        assert sizes.tolist() == [1 << b for b in range(i.bit_length())[::-1] if i >> b & 1]
    written = sum(rows for _, rows in got)
    assert written == k * m * (1 + math.log2(k) / 2)


def test_the_main_layer_is_rebuilt_past_the_share_or_before_a_large_merge(monkeypatch):
    """With deltas of at most 1/4 of the live rows: equal appends of 1% of 8,000 rows merge
    into layers of 1, 2, 4, 8, 16 appends; the 32nd would merge into 32% of the first rows
    (more than 3/4 of the allowance), so it rebuilds the main layer from every layer instead.
    Appends of decreasing size keep separate layers until their total passes 1/4: that one
    rebuilds."""
    import fairpipe.storage.layers

    monkeypatch.setattr(fairpipe.storage.layers, "DELTA_SHARE", 4)
    monkeypatch.setattr(fairpipe.storage.layers, "MAX_DELTAS", 4)
    n0, m = 8000, 80
    got = appended(n0, [m] * 40)
    kinds = [plan.target == MAIN for plan, _ in got]
    assert kinds.index(True) == 31 and got[30][0].deltas[0][1] == n0
    assert got[15][0].deltas == ((f"delta_{n0}", n0, got[15][0].bits),)  # 16 merged, kept
    before, (plan, written) = got[30][0], got[31]
    assert plan.sources == (MAIN, *(name for name, _, _ in before.deltas))
    assert plan.dropped == [name for name, _, _ in before.deltas]
    assert plan.deltas == () and written == n0 + 32 * m
    for k, (plan, _) in enumerate(got, start=1):  # each layer within 3/4 of the allowance
        n = n0 + k * m
        rows = np.diff([start for _, start, _ in plan.deltas] + [n])
        assert all(r * 16 <= 3 * n for r in rows) and rows.sum() * 4 <= n
    got = appended(n0, [1000, 950, 900])
    assert [plan.target == MAIN for plan, _ in got] == [False, False, True]
    assert len(got[1][0].deltas) == 2 and 2850 * 4 > n0 + 2850  # the total passes 1/4


def test_more_layers_than_allowed_are_merged():
    """Appends each smaller than the last would keep adding layers: the newest merge instead."""
    got = appended(10**6, [4000, 2000, 1000, 500, 250, 125])
    counts = [len(plan.deltas) for plan, _ in got]
    assert counts == [1, 2, 3, 4, 4, 4]
    last = got[-1][0]
    assert last.deltas[-1][1] == 10**6 + 4000 + 2000 + 1000


def test_even_blocks_cover_the_range_in_near_equal_contiguous_blocks():
    from fairpipe.storage.segments import even_blocks

    for n in (0, 1, 2, 4, 7, 100):
        for parts in (1, 2, 3, 8):
            blocks = even_blocks(n, parts)
            assert blocks[0][0] == 0 and blocks[-1][1] == n
            assert all(b == c for (_, b), (c, _) in zip(blocks, blocks[1:]))
            sizes = [b - a for a, b in blocks]
            assert len(blocks) == max(1, min(parts, n))
            assert max(sizes) - min(sizes) <= 1 and (n == 0 or min(sizes) >= 1)
