"""Data in: built-in data sets, the real data sets' loaders (points and groups), the same data
encoded for fairness testing (integer domains), and the row sources ingest reads chunk by chunk.

Built-ins need no download: ``digits`` (scikit-learn's bundled 8x8 digits) and ``gaussian`` (a
deterministic Gaussian mixture). Every loader of a real data set takes a path, so users can point
it at their own copy.
"""

from fairpipe.datasets._audit_data import (
    PROTECTED,
    AuditData,
    load_audit_adult,
    load_audit_bank,
    load_audit_csv,
    load_audit_data,
    load_audit_german,
)
from fairpipe.datasets._ids import NO_IDS, read_ids
from fairpipe.datasets._loaders import (
    AGE_NAMES,
    GAUSSIAN_BLOCK,
    Dataset,
    gaussian_block,
    load_adult,
    load_bank,
    load_census_kdd,
    load_digits,
    load_gaussian,
    load_mnist_csv,
    load_word2vec_bin,
)
from fairpipe.datasets._remote import is_url, object_store, s3_endpoint
from fairpipe.datasets._scaling import (
    SCALE_SAMPLE,
    apply_scaler,
    fit_scaler,
    resolve_scale,
    spread_warning,
)
from fairpipe.datasets._source_rows import (
    read_source_rows,
    read_source_sample,
    remap_groups,
    source_groups,
)
from fairpipe.datasets._sources import (
    BUILTINS,
    SourcePlan,
    check_gaussian_sizes,
    check_source_options,
    check_url_source,
    chunk_plan,
    plan_source,
    rows_plan,
)
from fairpipe.settings import SCALE_CHOICES, SCALE_METHODS

__all__ = [
    "object_store", "s3_endpoint",
    "AGE_NAMES", "BUILTINS", "GAUSSIAN_BLOCK", "NO_IDS", "PROTECTED", "AuditData", "Dataset", "SourcePlan",
    "check_gaussian_sizes", "check_source_options", "check_url_source", "chunk_plan", "gaussian_block", "load_adult", "load_audit_adult", "load_audit_bank", "load_audit_csv",
    "load_audit_data", "load_audit_german", "load_bank", "load_census_kdd", "load_digits",
    "load_gaussian", "load_mnist_csv", "load_word2vec_bin", "plan_source", "read_ids",
    "read_source_rows",
    "read_source_sample", "remap_groups", "rows_plan", "source_groups", "is_url",
    "SCALE_CHOICES", "SCALE_METHODS", "SCALE_SAMPLE", "apply_scaler", "fit_scaler",
    "resolve_scale", "spread_warning",
]  # fmt: skip
