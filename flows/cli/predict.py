"""``fairpipe predict``: the nearest root centroid of the store's clustering model."""

from __future__ import annotations

from typing import Any

from fairpipe.flows.cli._options import Store, given_queries
from fairpipe.flows.cli._runner import Shared, command
from fairpipe.settings import QUERIES


def _render(r: dict) -> None:
    for cluster, distance in zip(r["clusters"], r["distances"]):
        print(f"cluster {cluster}  distance {distance:.4g}")


@command(render=_render, read_only=True, settings=QUERIES)
def predict(store: Store, *, shared: Shared, **settings: Any) -> dict:
    """The nearest root centroid of a stored point (by id or row) or of each row of a .npy file.

    Give one of --query-id, --query-ids-file (many), --query-row or --query-file.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store' and fitted by
    'fairpipe fit --store digits.store --n-clusters 10'):
      fairpipe predict --store digits.store --query-row 0
      fairpipe predict --store digits.store --query-id 42
    """
    from fairpipe.flows.predict import predict_store

    return predict_store(store, **given_queries(settings))
