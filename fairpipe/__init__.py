"""fairpipe: fair and forgettable pipelines for large tables of people.

This package holds the algorithms only, on numpy arrays, one sub-package per capability:

- :mod:`fairpipe.neighbors`: fair near-neighbour sampling through LSH buckets (:class:`FairNN`);
- :mod:`fairpipe.cluster`: deletion-efficient k-means (:class:`DCKMeans`, :class:`QKMeans`);
- :mod:`fairpipe.summary`: fair data summaries (:class:`FairSummary`, :func:`fair_stream`);
- :mod:`fairpipe.ranking`: fair re-ranking (:func:`rerank`, :func:`ranking_metrics`);
- :mod:`fairpipe.audit`: fairness testing of classifiers (:func:`adf_search`);
- :mod:`fairpipe.datasets`: built-in and real data sets and the sources ingest reads.

Every estimator keeps one contract (:mod:`fairpipe.base`). The package imports neither Zarr, Dask
nor Prefect: persistence lives in ``storage`` and orchestration in ``flows``.
"""

from fairpipe.audit import adf_search, aequitas_search
from fairpipe.base import BaseEstimator, DeletionReport, NotFittedError
from fairpipe.cluster import DCKMeans, QKMeans, choose_model
from fairpipe.errors import FairpipeInputError
from fairpipe.neighbors import E2LSH, FairNN
from fairpipe.ranking import ranking_metrics, rerank
from fairpipe.summary import FairSummary, fair_stream

__all__ = [
    "E2LSH", "BaseEstimator", "DCKMeans", "DeletionReport", "FairNN", "FairSummary",
    "FairpipeInputError", "NotFittedError", "QKMeans", "adf_search", "aequitas_search",
    "choose_model", "fair_stream", "ranking_metrics", "rerank",
]  # fmt: skip
__version__ = "0.1.0"
