"""Query time (no flow): draw fair near neighbours from the committed index, reading only the
query's buckets and candidates (:mod:`fairpipe.storage.reader`)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fairpipe.neighbors import FairNN
from fairpipe.storage.reader import open_reader


def load_sampler(store_url: str, snapshot: str | None = None) -> tuple[FairNN, dict]:
    """The store's fair sampler, everything read into memory, and its root attributes (at
    ``snapshot``, default the tip): the hot path of a long-lived process."""
    reader = open_reader(store_url, snapshot)
    return reader.preload(), reader.attrs


def path_of(sampler: str, st) -> str:
    """How a query's samples were drawn: ``rank``; ``enumerate`` (uniformly from M(q), listed
    once); ``flat`` (rejection from the flattened buckets); ``lazy`` (rejection, draw by draw)."""
    if sampler == "rank":
        return "rank"
    if st.extra.get("enumerated"):
        return "enumerate"
    return "flat" if st.extra.get("flattened") else "lazy"


SAMPLING_DEFAULTS = {"n_samples": 10, "sampler": "exact", "mode": "exact", "seed": 0, "c": 2.0,
                     "include_query": False}  # fmt: skip
# A neighbourhood of at most this many points gets a suggested radius (StoreReader.suggest_radius).
SMALL_NEIGHBOURHOOD = 1


def sample_store(store_url: str, *, query_ids=None, query_rows=None, queries=None,
                 radius: float | None = None, **sampling) -> dict:  # fmt: skip
    """Fair samples of the store's points near each query (stored ids or rows, or points).

    ``sampling`` holds :meth:`FairNN.sample`'s options (``n_samples``, ``sampler``, ``mode``,
    ``seed``, ``c``, ``include_query``), with the command line's defaults (10 samples, seed 0, a
    query by id or row leaving its own row out); ``radius`` defaults to the store's suggested
    radius. The result keeps the command line's keys (``method`` for the sampler). A query
    whose neighbourhood holds at most one point gets ``suggested_radius``: the radius that
    would hold about 50 of its candidates (None where its buckets hold no other point), and
    ``candidates``; the others get None and their count of candidates where known.
    """
    sampling = {**SAMPLING_DEFAULTS, **sampling}
    t0 = time.perf_counter()
    reader = open_reader(store_url, keep_rows=False)  # one call: nothing to keep for later
    t_load = time.perf_counter() - t0
    if radius is None:
        radius = reader.suggested_radius
    t1 = time.perf_counter()
    res = reader.sample(queries, query_rows=query_rows, query_ids=query_ids, radius=radius,
                        with_neighbourhood=True, **sampling)  # fmt: skip
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
                # fewer drawn than asked only for a reason: "empty" (M(q) is), "draw_limit"
                "asked": st.asked,
                "drawn": st.drawn,
                "why": st.why,
                "path": path_of(sampling["sampler"], st),
                "draws": st.draws,
                "outliers_removed": st.outliers,
                "outlier_scan": st.outlier_scan,
                # the lazy path: candidates in the query's buckets, how many of their points
                # were read, and how many bounds the sketch's residual narrowed (the others
                # were decided from the sketch)
                **{
                    k: st.extra[k]
                    for k in ("candidates", "points_read", "refined")
                    if k in st.extra
                },
            }
        )
    small = [i for i, size in enumerate(sizes) if size <= SMALL_NEIGHBOURHOOD]
    for q in out:
        q["suggested_radius"] = None
    if small:
        wanted: dict[str, Any] = {"queries": None if queries is None else _subset(queries, small, 2),
                  "query_rows": None if query_rows is None else _subset(query_rows, small, 1),
                  "query_ids": None if query_ids is None else _subset(query_ids, small, 1)}  # fmt: skip
        hints = reader.suggest_radius(**wanted, include_query=sampling["include_query"],
                                      radius=radius)  # fmt: skip
        for i, hint in zip(small, hints):
            out[i].update(hint)
    result = {
        "radius": radius,
        # expected_recall: the probability that a point at distance r from the query is in
        # M(q), the share of the people within r the samples can reach (nearer ones have more);
        # max_radius, in_range: the radii the store keeps its recall target at
        **reader.reach(radius),
        "sampler": sampling["sampler"],
        "mode": sampling["mode"],
        "seed": sampling["seed"],
        "include_query": sampling["include_query"],
        # whether each query's own row is left out of its neighbourhood (by id or row)
        "own_row_excluded": queries is None and not sampling["include_query"],
        "queries": out,
        "timings": {"load": t_load, "sample": t_sample},
    }
    if len(out) == 1:
        result.update(out[0])
    return result


def _subset(queries, picked: list[int], ndim: int):
    """The queries ``picked`` of ``queries`` (ids or rows: ``ndim`` 1; points: 2), where it
    holds several (one query is kept as it is)."""
    Q = np.asarray(queries)
    return Q[picked] if Q.ndim == ndim else queries
