"""The flows' options, one dataclass per flow, their defaults from each setting's declaration
(:mod:`fairpipe.settings`, which the command line's flags come from too); the deployments'
parameters are checked against them. This module imports no Prefect or Dask, so a command's
checks read it before anything starts. Old names are listed in :mod:`fairpipe.old_names`."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from fairpipe import settings as S
from fairpipe.flows.renamed import take_old_names
from fairpipe.old_names import OLD_OPTIONS

# The metadata of an options field that Prefect must not record (fairpipe.flows.private).
PRIVATE = {"private": True}


# -- ingest -----------------------------------------------------------------------------------------
# The defaults of a new store (None in the options: the store's own when appending).
DEFAULTS = {"seed": S.SEED.default, "scale": "auto"}


@dataclass
class IngestOptions:
    """The ingest flow's parameters: E2LSH's own names (the command line's flags in
    kebab-case). ``None`` means: the store's setting when appending, else the default (seed 0;
    n_hashes, n_tables and bucket_width chosen for ``recall`` 0.98 at ``radius``, by default
    the median nearest-neighbour distance of a sample:
    :func:`fairpipe.flows.parameters.new_store_parameters`; about 16 MB of points per chunk; scale
    ``auto``). An append given a setting that differs from the store's is refused."""

    seed: int | None = None
    group_column: str | None = None
    id_column: str | None = None
    groups_file: str | None = None
    ids_file: str | None = None
    n_hashes: int | None = None  # hash functions per table
    n_tables: int | None = None
    bucket_width: float | None = None
    radius: float | None = None  # the query radius the parameters are chosen for
    # the largest radius the index keeps the recall at (default 4 x radius): its scales
    max_radius: float | None = None
    recall: float | None = None  # the target recall at the radius (default 0.98)
    chunk_rows: int | None = None
    # none | standard | robust, or auto: standard for a table (CSV, Parquet), none for a .npy
    # matrix or a built-in data set (fairpipe.datasets.resolve_scale)
    scale: str | None = None

    def get(self, name: str):
        value = getattr(self, name)
        return DEFAULTS.get(name) if value is None else value

    gaussian: dict = field(default_factory=dict)
    lock_timeout: float = S.LOCK_TIMEOUT.default
    # The caller found no store at the URL when it started (a command line meaning to create
    # one): a store found there now was made by another command meanwhile, which is a busy
    # store (exit 3), not one to append to.
    new_store: bool = False
    # The old names (fairpipe.flows.renamed), accepted for one release.
    lsh_k: InitVar[int | None] = None
    lsh_tables: InitVar[int | None] = None
    lsh_width: InitVar[float | None] = None

    def __post_init__(self, lsh_k, lsh_tables, lsh_width) -> None:
        take_old_names(self, OLD_OPTIONS["ingest"], {"lsh_k": lsh_k, "lsh_tables": lsh_tables,
                                         "lsh_width": lsh_width})  # fmt: skip


# -- fit --------------------------------------------------------------------------------------------
@dataclass
class FitOptions:
    """The fit flow's parameters: :class:`DCKMeans`' and :class:`QKMeans`' own names and
    defaults (the command line's flags in kebab-case), with ``model`` choosing between them."""

    n_clusters: int = S.N_CLUSTERS.default
    model: str = S.MODEL.default  # dc | q | auto
    fanout: int = S.FANOUT.default
    height: int = S.HEIGHT.default
    max_iter: int = S.MAX_ITER.default
    n_init: int | None = S.N_INIT.default  # None: each model's own (S.DC_N_INIT, S.Q_N_INIT)
    seed: int = S.SEED.default
    epsilon: float = S.EPSILON.default
    balance: float = S.BALANCE.default
    lock_timeout: float = S.LOCK_TIMEOUT.default
    # The old names (fairpipe.flows.renamed), accepted for one release.
    k: InitVar[int | None] = None
    width: InitVar[int | None] = None
    iterations: InitVar[int | None] = None
    gamma: InitVar[float | None] = None

    def __post_init__(self, k, width, iterations, gamma) -> None:
        take_old_names(self, OLD_OPTIONS["fit"], {"k": k, "width": width, "iterations": iterations,
                                         "gamma": gamma})  # fmt: skip

    def dc_params(self) -> dict:
        """The parameters of :class:`DCKMeans`."""
        return dict(
            n_clusters=self.n_clusters, fanout=self.fanout, height=self.height,
            max_iter=self.max_iter, n_init=S.DC_N_INIT.default if self.n_init is None else self.n_init,
            seed=self.seed,
        )  # fmt: skip

    def q_params(self) -> dict:
        """The parameters of :class:`QKMeans`."""
        return dict(
            n_clusters=self.n_clusters, epsilon=self.epsilon, balance=self.balance,
            max_iter=self.max_iter, n_init=S.Q_N_INIT.default if self.n_init is None else self.n_init,
            seed=self.seed,
        )  # fmt: skip


# -- summarize --------------------------------------------------------------------------------------
@dataclass
class SummarizeOptions:
    """The summarize flow's parameters: :class:`FairSummary`'s own names and defaults (the
    command line's flags in kebab-case); ``lower``/``upper`` as fractions of k, or
    ``bounds`` (a JSON file of counts per group)."""

    k: int = S.SUMMARY_K.default
    lower: float | None = S.LOWER.default  # fraction of k, for every group
    upper: float | None = S.UPPER.default
    bounds: str | None = S.BOUNDS.default  # a JSON file: per group name, counts
    utility: str = S.UTILITY.default
    rule: str = S.RULE.default
    factor: float = S.FACTOR.default
    eval_size: int = S.EVAL_SIZE.default
    gamma: float | None = S.GAMMA.default
    fanout: int = S.FANOUT.default
    height: int = S.SUMMARY_HEIGHT.default
    seed: int = S.SEED.default
    lock_timeout: float = S.LOCK_TIMEOUT.default
    # The old names of ``fanout`` and ``bounds`` (fairpipe.flows.renamed), for one release.
    width: InitVar[int | None] = None
    bounds_file: InitVar[str | None] = None

    def __post_init__(self, width, bounds_file) -> None:
        take_old_names(self, OLD_OPTIONS["summarize"], {"width": width, "bounds_file": bounds_file})


# -- forget and backfill ----------------------------------------------------------------------------


@dataclass
class ForgetOptions:
    lock_timeout: float = S.LOCK_TIMEOUT.default
    # What becomes of the request ``ids`` make when the drain cannot apply it (the store busy,
    # a full disk, damage, an interrupt): withdrawn, or kept filed for the next drain. Either
    # way the error says which.
    unapplied: str = S.UNAPPLIED_REQUEST.default
    # Drop every earlier snapshot and the objects only they used now, whatever the store's
    # erasure_retention (fairpipe.storage.erasure): time travel before this drain is lost.
    purge_history: bool = S.PURGE_HISTORY.default
    max_batch: int = S.MAX_BATCH.default  # ids per batch (a larger request is a batch of its own)
    # Kept in the receipt of the request ``ids`` make; never in Prefect's records (PRIVATE).
    reason: str = field(default=S.REASON.default, metadata=PRIVATE)


@dataclass
class BackfillOptions:
    batch_size: int = S.BATCH_SIZE.default  # ids per part (one request, one commit)
    # Kept in every part's receipt; never in Prefect's records (PRIVATE).
    reason: str = field(default=S.BACKFILL_REASON.default, metadata=PRIVATE)
    lock_timeout: float = S.LOCK_TIMEOUT.default
    progress: bool = False  # a progress bar with ETA on stderr (the command line sets it)


# -- rerank -----------------------------------------------------------------------------------------
@dataclass
class RerankOptions:
    algorithm: str = S.ALGORITHM.default
    k: int = S.RERANK_K.default
    desired: str = S.DESIRED.default  # a JSON file, or "population": each list's own distribution
    list_column: str = S.LIST_COLUMN.default
    score_column: str = S.SCORE_COLUMN.default
    group_column: str = S.GROUP_COLUMN.default
    smoothing: float = S.SMOOTHING.default  # Skew's zero-count smoothing (0: -inf, the paper's)
    partitions: int | None = None  # force Dask with this many tasks (tests); None: by size


# -- audit ------------------------------------------------------------------------------------------


@dataclass
class AuditOptions:
    dataset: str = S.DATASET.default
    protected: list[str] = field(default_factory=lambda: ["sex"])
    model: str | None = S.CLASSIFIER.default  # a pickled classifier; None: train one (``train``)
    train: str | None = S.TRAIN.default  # "mlp": the paper's network (the default without model)
    n_seeds: int = S.N_SEEDS.default
    n_local: int = S.N_LOCAL.default
    max_iter: int = S.GLOBAL_ITER.default
    objective: str = S.OBJECTIVE.default  # ADF's loss against the model's decision, or probability
    baselines: tuple[str, ...] = S.BASELINES
    retrain: bool = S.RETRAIN.default
    repeats: int = S.REPEATS.default  # retraining repeats (the improvement is averaged)
    train_iter: int = S.TRAIN_ITER.default
    rate_samples: int = S.RATE_SAMPLES.default  # random inputs for the discrimination rate
    seed: int = S.SEED.default
    data_dir: str | None = None
    progress: bool = False  # a progress bar on stderr (the command line sets it)
    # The old names (fairpipe.flows.renamed), accepted for one release.
    seeds: InitVar[int | None] = None
    local: InitVar[int | None] = None

    def __post_init__(self, seeds, local) -> None:
        take_old_names(self, OLD_OPTIONS["audit"], {"seeds": seeds, "local": local})
