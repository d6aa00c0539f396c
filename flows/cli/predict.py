"""``fairpipe predict``: the nearest root centroid of the store's clustering model."""

from __future__ import annotations

from fairpipe.flows.cli._options import (
    QueryFile,
    QueryId,
    QueryRow,
    Store,
    check_options,
    read_query_file,
)
from fairpipe.flows.cli._runner import Shared, command


def _render(r: dict) -> None:
    for cluster, distance in zip(r["clusters"], r["distances"]):
        print(f"cluster {cluster}  distance {distance:.4g}")


def _check(**o) -> None:
    check_options("fairpipe predict", query_row=("count", o["query_row"]))
    if o["query_id"] is not None:
        from fairpipe.validation import check_ids

        check_ids([o["query_id"]], "--query-id", lambda i: "given to --query-id")


@command(render=_render, read_only=True, check=_check)
def predict(
    store: Store,
    query_id: QueryId = None,
    query_row: QueryRow = None,
    query_file: QueryFile = None,
    *,
    shared: Shared,
) -> dict:
    """The nearest root centroid of a stored point (by id or row) or of each row of a .npy file.

    Give one of --query-id, --query-row or --query-file.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store' and fitted by
    'fairpipe fit --store digits.store --n-clusters 10'):
      fairpipe predict --store digits.store --query-row 0
      fairpipe predict --store digits.store --query-id 42
    """
    from fairpipe.flows.predict import predict_store

    queries = read_query_file(query_file)
    return predict_store(store, query_rows=query_row, queries=queries, query_ids=query_id)
