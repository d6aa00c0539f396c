"""The id lookup every forget and query-by-id goes through, against a dict."""

import numpy as np
import pytest

from fairpipe.validation import IdLookup


@pytest.mark.parametrize("order", ["increasing", "shuffled", "with_gaps_decreasing"])
def test_id_lookup_finds_the_rows_a_dict_finds(order):
    rng = np.random.default_rng(5)
    ids = np.cumsum(rng.integers(1, 9, size=5_000)) - 40  # increasing, some negative
    if order == "shuffled":
        ids = rng.permutation(ids)
    elif order == "with_gaps_decreasing":
        ids = ids[::-1].copy()
    wanted = np.r_[rng.choice(ids, 300), [-1_000, 10**9, ids.max() + 1]]
    rows, known = IdLookup(ids).rows(wanted)
    where = {int(v): r for r, v in enumerate(ids)}
    assert known.tolist() == [int(w) in where for w in wanted]
    assert rows.tolist() == [where[int(w)] for w in wanted if int(w) in where]
    # The increasing case keeps no sorted copy (no sort at all).
    assert (IdLookup(ids).order is None) == (order == "increasing")


def test_id_lookup_of_an_empty_or_single_store():
    assert IdLookup(np.zeros(0, np.int64)).rows(np.array([3]))[1].tolist() == [False]
    rows, known = IdLookup(np.array([7])).rows(np.array([7, 8]))
    assert rows.tolist() == [0] and known.tolist() == [True, False]
