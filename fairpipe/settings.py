"""Every setting fairpipe takes, each declared once: its name, type, default, constraint, help
and flag, in the manner of scikit-learn's ``_parameter_constraints``.

Everything else is derived from these declarations:

- the estimators' defaults and their parameter checks (:func:`check_settings`);
- the command line's flags, their help and defaults, and the check of the values given to them,
  made before anything starts (``fairpipe.flows.cli._runner.command``'s ``settings``);
- the flows' options' defaults (:mod:`fairpipe.flows.options`), and so the deployments'
  parameters and the store's attributes, which the flows write from their options.

Checks that relate several settings (a tree's fanout and height, the bounds of a summary
against its k) stay with the code that owns them (:func:`fairpipe.tree.check_tree`). Old names
are listed in :mod:`fairpipe.old_names`. This module imports nothing heavier than
:mod:`fairpipe.errors`: the command line reads it before anything starts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fairpipe.errors import (
    FairpipeInputError,
    check_fraction,
    check_int_range,
    check_non_negative_float,
    check_non_negative_int,
    check_one_of,
    check_open_unit,
    check_positive_float,
    check_positive_int,
    check_seed,
    subject,
)


# -- constraints -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """A constraint: ``check(value, name, owner)`` returns the value or raises the documented
    error naming ``name`` (a parameter, or a flag starting with ``--``) of ``owner``."""

    check: Callable[[Any, str, str], Any]
    text: str  # what it asks, as the reference says it
    choices: tuple[str, ...] = ()  # the values a choice takes (the help lists them)


POSITIVE = Rule(check_positive_int, "an integer >= 1")
COUNT = Rule(check_non_negative_int, "an integer >= 0")
POSITIVE_FLOAT = Rule(check_positive_float, "a number > 0")
NON_NEGATIVE_FLOAT = Rule(check_non_negative_float, "a number >= 0")
OPEN_UNIT = Rule(check_open_unit, "a number in (0, 1)")
FRACTION = Rule(check_fraction, "a number from 0 to 1")
SEED_RULE = Rule(check_seed, "an integer from 0 to 2^63 - 1")
SECONDS = Rule(lambda value, name, owner: check_non_negative_float(value, name, owner, True),
               "a number >= 0, or inf")  # fmt: skip


def between(low: int, high: int | None = None) -> Rule:
    """An integer from ``low`` to ``high`` (no upper limit: None)."""
    text = f"an integer >= {low}" if high is None else f"an integer from {low} to {high:,}"
    return Rule(lambda value, name, owner: check_int_range(value, name, owner, low, high), text)


def at_least(low: float) -> Rule:
    """A finite number >= ``low``."""

    def check(value: Any, name: str, owner: str) -> float:
        value = check_positive_float(value, name, owner)
        if value < low:
            where = subject(name, owner)
            raise FairpipeInputError(f"{where} must be at least {low:g}. Got {value} instead.")
        return value

    return Rule(check, f"a number >= {low:g}")


def one_of(*choices: str) -> Rule:
    return Rule(lambda value, name, owner: check_one_of(value, choices, name, owner),
                "one of " + ", ".join(choices), choices)  # fmt: skip


# -- a setting -------------------------------------------------------------------------------------
class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a setting that must be given


@dataclass(frozen=True)
class Setting:
    """One setting. ``default`` None means "not given" (its meaning, ``shown``, is said by the
    help): such a value is not checked; :data:`REQUIRED`: it must be given. ``rule`` None: any
    value of ``kind``."""

    name: str
    kind: Any  # int, float, str, bool, Path, or list[str] (a flag repeated)
    default: Any
    rule: Rule | None
    help: str
    shown: str | None = None  # the default as --help shows it, where the value does not say
    flag: str = ""  # default: --name in kebab-case

    def __post_init__(self) -> None:
        if not self.flag:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))

    def check(self, value: Any, owner: str, by_flag: bool = False) -> Any:
        """``value`` checked by the rule; messages name the flag (``by_flag``) or the name."""
        if self.rule is None or (value is None and self.default is None):
            return value
        return self.rule.check(value, self.flag if by_flag else self.name, owner)

    def helped(self, help: str) -> Setting:
        """The same setting with the help of one command (the rest unchanged)."""
        return replace(self, help=help)


def check_settings(owner: str, settings: Iterable[Setting], values: Mapping[str, Any] | Any,
                   by_flag: bool = False) -> dict[str, Any]:  # fmt: skip
    """Check ``values`` (a mapping, or an object such as an estimator holding them as
    attributes) by each setting, in order; returns the checked values (a numpy integer as a
    Python int, an integer given for a float as a float), by name."""
    checked = {}
    for s in settings:
        value = values[s.name] if isinstance(values, Mapping) else getattr(values, s.name)
        checked[s.name] = s.check(value, owner, by_flag)
    return checked


# -- limits and choices, owned here (the packages re-export those their users need) --------------
MAX_N_INIT = 1000  # k-means restarts run as one batch (their centroids side by side)
MAX_TABLES = (1 << 16) - 1  # LSH tables: a table number is stored in 16 bits
MAX_EVAL_SIZE = 1 << 16  # a summary node's evaluation points (padded arrays: leaves x eval_size)
MAX_SAMPLES = 100_000_000  # samples of one query
MAX_CHUNK_ROWS = 1 << 20  # rows per chunk: a chunk is read into memory whole
MAX_REQUEST_IDS = 1_000_000  # ids of one deletion request
MAX_WORKERS = 64  # local worker processes, a few hundred MB each
MODELS = ("dc", "q", "auto")
UTILITIES = ("exemplar", "facility")
RULES = ("swap", "ck")
ALGORITHMS = ("detgreedy", "detcons", "detrelaxed", "detconstsort")
SAMPLERS = ("exact", "approx", "uniform", "weighted", "rank")
MODES = ("buckets", "approximate", "exact")
SCALE_METHODS = ("none", "standard", "robust")
SCALE_CHOICES = ("auto", *SCALE_METHODS)
UNAPPLIED = ("withdraw", "keep")
OBJECTIVES = ("loss", "probability")
BASELINES = ("aequitas", "random")
TRAINABLE = ("mlp",)

# -- shared ----------------------------------------------------------------------------------------
STORE = Setting(
    "store", str, REQUIRED, None, "The store: a folder, or an s3://, gs:// or az:// URL."
)
AS_JSON = Setting("as_json", bool, False, None, "Print the result as one JSON object on stdout.",
                  shown="off", flag="--json")  # fmt: skip
VERBOSE = Setting("verbose", bool, False, None,
                  "Also show the logs and warnings of Prefect, Dask and Icechunk, and an internal "
                  "error's traceback, on stderr.", shown="off")  # fmt: skip
DASK_ADDRESS = Setting("dask_address", str, None, None,
                       "The address of a running Dask scheduler to use.",
                       shown="a local cluster of --workers processes")  # fmt: skip
DASK_CLUSTER = Setting(
    "dask_cluster", str, None, None,
    "A Python callable, as module:name, that returns a Dask cluster or client (Coiled, "
    "dask-jobqueue, dask-kubernetes; see deploy/README.md). Excludes --dask-address.",
    shown="none: --dask-address or a local cluster",
)  # fmt: skip
SEED = Setting("seed", int, 0, SEED_RULE, "Random seed: the same seed, the same result.")
WORKERS = Setting("workers", int, 2, between(1, MAX_WORKERS),
                  "Worker processes of the local cluster.")  # fmt: skip
LOCK_TIMEOUT = Setting("lock_timeout", float, 0.0, SECONDS,
                       "Seconds to wait for another writer of the store (inf: no limit).")  # fmt: skip

# -- clustering: DCKMeans and QKMeans (fairpipe fit) ----------------------------------------------
N_CLUSTERS = Setting("n_clusters", int, 8, POSITIVE, "Number of clusters.")
MODEL = Setting(
    "model", str, "dc", one_of(*MODELS),
    "dc: a DC-k-means tree (deletions recompute one leaf-to-root path); q: Q-k-means (most "
    "deletions certified without a retrain); auto: q up to 30 dimensions with at least 1,000 "
    "live points per cluster, else dc.",
)  # fmt: skip
FANOUT = Setting("fanout", int, 8, between(2),
                 "Children per node of the tree (fanout^height leaves).")  # fmt: skip
HEIGHT = Setting("height", int, 1, POSITIVE,
                 "dc: levels below the root (a large store: 2 or more).")  # fmt: skip
MAX_ITER = Setting("max_iter", int, 10, POSITIVE, "Most Lloyd iterations (dc: per node).")
N_INIT = Setting(
    "n_init", int, None, between(1, MAX_N_INIT),
    "Restarts, the lowest loss kept: dc, of each internal node; q, whole training runs.",
    shown="10 for dc, 1 for q",
)  # fmt: skip
DC_N_INIT = replace(N_INIT, default=10, shown=None)  # DCKMeans' own default
Q_N_INIT = replace(N_INIT, default=1, shown=None)  # QKMeans' own default
EPSILON = Setting(
    "epsilon", float, 0.05, POSITIVE_FLOAT,
    "q: lattice spacing, in the data's units (larger: more certified deletions, higher loss).",
)  # fmt: skip
BALANCE = Setting("balance", float, 0.2, OPEN_UNIT, "q: balance correction, in (0, 1).")
DC_KMEANS = (N_CLUSTERS, MAX_ITER, DC_N_INIT, SEED, FANOUT, HEIGHT)
Q_KMEANS = (N_CLUSTERS, MAX_ITER, Q_N_INIT, SEED, EPSILON, BALANCE)
FIT = (N_CLUSTERS, MODEL, FANOUT.helped("dc: children per node of the tree (fanout^height "
                                        "leaves)."),
       HEIGHT, MAX_ITER, N_INIT, EPSILON, BALANCE, SEED)  # fmt: skip

# -- fair summaries: FairSummary (fairpipe summarize) ---------------------------------------------
SUMMARY_K = Setting("k", int, 10, POSITIVE, "Summary size: at most k elements.")
LOWER = Setting(
    "lower", float, None, FRACTION,
    "Lower bound of every group, as a fraction of k (floor(lower * k)); not with --bounds.",
    shown="0",
)  # fmt: skip
UPPER = Setting(
    "upper", float, None, FRACTION,
    "Upper bound of every group, as a fraction of k (ceil(upper * k)); not with --bounds.",
    shown="1",
)  # fmt: skip
BOUNDS = Setting(
    "bounds", str, None, None,
    'A JSON file {"group": [lower, upper], ...} of bounds in elements; not with --lower or '
    "--upper (one of them is needed).",
    shown="none",
)  # fmt: skip
UTILITY = Setting(
    "utility", str, "exemplar", one_of(*UTILITIES),
    "What the summary serves: exemplar, the evaluation points' squared distance to their "
    "nearest element, lowered; facility, their similarity exp(-gamma d^2) to it, raised.",
)  # fmt: skip
RULE = Setting("rule", str, "swap", one_of(*RULES),
               "swap: exchange an element for a larger gain; ck: Chakrabarti-Kale's rule (a 1/4 "
               "bound).")  # fmt: skip
EVAL_SIZE = Setting("eval_size", int, 2048, between(1, MAX_EVAL_SIZE),
                    "Evaluation points per node.")  # fmt: skip
SUMMARY_HEIGHT = Setting("height", int, 1, COUNT,
                         "Levels below the root (0: one node streams all).")  # fmt: skip
FACTOR = Setting("factor", float, 2.0, POSITIVE_FLOAT, "The ck rule's swap threshold.")
GAMMA = Setting("gamma", float, None, POSITIVE_FLOAT,
                "facility: the RBF kernel's coefficient, exp(-gamma d^2).",
                shown="1 / d")  # fmt: skip
SUMMARY_NODE = (SUMMARY_K, UTILITY, RULE, EVAL_SIZE, FACTOR, GAMMA, SEED)  # every node's
SUMMARIZE = (SUMMARY_K, LOWER, UPPER, BOUNDS, UTILITY, RULE, EVAL_SIZE, FANOUT,
             SUMMARY_HEIGHT, SEED)  # fmt: skip

# -- the LSH index (fairpipe ingest) --------------------------------------------------------------
BY_RECALL = "chosen for --recall"
N_HASHES = Setting("n_hashes", int, None, POSITIVE, "Hash functions per table.", BY_RECALL)
N_TABLES = Setting("n_tables", int, None, between(1, MAX_TABLES), "Hash tables.", BY_RECALL)
BUCKET_WIDTH = Setting("bucket_width", float, None, POSITIVE_FLOAT,
                       "Bucket width of the hash functions.", BY_RECALL)  # fmt: skip
INDEX_RADIUS = Setting(
    "radius", float, None, POSITIVE_FLOAT,
    "The query radius r the LSH parameters are chosen for, and the default radius of sample.",
    shown="a new store: the median nearest-neighbour distance of a sample",
)  # fmt: skip
MAX_RADIUS = Setting(
    "max_radius", float, None, POSITIVE_FLOAT,
    "The largest query radius the index keeps the recall target at: its tables are built in "
    "scales, one family for each radius from --radius up to it, each under twice the last "
    "(a query reads the scale of the least radius at least its own). Not below --radius.",
    shown="a new store: 4 x --radius",
)  # fmt: skip
RECALL = Setting(
    "recall", float, None, OPEN_UNIT,
    "The probability, in (0, 1), that a point at distance r is in a query's buckets; "
    "--n-hashes, --n-tables and --bucket-width are chosen for it at the least expected cost "
    "(not with all three given).",
    shown="a new store: 0.98",
)  # fmt: skip
SCALE = Setting(
    "scale", str, None, one_of(*SCALE_CHOICES),
    "How each feature column is scaled before it is stored: standard (minus its mean, over "
    "its standard deviation), robust (minus its median, over its interquartile range), none; "
    "auto is standard for a CSV or Parquet table (columns in units of their own) and none for "
    "a .npy matrix or a built-in data set. Appends and queries given by value are scaled with "
    "the store's parameters.",
    shown="auto (a new store); the store's (an append)",
)  # fmt: skip
CHUNK_ROWS = Setting("chunk_rows", int, None, between(1, MAX_CHUNK_ROWS), "Rows per chunk.",
                     shown="about 16 MB of points")  # fmt: skip
INGEST_SEED = Setting("seed", int, None, SEED_RULE,
                      "Seed of the hash functions and leaves; an append keeps the store's.",
                      shown="0")  # fmt: skip
PROJECTIONS = ("exact", "float32")
PROJECTION = Setting("projection", str, "exact", one_of(*PROJECTIONS),
                     "How a cell floor((a . x + b) / w) is computed: exact, the same bits on "
                     "every machine, batch and thread count; float32, the definition of older "
                     "stores.")  # fmt: skip
# E2LSH's own defaults (ingest chooses them for --recall at --radius).
LSH_N_HASHES = replace(N_HASHES, default=15, shown=None)
LSH_N_TABLES = replace(N_TABLES, default=100, shown=None)
LSH_BUCKET_WIDTH = replace(BUCKET_WIDTH, default=4.0, shown=None)
E2LSH_SETTINGS = (LSH_N_HASHES, LSH_N_TABLES, LSH_BUCKET_WIDTH, SEED, PROJECTION)
SOURCE_GROUPS = Setting("group_column", str, None, None,
                        "A table's column of group labels (a .npy source: --groups-file).",
                        shown="one group")  # fmt: skip
SOURCE_IDS = Setting("id_column", str, None, None,
                     "A table's column of ids (a .npy source: --ids-file).",
                     shown="row numbers")  # fmt: skip
GROUPS_FILE = Setting("groups_file", str, None, None,
                      "Group labels (.npy) for a .npy source (a table: --group-column).",
                      shown="none")  # fmt: skip
IDS_FILE = Setting("ids_file", str, None, None,
                   "Ids (.npy) for a .npy source (a table: --id-column).",
                   shown="row numbers")  # fmt: skip
# The generated data set's sizes (their upper limits, each with its reason: checked by
# fairpipe.datasets.check_gaussian_sizes).
GAUSSIAN = (Setting("gaussian_n", int, 20000, POSITIVE, "gaussian: points."),
            Setting("gaussian_d", int, 16, POSITIVE, "gaussian: dimensions."),
            Setting("gaussian_clusters", int, 8, POSITIVE, "gaussian: mixture components."),
            Setting("gaussian_groups", int, 4, POSITIVE, "gaussian: groups."))  # fmt: skip
SOURCE = (SOURCE_GROUPS, SOURCE_IDS, GROUPS_FILE, IDS_FILE)
INDEX = (
    INGEST_SEED,
    INDEX_RADIUS,
    MAX_RADIUS,
    RECALL,
    N_HASHES,
    N_TABLES,
    BUCKET_WIDTH,
    SCALE,
    CHUNK_ROWS,
)


# -- queries (fairpipe sample, fairpipe predict) --------------------------------------------------
def _id_rule(value: Any, name: str, owner: str) -> int:
    from fairpipe.validation import check_ids  # the one rule of ids (numpy: imported on use)

    return int(check_ids([value], name, lambda i: f"given to {name}")[0])


ONE_QUERY_ONLY = " (one --query-* option only)."
QUERY_ID = Setting("query_id", int, None, Rule(_id_rule, "an id: an integer from 0 to 2^63 - 1"), "Id of a stored point" + ONE_QUERY_ONLY,
                   shown="none")  # fmt: skip
QUERY_ROW = Setting("query_row", int, None, COUNT, "Row number of a stored point" + ONE_QUERY_ONLY,
                    shown="none")  # fmt: skip
QUERY_FILE = Setting("query_file", Path, None, None,
                     "A .npy of query points, one per row" + ONE_QUERY_ONLY, shown="none")  # fmt: skip
QUERY_IDS_FILE = Setting("query_ids_file", Path, None, None,
                         "A file of stored ids, a query each, in its order (text, CSV, Parquet or "
                         ".npy, as forget's --ids-file)" + ONE_QUERY_ONLY, shown="none")  # fmt: skip
QUERIES = (QUERY_ID, QUERY_IDS_FILE, QUERY_ROW, QUERY_FILE)

# -- sampling (fairpipe sample) --------------------------------------------------------------------
RADIUS = Setting("radius", float, None, POSITIVE_FLOAT, "Neighbourhood radius.",
                 shown="the store's suggested radius")  # fmt: skip
N_SAMPLES = Setting("n_samples", int, 10, between(1, MAX_SAMPLES), "Samples per query.")
SAMPLER = Setting(
    "sampler", str, "exact", one_of(*SAMPLERS),
    "How a neighbour is drawn: exact or approx (uniform over the neighbourhood; approx may give "
    "up on a draw), rank (uniform, repeated queries drawing independent samples), or the biased "
    "uniform and weighted baselines.",
)  # fmt: skip
MODE = Setting(
    "mode", str, "exact", one_of(*MODES),
    "Which points are neighbours: buckets (every bucket-mate), approximate (within c * radius), "
    "exact (within radius).",
)  # fmt: skip
C = Setting("c", float, 2.0, at_least(1.0), "Approximation factor of the approximate mode.")
INCLUDE_QUERY = Setting(
    "include_query", bool, False, None,
    "Let a query by --query-id or --query-row draw its own row (left out by default: its "
    "neighbourhood is the other points near it). Not with --query-file.",
    shown="off",
)  # fmt: skip
SAMPLE = (RADIUS, N_SAMPLES, SAMPLER, MODE, C, SEED, INCLUDE_QUERY)

# -- forgetting (fairpipe forget, fairpipe backfill) ----------------------------------------------
MAX_BATCH = Setting("max_batch", int, 10_000, POSITIVE,
                    "Ids per batch (one commit each), at most.")  # fmt: skip
MAX_REASON_CHARS = 10_000
REASON_TOO_LONG = "A deletion request's reason holds at most {limit:,} characters; got {n:,}."


def _reason_rule(value: Any, name: str, owner: str) -> str:
    if not isinstance(value, str):
        raise FairpipeInputError(f"{subject(name, owner)} must be text. Got {value!r} instead.")
    if len(value) > MAX_REASON_CHARS:
        raise FairpipeInputError(REASON_TOO_LONG.format(limit=MAX_REASON_CHARS, n=len(value)))
    return value


REASON = Setting("reason", str, "", Rule(_reason_rule, f"at most {MAX_REASON_CHARS:,} characters"), "Kept in the receipt of the --ids "
                 "request.", shown="none")  # fmt: skip
REQUEST_REASON = REASON.helped("Kept in the receipt.")
UNAPPLIED_REQUEST = Setting(
    "unapplied", str, "withdraw", one_of(*UNAPPLIED),
    "What becomes of the --ids request if this command cannot apply it (the store busy, a full "
    "disk, damage, an interrupt): withdraw it, or keep it filed for the next drain. The error "
    "says which.",
)  # fmt: skip
PURGE_HISTORY = Setting(
    "purge_history", bool, False, None,
    "Drop every earlier snapshot (they still hold the erased rows) and delete the objects only "
    "they used now, whatever the store's erasure_retention.",
    shown="off",
)  # fmt: skip
FORGET = (MAX_BATCH, REASON, UNAPPLIED_REQUEST, PURGE_HISTORY)
# Ids per part of a backfill. A part of random ids rewrites most index segments and row chunks
# whatever its size (at 1M rows the index alone is ~12 s a part), so a backlog goes faster in
# fewer, larger parts: 50,000 ids made a backfill of 100,000 ids at 1M cost about one fresh
# build (docs/measurements/forgetting.md), while a part still commits within about half a
# minute there.
BATCH_SIZE = Setting("batch_size", int, 50_000, between(1, MAX_REQUEST_IDS),
                     "Ids per batch (one request and one commit).")  # fmt: skip
BACKFILL_REASON = replace(REASON, default="backfill", help="Kept in every receipt.", shown=None)
BACKFILL = (BATCH_SIZE, BACKFILL_REASON)

# -- fair re-ranking (fairpipe rerank) ------------------------------------------------------------
ALGORITHM = Setting(
    "algorithm", str, "detconstsort", one_of(*ALGORITHMS),
    "The re-ranker (Geyik et al. 2019): detgreedy, detcons, detrelaxed or detconstsort.",
)  # fmt: skip
RERANK_K = Setting("k", int, 10, POSITIVE, "Top-k of each list (a shorter list keeps all).")
DESIRED = Setting(
    "desired", str, "population", None,
    'A JSON file {"group": share, ...} summing to 1, or "population": each list\'s own group '
    "distribution.",
)  # fmt: skip
LIST_COLUMN = Setting("list_column", str, "list", None, "The column naming each row's list.")
SCORE_COLUMN = Setting("score_column", str, "score", None,
                       "The column of scores (higher first).")  # fmt: skip
GROUP_COLUMN = Setting("group_column", str, "group", None, "The column of group labels.")
SMOOTHING = Setting("smoothing", float, 0.0, NON_NEGATIVE_FLOAT,
                    "Skew of a group absent from the top k: -inf at 0 (the paper).")  # fmt: skip
RERANK = (ALGORITHM, RERANK_K, DESIRED, LIST_COLUMN, SCORE_COLUMN, GROUP_COLUMN, SMOOTHING)

# -- fairness testing (fairpipe audit) ------------------------------------------------------------
DATASET = Setting("dataset", str, "adult", None,
                  "adult, german or bank (read from --data-dir), adult:PATH, german:PATH, "
                  "bank:PATH, or an integer CSV with a 'label' column.")  # fmt: skip
CLASSIFIER = Setting("model", str, None, None,
                     "A pickled classifier with predict_proba (or a torch.save module); not with "
                     "--train.", shown="train one (--train mlp)")  # fmt: skip
TRAIN = Setting("train", str, None, one_of(*TRAINABLE),
                "Train the model to test: mlp, the paper's 64-32-16-8-4 network; not with "
                "--model.", shown="mlp without --model")  # fmt: skip
N_SEEDS = Setting("n_seeds", int, 1000, POSITIVE, "Global seeds (clustered from the data).")
N_LOCAL = Setting("n_local", int, 1000, POSITIVE, "Local steps per discriminatory input.")
GLOBAL_ITER = Setting("max_iter", int, 10, POSITIVE, "Global iterations per seed.")
OBJECTIVE = Setting("objective", str, "loss", one_of(*OBJECTIVES),
                    "What the search climbs: loss (ADF's: toward the decision boundary) or "
                    "probability.")  # fmt: skip
RETRAIN = Setting("retrain", bool, False, None, "Retrain with 5% of the inputs found.",
                  shown="off")  # fmt: skip
REPEATS = Setting("repeats", int, 5, POSITIVE, "Retraining repeats (averaged).")
TRAIN_ITER = Setting("train_iter", int, 50, POSITIVE, "Training epochs of the MLP.")
RATE_SAMPLES = Setting("rate_samples", int, 10_000, POSITIVE,
                       "Random inputs for the discrimination rate.")  # fmt: skip
AUDIT = (DATASET, CLASSIFIER, TRAIN, N_SEEDS, N_LOCAL, GLOBAL_ITER, OBJECTIVE, RETRAIN, REPEATS,
         TRAIN_ITER, SEED)  # fmt: skip

# -- the tour and the kept server (fairpipe demo, fairpipe server start) --------------------------
# Queries of the TV report at most: the digits' other points are the ones it forgets.
MAX_QUERIES = 1000
N_QUERIES = Setting("n_queries", int, 20, between(1, MAX_QUERIES),
                    "Query points of the TV report.")  # fmt: skip
DEMO = (N_QUERIES, SEED)
PORT = Setting("port", int, None, between(1, 65535), "Port on 127.0.0.1.", shown="a free one")

# -- the ids a command is given, and what else one command alone takes ----------------------------
IDS = Setting("ids", str, None, None, "Comma-separated ids (--ids or --ids-file, not both).",
              shown="none")  # fmt: skip
IDS_LIST = Setting("ids_file", str, None, None,
                   "A .npy, or text with one id per line (--ids or --ids-file, not both).",
                   shown="none")  # fmt: skip
GIVEN_IDS = (IDS, IDS_LIST)
BACKLOG = Setting("ids_file", str, REQUIRED, None,
                  "The backlog: .npy, .parquet, .csv (column 'id' or the first), or text with one "
                  "id per line.")  # fmt: skip
RERANKED = Setting("out", str, REQUIRED, None, "Output .csv or .parquet (metrics beside it).")
PROTECTED = Setting("protected", list[str], REQUIRED, None,
                    "A protected attribute (repeat the option for several).")  # fmt: skip


def _baselines_rule(value: Any, name: str, owner: str) -> list:
    return [check_one_of(b, BASELINES, name, owner) for b in value]


BASELINE = Setting("baseline", list[str], list(BASELINES),
                   Rule(_baselines_rule, "one of " + ", ".join(BASELINES) + ", repeated",
                        BASELINES),
                   "A search to compare ADF with (repeat the option for several); not with "
                   "--no-baselines.")  # fmt: skip
NO_BASELINES = Setting("no_baselines", bool, False, None, "Run ADF alone.", shown="off")
AUDIT_OUT = Setting("out", str, None, None, "Folder for samples, model, metrics, plot.",
                    shown="none")  # fmt: skip
DATA_DIR = Setting("data_dir", str, None, None, "Folder of the named data sets.",
                   shown="the shared data folder beside the repository")  # fmt: skip
AUDIT_COMMAND = (PROTECTED, BASELINE, NO_BASELINES, AUDIT_OUT, DATA_DIR, *AUDIT)
DEMO_STORE = Setting("store", str, None, None, "Folder for the demo store.",
                     shown="a temporary folder")  # fmt: skip
PLOT = Setting("plot", str, None, None, "PNG path for the TV plot.",
               shown="fairpipe-demo-tv.png beside the store")  # fmt: skip
DEMO_COMMAND = (DEMO_STORE, *DEMO, PLOT)
REQUEST = Setting("request", str, None, None, "One request's receipt (its id).",
                  shown="every receipt")  # fmt: skip
# Read by fairpipe.storage.erasure.parse_retention, which names what it takes.
ERASURE_RETENTION = Setting(
    "erasure_retention", str, None, None,
    "How long erased rows stay in earlier snapshots (time travel): 0 (erase when each drain "
    "ends), or a duration such as 90m, 24h, 7d.",
    shown="unchanged",
)  # fmt: skip
EXTEND_RADIUS = replace(
    MAX_RADIUS, shown="unchanged",
    help="Extend the index to keep its recall target at every radius up to this one: new "
    "scales above its largest, built over the live rows; its tables stay as they are.",
)  # fmt: skip
ADD_CHECKSUMS = Setting(
    "add_checksums", bool, False, None,
    "When no chunk is corrupt, give the arrays stored without a checksum one (one commit; their "
    "data are not rewritten).",
    shown="off",
)  # fmt: skip

# -- where each setting is taken -------------------------------------------------------------------
COMMANDS = {
    "ingest": (*SOURCE, *INDEX, *GAUSSIAN), "show": GIVEN_IDS, "sample": (*QUERIES, *SAMPLE),
    "predict": QUERIES, "fit": FIT, "summarize": SUMMARIZE, "forget": (*GIVEN_IDS, *FORGET),
    "request-deletion": (*GIVEN_IDS, REQUEST_REASON), "backfill": (BACKLOG, *BACKFILL),
    "receipts": (REQUEST,), "configure": (ERASURE_RETENTION, EXTEND_RADIUS), "verify": (ADD_CHECKSUMS,),
    "rerank": (RERANKED, *RERANK), "audit": AUDIT_COMMAND, "demo": DEMO_COMMAND,
    "server start": (PORT,),
}  # fmt: skip
SHARED = {
    "Every command": (AS_JSON, VERBOSE),
    "Every command that reads or writes a store (demo: a folder of its own)": (STORE,),
    "Every command that runs a flow": (DASK_ADDRESS, DASK_CLUSTER, WORKERS),
    "Every command that waits for another writer of the store": (LOCK_TIMEOUT,),
}
ESTIMATORS = {"DCKMeans": DC_KMEANS, "QKMeans": Q_KMEANS, "E2LSH": E2LSH_SETTINGS,
              "FairSummary": (*SUMMARY_NODE, FANOUT, SUMMARY_HEIGHT)}  # fmt: skip


KINDS = {
    str: "text",
    Path: "a path",
    int: "an integer",
    float: "a number",
    bool: "a flag",
    list[str]: "text, repeated",
}


def reference() -> str:
    """Every setting as Markdown (docs/reference/settings.md: ``python -m fairpipe.settings``)."""

    def default(s: Setting) -> str:
        if s.shown is not None:
            return s.shown
        if s.default is REQUIRED:
            return "required"
        return "off" if s.default is False else f"`{s.default!r}`".replace("'", "")

    def table(settings: Iterable[Setting]) -> list[str]:
        rows = ["| flag | default | takes | meaning |", "|---|---|---|---|"]
        for s in settings:
            takes = s.rule.text if s.rule else KINDS[s.kind]
            rows.append(f"| `{s.flag}` | {default(s)} | {takes} | {s.help} |")
        return rows

    lines = [
        "# Settings",
        "",
        "Every setting of the command line and the estimators, generated from their one "
        "declaration (`fairpipe/settings.py`) by `python -m fairpipe.settings`. A command "
        "checks each value by the rule below before anything starts; an estimator checks its "
        "parameters by the same rules (messages name the parameter instead of the flag).",
        "",
    ]
    for command, settings in COMMANDS.items():
        lines += [f"## `fairpipe {command}`", "", *table(settings), ""]
    for title, settings in SHARED.items():
        lines += [f"## {title}", "", *table(settings), ""]
    lines += ["## The estimators", "", "| estimator | parameters (defaults) |", "|---|---|"]
    for estimator, settings in ESTIMATORS.items():
        given = ", ".join(f"`{s.name}={s.default!r}`".replace("'", '"') for s in settings)
        lines.append(f"| `{estimator}` | {given} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
