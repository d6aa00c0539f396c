"""Query time (no flow): open the committed index and draw fair near neighbours."""

from __future__ import annotations

import time

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.fair_nn import FairNN
from storage.store import FairpipeStore

UNKNOWN_ID = "Id {id} is not in the store {url}."


def load_sampler(store_url: str, snapshot: str | None = None) -> tuple[FairNN, dict]:
    store = FairpipeStore.open(store_url)
    store.require_data()
    session = store.readonly_session(snapshot)
    attrs = store.attrs(session)
    nn = FairNN.from_arrays(
        points=store.read("points", session=session),
        ids=store.read("ids", session=session),
        keys=store.read("lsh/keys", session=session),
        index=store.load_index(session),
        lsh=store.load_lsh(session),
        alive=store.read("alive", session=session),
    )
    return nn, attrs


def rows_for_ids(nn: FairNN, ids, url: str) -> np.ndarray:
    order = np.argsort(nn.ids_)
    ids = np.atleast_1d(np.asarray(ids, dtype=np.int64))
    pos = np.searchsorted(nn.ids_[order], ids)
    pos = np.minimum(pos, order.shape[0] - 1)
    bad = nn.ids_[order][pos] != ids
    if bad.any():
        raise FairpipeInputError(UNKNOWN_ID.format(id=int(ids[np.argmax(bad)]), url=url))
    return order[pos]


def sample_store(
    store_url: str,
    *,
    query_ids=None,
    query_rows=None,
    queries: np.ndarray | None = None,
    radius: float | None = None,
    n_samples: int = 10,
    method: str = "exact",
    mode: str = "exact",
    seed: int = 0,
    c: float = 2.0,
) -> dict:
    t0 = time.perf_counter()
    nn, attrs = load_sampler(store_url)
    t_load = time.perf_counter() - t0
    if radius is None:
        radius = float(attrs["suggested_radius"])
    if query_ids is not None:
        query_rows = rows_for_ids(nn, query_ids, store_url)
    t1 = time.perf_counter()
    res = nn.sample(
        queries,
        query_rows=query_rows,
        radius=radius,
        n_samples=n_samples,
        method=method,
        mode=mode,
        seed=seed,
        c=c,
        with_neighbourhood=True,
    )
    t_sample = time.perf_counter() - t1
    assert res.neighbourhood_sizes is not None  # asked for with_neighbourhood=True
    sizes = res.neighbourhood_sizes.astype(int).tolist()
    out = []
    for i in range(res.ids.shape[0]):
        st = res.stats[i]
        out.append(
            {
                "ids": res.ids[i, : res.counts[i]].tolist(),
                "neighbourhood_size": sizes[i],
                "draws": st.draws,
                "outliers_removed": st.outliers,
                "outlier_scan": st.outlier_scan,
            }
        )
    result = {
        "radius": radius,
        "method": method,
        "mode": mode,
        "seed": seed,
        "queries": out,
        "timings": {"load": t_load, "sample": t_sample},
    }
    if len(out) == 1:
        result.update(out[0])
    return result
