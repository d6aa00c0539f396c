"""fairpipe: fair and forgettable pipelines for large tables of people.

This package holds the algorithms only, on numpy arrays, one sub-package per capability:

- :mod:`fairpipe.neighbors`: fair near-neighbour sampling through LSH buckets (:class:`FairNN`);
- :mod:`fairpipe.cluster`: deletion-efficient k-means (:class:`DCKMeans`, :class:`QKMeans`);
- :mod:`fairpipe.summary`: fair data summaries (:class:`FairSummary`, :func:`fair_stream`);
- :mod:`fairpipe.ranking`: fair re-ranking (:func:`rerank`, :func:`ranking_metrics`);
- :mod:`fairpipe.audit`: fairness testing of classifiers (:func:`adf_search`);
- :mod:`fairpipe.datasets`: built-in and real data sets and the sources ingest reads.

Every estimator keeps one contract (:mod:`fairpipe.base`). The package imports neither Zarr,
Icechunk, Prefect nor distributed, nor ``storage`` or ``flows``: persistence lives in
``storage`` (queries over a stored index: ``fairpipe.storage.open_reader``) and orchestration in
``flows``. The contracts in pyproject.toml (``lint-imports``, run by ``make test``) keep it so.

The names below are imported from their sub-package on first use, so that importing one small
module (``fairpipe.errors``, as the command line does before it knows the command) does not
compile-load every capability.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the sub-package that defines it.
_EXPORTS = {
    "E2LSH": "fairpipe.neighbors",
    "FairNN": "fairpipe.neighbors",
    "DCKMeans": "fairpipe.cluster",
    "QKMeans": "fairpipe.cluster",
    "choose_model": "fairpipe.cluster",
    "FairSummary": "fairpipe.summary",
    "fair_stream": "fairpipe.summary",
    "rerank": "fairpipe.ranking",
    "ranking_metrics": "fairpipe.ranking",
    "adf_search": "fairpipe.audit",
    "aequitas_search": "fairpipe.audit",
    "BaseEstimator": "fairpipe.base",
    "DeletionReport": "fairpipe.base",
    "NotFittedError": "fairpipe.base",
    "FairpipeInputError": "fairpipe.errors",
}
__all__ = [
    "E2LSH", "BaseEstimator", "DCKMeans", "DeletionReport", "FairNN", "FairSummary",
    "FairpipeInputError", "NotFittedError", "QKMeans", "adf_search", "aequitas_search",
    "choose_model", "fair_stream", "ranking_metrics", "rerank",
]  # fmt: skip
__version__ = "0.1.0"

if TYPE_CHECKING:
    from fairpipe.audit import adf_search, aequitas_search
    from fairpipe.base import BaseEstimator, DeletionReport, NotFittedError
    from fairpipe.cluster import DCKMeans, QKMeans, choose_model
    from fairpipe.errors import FairpipeInputError
    from fairpipe.neighbors import E2LSH, FairNN
    from fairpipe.ranking import ranking_metrics, rerank
    from fairpipe.summary import FairSummary, fair_stream


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fairpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
