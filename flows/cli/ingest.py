"""``fairpipe ingest``: a source into a store, with its LSH bucket index (one commit)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._output import diagnostics_console, result_console
from fairpipe.flows.cli._runner import WRITES_STORES, Shared, command
from fairpipe.flows.options import IngestOptions
from fairpipe.settings import GAUSSIAN, INDEX, SOURCE

# A source file up to this size (and any .npy, whose plan reads its header and the ids and
# groups files only) is planned before the flow starts, so that its errors come before anything
# starts; the flow plans it again (a CSV of 64 MB plans in about 0.2 s). A larger one is planned
# by the flow alone, still before the store is created. Up to CHECK_AHEAD_BYTES, its rows are
# read and checked as well (a NaN named before the flow starts rather than by a chunk job).
PLAN_AHEAD_BYTES = 64 << 20
CHECK_AHEAD_BYTES = 16 << 20


def _render(r: dict) -> None:
    from fairpipe.flows.parameters import recall_line

    out = result_console()
    out.print(
        Text.assemble("ingested ", (str(r["added"]), "bold"),
                      f" rows -> {r['store']} ({r['n']} points x {r['d']} dims)")
    )  # fmt: skip
    out.print(f"groups: {r['groups']}")
    if r["scale"] != "none":
        out.print(f"features scaled: {r['scale']} (the store's center and scale, also applied "
                  "to appends and to queries given by value)")  # fmt: skip
    lsh = r["lsh"]
    promise = recall_line(lsh, r["suggested_radius"])
    out.print(
        f"LSH: n_hashes={lsh['n_hashes']} n_tables={lsh['n_tables']} "
        f"bucket_width={lsh['bucket_width']:.4g}"
        + (f", {promise}" if promise else f"; suggested radius {r['suggested_radius']:.4g}")
        + f"; {r['buckets_per_table']:.0f} buckets/table",
    )
    out.print(
        f"commit {r['commit']} in {r['timings']['total']:.1f} s "
        f"({r['rows_per_second']:.0f} rows/s hashed and written)"
    )


def _check(**o) -> None:
    from fairpipe.flows.parameters import check_recall_options
    from fairpipe.neighbors import check_projection_size

    check_recall_options(o["n_hashes"], o["n_tables"], o["bucket_width"], o["recall"],
                         o["max_radius"])  # fmt: skip
    from fairpipe.datasets import check_source_options

    check_source_options(o["source"], o["group_column"], o["id_column"], o["groups_file"],
                         o["ids_file"])  # fmt: skip
    from fairpipe.flows.checks import check_ingest

    options = ingest_options(o)
    appending = check_ingest(o["store"], options)  # what --store names, before the source is read
    source = Path(o["source"])
    name = o["source"].partition(":")[0]
    if o["source"] == "gaussian":  # its sizes, for a new store or an append
        from fairpipe.datasets import check_gaussian_sizes

        check_gaussian_sizes(options.gaussian)
    from fairpipe.datasets import plan_source

    new_store = _new_local_store(o["store"])
    if name in ("digits", "gaussian", "mnist", "word2vec", "adult", "bank", "census-kdd"):
        if o["source"] in ("digits", "gaussian"):
            # The generated and bundled data sets plan at once: a new store's parameters' errors
            # and an append's come before anything starts (the flow reuses the choice:
            # fairpipe.flows.parameters).
            plan = plan_source(o["source"], group_column=o["group_column"],
                               id_column=o["id_column"], gaussian=options.gaussian,
                               seed=o["seed"] or 0)  # fmt: skip
            _check_planned(plan, o, options, new_store, appending)
        return  # the others: loaded by the flow
    from fairpipe.datasets import check_url_source, is_url

    if is_url(o["source"]):  # its rows are read by the workers: here, that it is there
        check_url_source(o["source"])
        return
    size = source.stat().st_size if source.is_file() else 0
    if source.is_dir():  # a Parquet data set: its files' bytes
        size = sum(p.stat().st_size for p in source.iterdir() if p.is_file())
    if size > PLAN_AHEAD_BYTES and source.suffix.lower() != ".npy":
        return
    from fairpipe.datasets import read_source_rows

    plan = plan_source(o["source"], group_column=o["group_column"], id_column=o["id_column"],
                       groups_file=o["groups_file"], ids_file=o["ids_file"])  # fmt: skip
    if size <= CHECK_AHEAD_BYTES:
        read_source_rows(plan, 0, plan.n)
    check_projection_size(plan.d, o["n_hashes"] or 1, o["n_tables"] or 1)
    _check_planned(plan, o, options, new_store, appending)


def _check_planned(plan, o: dict, options, new_store: bool, appending) -> None:
    """A planned source: an append's against the store (``appending``:
    :func:`fairpipe.flows.checks.check_ingest`'s answer), or a new store's parameters' errors (the flow
    chooses them again)."""
    if appending is not None:
        from fairpipe.flows.checks import check_append

        check_append(plan, options, *appending)
    elif new_store:
        from fairpipe.flows.parameters import new_store_parameters

        plan = _scaled(plan, o)
        new_store_parameters(plan, plan.ids, o["seed"] or 0, n_hashes=o["n_hashes"],
                             n_tables=o["n_tables"], bucket_width=o["bucket_width"],
                             radius=o["radius"], recall=o["recall"],
                             max_radius=o["max_radius"])  # fmt: skip


def ingest_options(o: dict, lock_timeout: float = 0.0, new_store: bool = False):
    """The ingest flow's options (:class:`fairpipe.flows.options.IngestOptions`) from the command's."""

    gaussian = {"n": o["gaussian_n"], "d": o["gaussian_d"], "clusters": o["gaussian_clusters"],
                "groups": o["gaussian_groups"]}  # fmt: skip
    return IngestOptions(
        seed=o["seed"], group_column=o["group_column"], id_column=o["id_column"],
        groups_file=o["groups_file"], ids_file=o["ids_file"], n_hashes=o["n_hashes"],
        n_tables=o["n_tables"], bucket_width=o["bucket_width"], radius=o["radius"],
        max_radius=o["max_radius"], recall=o["recall"], chunk_rows=o["chunk_rows"], scale=o["scale"], gaussian=gaussian,
        lock_timeout=lock_timeout, new_store=new_store,
    )  # fmt: skip


def _scaled(plan, o: dict):
    """A new store's plan with its scaler (its errors, a constant column, come here)."""
    from fairpipe.flows.parameters import scaled_plan

    sampled = None in (o["n_hashes"], o["n_tables"], o["bucket_width"])
    return scaled_plan(plan, plan.ids, o["seed"] or 0, o["scale"] or "auto", sampled)[0]


def _new_local_store(store: str) -> bool:
    """Whether ``store`` names a local folder that does not exist yet (a new store)."""
    from fairpipe.storage.urls import parse_store_url

    local = parse_store_url(store).local_dir
    return local is not None and not local.exists()


@command(shared=WRITES_STORES, render=_render, check=_check, settings=(*SOURCE, *INDEX, *GAUSSIAN))
def ingest(
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE",
            help="A .npy, .csv(.gz) or .parquet file, or a folder of .parquet files; a "
            ".csv(.gz) or .parquet at an s3://, gs://, az:// or https:// URL, or a prefix of "
            ".parquet files (ending in /), read by the workers; 'digits' (1,797 bundled "
            "8x8 images), 'gaussian' (generated: --gaussian-*), or mnist:PATH / "
            "word2vec:PATH / adult:PATH / bank:PATH / census-kdd:PATH.",
            show_default=False,
        ),
    ],
    store: Store,
    *,
    shared: Shared,
    **settings: Any,
) -> dict:
    """Ingest SOURCE into a store and build its LSH bucket index (one commit); ingesting into
    an existing store appends.

    \b
    Examples:
      fairpipe ingest digits --store digits.store
      fairpipe ingest gaussian --store gaussian.store --gaussian-n 5000 --recall 0.9
    """
    from fairpipe.flows.ingest import run_ingest

    given = {**locals(), **settings}
    options = ingest_options(given, shared.lock_timeout, shared.store_absent)
    result = run_ingest(source, store, options, **shared.cluster)
    for warning in result["warnings"]:
        diagnostics_console().print(f"warning: {warning}")
    return result
