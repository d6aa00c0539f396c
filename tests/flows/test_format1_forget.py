"""Today's forget flow on a store written before the refactor (store format 1,
``tests/data/format1``): every artifact equals the in-memory estimators' deletion, and its first
write upgrades the index to format 2's segments."""

from __future__ import annotations

import numpy as np

from fairpipe import DCKMeans, FairNN
from fairpipe.flows.forget import run_forget
from fairpipe.storage.index import load_sampler
from fairpipe.storage.layers import load_lsh
from fairpipe.storage.models import read_model
from tests.storage.test_format1 import fresh_summary, open_copy, same, stored_summary


def test_todays_forget_flow_updates_a_format_1_store_as_the_estimators_delete(prefect_server,
                                                                              tmp_path):  # fmt: skip
    path, store, session, attrs = open_copy(tmp_path, "dc")
    X, ids, groups = (store.read(n) for n in ("points", "ids", "groups"))
    # (what the store holds before: tests/storage/test_format1.py)
    fresh_nn = FairNN(**load_lsh(session, attrs).get_params()).fit(X, ids=ids)
    model = read_model(session, "dc")
    summary, height = fresh_summary(session, X, ids, groups)

    # Today's forget flow on the old store: every artifact equals the in-memory deletion.
    gone = ids[[5, 17, 250]]
    res = run_forget(str(path), gone, n_workers=1, processes=False)
    assert sorted(res["deleted"]) == sorted(gone.tolist())
    fresh = DCKMeans(**model.get_params()).fit(X, ids=ids)  # the stored model has no rows
    fresh.delete(gone)
    summary.delete(gone)
    after = store.readonly_session()
    same(read_model(after, "dc").to_arrays(data=False), fresh.to_arrays(data=False))
    same(stored_summary(after, height), summary.to_arrays(data=False))
    assert store.attrs(after)["fairpipe_format"] == 2  # the write upgraded the index
    upgraded = load_sampler(after, store.attrs(after))
    assert not np.isin(upgraded.index_.members, np.flatnonzero(np.isin(ids, gone))).any()
    fresh_nn.delete(gone)
    radius = float(attrs["suggested_radius"])
    for q in ([3], [40, 41]):
        got = upgraded.sample(query_rows=q, radius=radius, n_samples=30, seed=1, mode="buckets")
        want = fresh_nn.sample(query_rows=q, radius=radius, n_samples=30, seed=1, mode="buckets")
        assert np.array_equal(got.ids, want.ids)
