"""Query time (no flow): open the committed index and draw fair near neighbours."""

from __future__ import annotations

import time

import numpy as np

from fairpipe.errors import FairpipeInputError
from fairpipe.neighbors import FairNN
from storage.index import load_sampler as load_store_sampler
from storage.store import FairpipeStore

UNKNOWN_ID = "Id {id} is not in the store {url}."


def load_sampler(store_url: str, snapshot: str | None = None) -> tuple[FairNN, dict]:
    """The store's fair sampler and its root attributes (at ``snapshot``, default the tip)."""
    store = FairpipeStore.open(store_url)
    store.require_data()
    session = store.readonly_session(snapshot)
    attrs = store.attrs(session)
    return load_store_sampler(session, attrs), attrs


def rows_for_ids(nn: FairNN, ids, url: str) -> np.ndarray:
    """Rows of the stored ``ids``, or an error naming the first unknown one."""
    ids = np.atleast_1d(np.asarray(ids, dtype=np.int64))
    rows, known = nn.rows_of(ids)
    if not known.all():
        raise FairpipeInputError(UNKNOWN_ID.format(id=int(ids[np.argmin(known)]), url=url))
    return rows


SAMPLING_DEFAULTS = {"n_samples": 10, "sampler": "exact", "mode": "exact", "seed": 0, "c": 2.0}


def sample_store(store_url: str, *, query_ids=None, query_rows=None, queries=None,
                 radius: float | None = None, **sampling) -> dict:  # fmt: skip
    """Fair samples of the store's points near each query (stored ids or rows, or points).

    ``sampling`` holds :meth:`FairNN.sample`'s options (``n_samples``, ``sampler``, ``mode``,
    ``seed``, ``c``), with the command line's defaults (10 samples, seed 0); ``radius`` defaults
    to the store's suggested radius. The result keeps the command line's keys (``method`` for the
    sampler).
    """
    sampling = {**SAMPLING_DEFAULTS, **sampling}
    t0 = time.perf_counter()
    nn, attrs = load_sampler(store_url)
    t_load = time.perf_counter() - t0
    if radius is None:
        radius = float(attrs["suggested_radius"])
    if query_ids is not None:
        query_rows = rows_for_ids(nn, query_ids, store_url)
    t1 = time.perf_counter()
    res = nn.sample(queries, query_rows=query_rows, radius=radius, with_neighbourhood=True,
                    **sampling)  # fmt: skip
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
        "method": sampling["sampler"],
        "mode": sampling["mode"],
        "seed": sampling["seed"],
        "queries": out,
        "timings": {"load": t_load, "sample": t_sample},
    }
    if len(out) == 1:
        result.update(out[0])
    return result
