"""fairpipe: fair and forgettable pipelines for large tables of people.

This package holds the algorithms only, on numpy arrays. It imports neither Zarr, Dask nor
Prefect: persistence lives in ``storage`` and orchestration in ``flows``.
"""

from fairpipe.errors import FairpipeInputError
from fairpipe.fair_nn import FairNN
from fairpipe.lsh import E2LSH

__all__ = ["E2LSH", "FairNN", "FairpipeInputError"]
__version__ = "0.1.0"
