"""Fairness-aware re-ranking (Geyik et al., KDD 2019): DetGreedy, DetCons, DetRelaxed and
DetConstSort for many lists at once (:func:`rerank`), and the ranking-fairness metrics Skew@k,
NDKL, InfeasibleIndex and NDCG (:func:`ranking_metrics` and the reference functions); candidate
tables read and re-ranked list by list (:func:`read_candidates`, :func:`rerank_lists`)."""

from fairpipe.ranking._candidates import (
    METRICS,
    CandidateLists,
    candidate_columns,
    check_table_ahead,
    load_desired_file,
    mean_over_lists,
    metrics_table,
    read_candidates,
    read_table,
    rerank_lists,
)
from fairpipe.ranking._metrics import (
    infeasible_index,
    ndcg,
    ndkl,
    prefix_counts,
    ranking_metrics,
    skew,
)
from fairpipe.ranking._reranking import ALGORITHMS, TOL, check_desired, check_lists, rerank

__all__ = [
    "candidate_columns", "check_table_ahead",
    "ALGORITHMS", "METRICS", "TOL", "CandidateLists", "check_desired", "check_lists",
    "infeasible_index", "load_desired_file", "mean_over_lists",
    "metrics_table", "ndcg", "ndkl", "prefix_counts", "ranking_metrics", "read_candidates",
    "read_table", "rerank", "rerank_lists", "skew",
]  # fmt: skip
