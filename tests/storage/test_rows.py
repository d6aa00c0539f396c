"""A store's rows in blocks (:class:`fairpipe.storage.rows.RowBlocks`): the ranges the jobs read
and the writers own, compared with the rows they must cover."""

from __future__ import annotations

import numpy as np
import pytest

from fairpipe.storage.rows import RowBlocks, choose_chunk_rows


@pytest.mark.parametrize("n,size", [(0, 4), (1, 4), (7, 4), (8, 4), (9, 4), (100, 7)])
def test_the_blocks_cover_every_row_once_and_hold_size_rows_but_the_last(n, size):
    ranges = RowBlocks(n, size).ranges()
    covered = np.concatenate([np.arange(a, b) for a, b in ranges] + [np.zeros(0, int)])
    assert np.array_equal(covered, np.arange(n))
    assert all(a % size == 0 and b - a == min(size, n - a) for a, b in ranges)


def test_the_blocks_holding_some_rows_are_those_and_only_those():
    blocks = RowBlocks(100, 8)
    rows = np.array([99, 3, 4, 17, 64, 3])
    ranges = blocks.ranges(rows)
    assert ranges == [(0, 8), (16, 24), (64, 72), (96, 100)]
    assert all(((rows >= a) & (rows < b)).any() for a, b in ranges)


@pytest.mark.parametrize("base", [0, 1, 7, 8, 9, 23, 24])
@pytest.mark.parametrize("n", [25, 32, 33])
def test_new_rows_are_cut_at_the_blocks_edges_so_no_two_writers_share_a_chunk(base, n):
    size = 8
    pieces = RowBlocks(n, size).since(base)
    covered = np.concatenate([np.arange(a, b) for a, b in pieces]) + base
    assert np.array_equal(covered, np.arange(base, n))
    for a, b in pieces:  # each piece inside one block of the store
        assert (a + base) // size == (b - 1 + base) // size


def test_a_new_dataset_takes_the_given_block_or_about_16_mb_of_points():
    assert RowBlocks.new(128, 4096) == RowBlocks(0, 4096)
    assert RowBlocks.new(128).size == choose_chunk_rows(128)
    assert RowBlocks.new(128).grown(10).n == 10
    assert RowBlocks.of({"n": 5, "chunk_rows": 2}) == RowBlocks(5, 2)
