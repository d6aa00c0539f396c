"""A new store's E2LSH parameters: chosen for a recall at the query radius, or given.

Shared by the ingest flow and the command line's checks (which run it on a source small enough
to plan ahead, so that its errors come before anything starts); it imports no Prefect or Dask.
The choice itself is :func:`fairpipe.neighbors.choose_lsh_parameters`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from fairpipe.datasets import (
    SCALE_SAMPLE,
    SourcePlan,
    apply_scaler,
    fit_scaler,
    read_source_sample,
    resolve_scale,
    spread_warning,
)
from fairpipe.errors import FairpipeInputError
from fairpipe.neighbors import (
    DEFAULT_RECALL,
    WIDTH_PER_RADIUS,
    DistanceProfile,
    EmptyBalls,
    MaxBelowRadius,
    UnreachableRecall,
    choose_lsh_parameters,
    choose_scales,
    lsh_recall,
    max_radius_of,
    scales_params,
    width_sample_rows,
)

RECALL_WITH_PARAMETERS = (
    "--recall does not apply where --n-hashes, --n-tables and --bucket-width are all given: they "
    "fix the recall (the ingest prints it). Leave out --recall, or one of them for the ingest "
    "to choose."
)
UNREACHABLE = (
    "A recall of {recall} (--recall) at radius {radius} needs {needed} tables{fixed}; at most "
    "{limit} are chosen (the index keeps an entry per row and table). Lower --recall, or give "
    "--n-tables."
)
UNREACHABLE_TABLES = (
    "A recall of {recall} (--recall) at radius {radius} is out of reach with --n-tables "
    "{tables}{fixed}: the best --n-hashes and --bucket-width give {best}. Lower --recall, or give more tables."
)
EMPTY_BALLS = (
    "No two of the {rows} sampled rows are within --radius {radius} of each other (the closest "
    "pair is {closest} apart): every query's ball would be empty. The suggested radius (the "
    "median distance to the nearest sampled row) is {suggested}."
)

MAX_RADIUS_WITH_PARAMETERS = (
    "--max-radius applies where the ingest chooses --n-tables and --bucket-width for each "
    "scale of the index: leave out --max-radius, or --n-tables and --bucket-width."
)

MAX_BELOW = (
    "--max-radius {max_radius} is below {which} {radius}: the index answers every radius up "
    "to --max-radius, from --radius. Give --max-radius at least {radius}, or a smaller --radius."
)

FLAGS = {"n_hashes": "--n-hashes", "n_tables": "--n-tables", "bucket_width": "--bucket-width"}


def check_recall_options(n_hashes, n_tables, bucket_width, recall, max_radius=None) -> None:
    """Refuse ``--recall`` beside all three of ``--n-hashes``, ``--n-tables``,
    ``--bucket-width``, and ``--max-radius`` beside ``--n-tables`` or ``--bucket-width``."""
    if recall is not None and None not in (n_hashes, n_tables, bucket_width):
        raise FairpipeInputError(RECALL_WITH_PARAMETERS)
    if max_radius is not None and (n_tables is not None or bucket_width is not None):
        raise FairpipeInputError(MAX_RADIUS_WITH_PARAMETERS)


def command_line_message(error: UnreachableRecall | EmptyBalls) -> str:
    """The chooser's error, naming the command line's flags."""
    if isinstance(error, EmptyBalls):
        return EMPTY_BALLS.format(rows=error.rows, radius=f"{error.radius:.6g}",
                                  closest=f"{error.closest:.6g}",
                                  suggested=f"{error.suggested:.6g}")  # fmt: skip
    given = [f"{FLAGS[name]} {value:.6g}" for name, value in error.fixed.items()
             if name != "n_tables"]  # fmt: skip
    fixed = " with " + " and ".join(given) if given else ""
    if "n_tables" in error.fixed:
        return UNREACHABLE_TABLES.format(recall=error.recall, radius=f"{error.radius:.6g}",
                                         tables=error.fixed["n_tables"], fixed=fixed,
                                         best=f"{error.best:.4g}")  # fmt: skip
    return UNREACHABLE.format(recall=error.recall, radius=f"{error.radius:.6g}", fixed=fixed,
                              needed=error.needed_text(), limit=error.limit)  # fmt: skip


def new_store_parameters(plan: SourcePlan, ids: np.ndarray | None, seed: int, *, n_hashes=None,
                         n_tables=None, bucket_width=None, radius=None, recall=None,
                         max_radius=None) -> dict:  # fmt: skip
    """E2LSH's parameters for a new store of the source ``plan`` (``ids``: its ids, None for
    the row numbers), as the ``lsh`` attribute keeps them: ``n_hashes``, ``n_tables``, ``bucket_width``, and
    ``radius`` (the query radius: the sample command's default), ``recall_target`` (None where
    all three were given), ``expected_recall`` at the radius, ``expected_candidates`` (per
    query, None where all three were given), ``max_radius`` (the largest radius the recall
    target holds at) and ``scales`` (``[radius, bucket_width, n_tables]`` of each family of
    tables, where there are several; else None).

    All three given: used as they are; the radius is ``radius`` or w / 3.2 (nothing is read).
    Otherwise the width sample of the source (2,000 rows by a hash of (seed, id)) is read and
    the missing ones are chosen for ``recall`` (default 0.98) at ``radius`` (default: the
    sample's median nearest-neighbour distance). Where ``n_tables`` and ``bucket_width`` are
    both chosen, they are chosen for each scale up to ``max_radius`` (default 4 x the radius:
    :func:`fairpipe.neighbors.choose_scales`); else the index is one scale, up to the radius."""
    check_recall_options(n_hashes, n_tables, bucket_width, recall, max_radius)
    key = _choice_key(plan, seed, (n_hashes, n_tables, bucket_width, radius, recall, max_radius))
    if key is not None and key in _LAST:
        return dict(_LAST[key])
    chosen = _new_store_parameters(plan, ids, seed, n_hashes=n_hashes, n_tables=n_tables,
                                   bucket_width=bucket_width, radius=radius, recall=recall,
                                   max_radius=max_radius)  # fmt: skip
    if key is not None:
        _LAST.clear()
        _LAST[key] = dict(chosen)
    return chosen


# The last choice made in this process: the command line's early check and the ingest flow
# after it choose for the same source (the sample read scans a Parquet or generated source
# whole: 2 s at 1M rows), so the flow reuses the check's. A file's size and modification time
# are part of the key.
_LAST: dict[tuple, dict] = {}


def _choice_key(plan: SourcePlan, seed: int, given: tuple) -> tuple | None:
    if plan.kind == "memory":
        return None  # points in memory may change in place
    stat: tuple = ()
    if plan.path is not None:
        try:
            st = os.stat(plan.path)
        except OSError:
            return None
        stat = (st.st_size, st.st_mtime_ns, st.st_ino)
    scaler = None if plan.scaler is None else tuple(a.tobytes() for a in plan.scaler)
    return (plan.kind, plan.where, plan.path, stat, plan.n, plan.d, repr(sorted(plan.params.items())),
            seed, given, scaler)  # fmt: skip


def _new_store_parameters(plan: SourcePlan, ids: np.ndarray | None, seed: int, *, n_hashes,
                          n_tables, bucket_width, radius, recall, max_radius) -> dict:  # fmt: skip
    if None not in (n_hashes, n_tables, bucket_width):
        r = float(radius) if radius is not None else float(bucket_width) / WIDTH_PER_RADIUS
        return {"n_hashes": int(n_hashes), "n_tables": int(n_tables),
                "bucket_width": float(bucket_width), "radius": r, "recall_target": None,
                "expected_recall": lsh_recall(r, n_hashes, n_tables, bucket_width),
                "expected_candidates": None, "max_radius": r, "scales": None}  # fmt: skip
    sample = width_sample(plan, ids, seed)
    target = DEFAULT_RECALL if recall is None else recall
    try:
        if n_tables is None and bucket_width is None:
            choices = choose_scales(DistanceProfile.of(sample), radius, target,
                                    max_radius=max_radius, n_rows=plan.n, n_hashes=n_hashes,
                                    n_features=plan.d)  # fmt: skip
        else:
            choices = [choose_lsh_parameters(
                sample, radius, target, n_rows=plan.n, n_features=plan.d, n_hashes=n_hashes,
                n_tables=n_tables, bucket_width=bucket_width,
            )]  # fmt: skip
    except (UnreachableRecall, EmptyBalls) as e:
        raise FairpipeInputError(command_line_message(e)) from None
    except MaxBelowRadius as e:
        raise FairpipeInputError(MAX_BELOW.format(max_radius=f"{e.max_radius:.6g}",
                                                  radius=f"{e.radius:.6g}",
                                                  which="--radius" if radius is not None
                                                  else "the suggested radius")) from None  # fmt: skip
    choice, params = choices[0], scales_params(choices)
    return {**params, "scales": [list(s) for s in params["scales"]] or None,
            "radius": choice.radius, "recall_target": choice.recall_target,
            "expected_recall": choice.expected_recall,
            "expected_candidates": choice.expected_candidates,
            "max_radius": choices[-1].radius}  # fmt: skip


def width_sample(plan: SourcePlan, ids: np.ndarray | None, seed: int) -> np.ndarray:
    """The rows of ``plan`` ingest samples for its parameters (2,000 by a hash of (seed, id);
    ``ids``: the source's ids, None for the row numbers), scaled by the plan's scaler. They are
    among the scaling sample's rows (the same hash, fewer of them): taken from it where
    :func:`scaling_sample` read it for this source, else read."""
    row_ids = np.arange(plan.n, dtype=np.int64) if ids is None else ids
    rows = width_sample_rows(row_ids, seed)
    key = _sample_key(plan, seed)
    if key is not None and _SAMPLE.get("key") == key:
        at = np.searchsorted(_SAMPLE["rows"], rows)
        raw = _SAMPLE["values"][at]
        return raw if plan.scaler is None else apply_scaler(raw, *plan.scaler)
    return read_source_sample(plan, rows)


# -- scaling ---------------------------------------------------------------------------------------
@dataclass
class Scaling:
    """A new store's scaling: the ``method`` (none, standard, robust), its ``center`` and
    ``scale`` (None for none), the rows it was fitted on, and the warning for unscaled columns
    whose spreads differ widely (None where they do not, or for a built-in data set)."""

    method: str
    center: np.ndarray | None = None
    scale: np.ndarray | None = None
    fitted_rows: int = 0
    warning: str | None = None

    def attrs(self) -> dict:
        """The store's ``scale`` attribute."""
        if self.center is None or self.scale is None:
            return {"method": self.method}
        return {"method": self.method, "center": self.center.tolist(),
                "scale": self.scale.tolist(), "fitted_rows": self.fitted_rows}  # fmt: skip


# Sources read as they are, in units of their own (no warning about their spreads).
BUILT_IN_KINDS = ("gaussian", "memory")


def scaled_plan(plan: SourcePlan, ids: np.ndarray | None, seed: int, method: str,
                sampled: bool = True) -> tuple[SourcePlan, Scaling]:  # fmt: skip
    """A new store's source plan with its scaler (``method``, ``auto`` resolved by the source's
    kind: :func:`fairpipe.datasets.resolve_scale`), fitted on the scaling sample
    (:func:`scaling_sample`); unscaled, the sample says whether the spreads differ widely. With
    ``none``, nothing is read for a built-in data set, nor where no sample is read for the LSH
    parameters either (``sampled`` False: all three given): no warning then."""
    by_default, method = method == "auto", resolve_scale(method, plan.kind)
    if method == "none" and (plan.kind in BUILT_IN_KINDS or not sampled):
        return plan, Scaling(method)
    rows, sample = scaling_sample(plan, ids, seed)
    if ids is not None:  # in the order of the ids: the fit does not follow the file's order
        sample = sample[np.argsort(ids[rows], kind="stable")]
    if method == "none":
        return plan, Scaling(method, warning=spread_warning(sample, plan.where,
                                                            plan.feature_columns))  # fmt: skip
    center, scale = fit_scaler(sample, method, plan.where, plan.feature_columns, plan.n,
                               by_default)  # fmt: skip
    scaled = replace(plan, scaler=(center, scale))
    return scaled, Scaling(method, center, scale, int(rows.shape[0]))


def scaling_sample(plan: SourcePlan, ids: np.ndarray | None,
                   seed: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(positions, unscaled rows) of the scaling sample of ``plan``: SCALE_SAMPLE rows by a hash
    of (seed, id), kept for :func:`width_sample` (the last source's only)."""
    raw = replace(plan, scaler=None)
    row_ids = np.arange(plan.n, dtype=np.int64) if ids is None else ids
    rows = width_sample_rows(row_ids, seed, SCALE_SAMPLE)
    values = np.asarray(read_source_sample(raw, rows))
    key = _sample_key(plan, seed)
    _SAMPLE.clear()
    if key is not None:
        _SAMPLE.update(key=key, rows=rows, values=values)
    return rows, values


_SAMPLE: dict = {}


def _sample_key(plan: SourcePlan, seed: int) -> tuple | None:
    return _choice_key(replace(plan, scaler=None), seed, ())


def recall_line(lsh: dict, radius: float) -> str:
    """What the parameters promise at the store's radius (stores made before the choice of
    parameters record nothing: an empty string)."""
    if "expected_recall" not in lsh:
        return ""
    target = lsh.get("recall_target")
    how = f"chosen for recall {target:.4g}" if target is not None else "given"
    line = f"{how}: expected recall {lsh['expected_recall']:.4g} at radius {radius:.4g}"
    scales = lsh.get("scales") or []
    top = max_radius_of(lsh)
    if len(scales) > 1:
        radii = ", ".join(f"{s[0]:.4g} ({s[2]} tables)" for s in scales)
        line += f"; radius range up to {top:.4g}, in {len(scales)} scales: {radii}"
    elif top is not None:
        line += f"; radius range up to {top:.4g}"
    return line
