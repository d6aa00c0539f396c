"""The ``fairpipe`` command line: ingest, sample, fit, summarize, rerank, audit, forget, predict, info, demo."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

from flows import DEFAULT_ENV  # environment defaults, before Prefect is imported

# The command line reports a failed flow itself, in one line; Prefect's own error log (a traceback
# of the engine) would bury it. Set PREFECT_LOGGING_LEVEL=ERROR to see Prefect's logs again.
if os.environ.get("PREFECT_LOGGING_LEVEL") in (None, DEFAULT_ENV["PREFECT_LOGGING_LEVEL"]):
    os.environ["PREFECT_LOGGING_LEVEL"] = "CRITICAL"

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from fairpipe.errors import FairpipeInputError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Fair and forgettable pipelines for large tables of people.",
)
console = Console(stderr=True, soft_wrap=True)  # errors stay on one line for grep and logs


def _fail(exc: BaseException) -> None:
    console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


def _emit(result: dict, as_json: bool, render) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        render(result)


def _unwrap(exc: BaseException) -> BaseException:
    # Prefect and Dask wrap task errors; show the user's error, not the machinery's.
    seen = exc
    while not isinstance(seen, FairpipeInputError) and (seen.__cause__ or seen.__context__):
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    return seen if isinstance(seen, FairpipeInputError) else exc


@app.command()
def ingest(
    source: str = typer.Argument(
        ...,
        help="A .npy, .csv(.gz) or .parquet file, 'digits', 'gaussian', or mnist:PATH / word2vec:PATH / adult:PATH / bank:PATH / census-kdd:PATH.",
    ),
    store: str = typer.Option(..., "--store", help="Store folder (or s3://, gs://, az:// URL)."),
    seed: int = typer.Option(0, "--seed"),
    group_column: Optional[str] = typer.Option(None, "--group-column"),
    id_column: Optional[str] = typer.Option(None, "--id-column"),
    groups_file: Optional[str] = typer.Option(
        None, "--groups-file", help="Group labels (.npy) for a .npy source."
    ),
    ids_file: Optional[str] = typer.Option(
        None, "--ids-file", help="Ids (.npy) for a .npy source."
    ),
    lsh_k: int = typer.Option(15, "--lsh-k", help="Hash functions per table."),
    lsh_tables: int = typer.Option(100, "--lsh-tables", help="Number of tables L."),
    lsh_width: Optional[float] = typer.Option(
        None,
        "--lsh-width",
        help="Bucket width w (default: 3.2 x the median nearest-neighbour distance of a sample).",
    ),
    chunk_rows: Optional[int] = typer.Option(
        None, "--chunk-rows", help="Rows per chunk (default: about 16 MB of points)."
    ),
    gaussian_n: int = typer.Option(20000, "--gaussian-n"),
    gaussian_d: int = typer.Option(16, "--gaussian-d"),
    gaussian_clusters: int = typer.Option(8, "--gaussian-clusters"),
    gaussian_groups: int = typer.Option(4, "--gaussian-groups"),
    dask_address: Optional[str] = typer.Option(
        None, "--dask-address", help="An existing Dask scheduler (default: a local cluster)."
    ),
    workers: int = typer.Option(2, "--workers", help="Worker processes of the local cluster."),
    lock_timeout: float = typer.Option(
        0.0, "--lock-timeout", help="Seconds to wait for another writer."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Ingest SOURCE into a store and build its LSH bucket index (one commit)."""
    from flows.ingest import IngestOptions, run_ingest

    options = IngestOptions(
        seed=seed,
        group_column=group_column,
        id_column=id_column,
        groups_file=groups_file,
        ids_file=ids_file,
        lsh_k=lsh_k,
        lsh_tables=lsh_tables,
        lsh_width=lsh_width,
        chunk_rows=chunk_rows,
        lock_timeout=lock_timeout,
        gaussian={
            "n": gaussian_n,
            "d": gaussian_d,
            "clusters": gaussian_clusters,
            "groups": gaussian_groups,
        },
    )
    try:
        result = run_ingest(source, store, options, dask_address=dask_address, n_workers=workers)
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        console.print(
            f"ingested [bold]{r['added']}[/] rows -> {r['store']} ({r['n']} points x {r['d']} dims)"
        )
        console.print(f"groups: {r['groups']}")
        console.print(
            f"LSH: k={r['lsh']['k']} L={r['lsh']['n_tables']} w={r['lsh']['width']:.4g}; "
            f"suggested radius {r['suggested_radius']:.4g}; {r['buckets_per_table']:.0f} buckets/table"
        )
        console.print(
            f"commit {r['commit']} in {r['timings']['total']:.1f} s "
            f"({r['rows_per_second']:.0f} rows/s hashed and written)"
        )

    _emit(result, as_json, render)


@app.command()
def sample(
    store: str = typer.Option(..., "--store"),
    query_id: Optional[int] = typer.Option(None, "--query-id", help="Id of a stored point."),
    query_row: Optional[int] = typer.Option(
        None, "--query-row", help="Row number of a stored point."
    ),
    query_file: Optional[Path] = typer.Option(
        None, "--query-file", help="A .npy of query points (one per row)."
    ),
    radius: Optional[float] = typer.Option(
        None, "--radius", help="Neighbourhood radius (default: the store's suggested radius)."
    ),
    samples: int = typer.Option(10, "--samples"),
    method: str = typer.Option(
        "exact", "--method", help="exact | approx | uniform | weighted | rank"
    ),
    mode: str = typer.Option("exact", "--mode", help="buckets | approximate | exact"),
    c: float = typer.Option(2.0, "--c", help="Approximation factor of the 'approximate' mode."),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Draw SAMPLES uniformly random near neighbours of a query."""
    import numpy as np

    from flows.sample import sample_store

    given = [x is not None for x in (query_id, query_row, query_file)]
    try:
        if sum(given) != 1:
            raise FairpipeInputError("Give exactly one of --query-id, --query-row or --query-file.")
        queries = None
        if query_file is not None:
            if not query_file.exists():
                raise FairpipeInputError(f"Query file {str(query_file)!r} does not exist.")
            queries = np.load(query_file, allow_pickle=False)
        result = sample_store(
            store,
            query_ids=query_id,
            query_rows=query_row,
            queries=queries,
            radius=radius,
            n_samples=samples,
            method=method,
            mode=mode,
            seed=seed,
            c=c,
        )
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        for i, q in enumerate(r["queries"]):
            console.print(
                f"query {i}: |M(q)| = {q['neighbourhood_size']} within r={r['radius']:.4g} "
                f"({r['mode']} mode, {r['method']} sampler)"
            )
            print(" ".join(map(str, q["ids"])))

    _emit(result, as_json, render)


@app.command()
def fit(
    store: str = typer.Option(..., "--store"),
    k: int = typer.Option(..., "--k", help="Number of clusters."),
    model: str = typer.Option("dc", "--model", help="dc | q | auto (see choose_model)."),
    tree_width: int = typer.Option(8, "--tree-width", help="DC: children per node."),
    tree_height: int = typer.Option(2, "--tree-height", help="DC: levels below the root."),
    iterations: int = typer.Option(10, "--iterations", help="Lloyd iterations per node."),
    n_init: Optional[int] = typer.Option(
        None,
        "--n-init",
        help="Restarts, the lowest loss kept: DC, of each internal node (default 10); "
        "Q, whole training runs (default 1).",
    ),  # fmt: skip
    epsilon: float = typer.Option(
        0.05,
        "--epsilon",
        help="Q: lattice spacing, in the data's units (larger: more certified deletions, higher loss).",
    ),
    gamma: float = typer.Option(0.2, "--gamma", help="Q: balance correction, in (0, 1)."),
    seed: int = typer.Option(0, "--seed"),
    dask_address: Optional[str] = typer.Option(None, "--dask-address"),
    workers: int = typer.Option(2, "--workers"),
    lock_timeout: float = typer.Option(0.0, "--lock-timeout"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Fit the store's clustering model (DC-k-means tree or Q-k-means): one commit."""
    from flows.fit import FitOptions, run_fit

    options = FitOptions(
        k=k, model=model, width=tree_width, height=tree_height, iterations=iterations,
        n_init=n_init, seed=seed, epsilon=epsilon, gamma=gamma, lock_timeout=lock_timeout,
    )  # fmt: skip
    try:
        result = run_fit(store, options, dask_address=dask_address, n_workers=workers)
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        shape = (
            f"{r['leaves']} leaves, {r['nodes']} nodes"
            if r["model"] == "dc"
            else f"{r['steps']} steps; {r['certification_rate']:.0%} of a 200-point probe "
            "would be certified at deletion"
        )
        console.print(
            f"fitted {r['model']} k={r['k']} on {r['n_alive']} points ({shape}); "
            f"commit {r['commit']} in {r['timings']['total']:.1f} s"
        )
        console.print("cluster masses: " + " ".join(f"{m:.0f}" for m in r["masses"]))

    _emit(result, as_json, render)


@app.command()
def rerank(
    candidates: str = typer.Argument(..., help="CSV or Parquet: one row per (list, candidate)."),
    out: str = typer.Option(..., "--out", help="Output .csv or .parquet (metrics beside it)."),
    algorithm: str = typer.Option(
        "detconstsort", "--algorithm", help="detgreedy | detcons | detrelaxed | detconstsort."
    ),
    k: int = typer.Option(10, "--k", help="Top-k of each list (a shorter list keeps all)."),
    desired: str = typer.Option(
        "population",
        "--desired",
        help='A JSON file {"group": share, ...} summing to 1, or "population": each list\'s own '
        "group distribution.",
    ),
    list_column: str = typer.Option("list", "--list-column"),
    score_column: str = typer.Option("score", "--score-column"),
    group_column: str = typer.Option("group", "--group-column"),
    smoothing: float = typer.Option(
        0.0, "--smoothing", help="Skew of a group absent from the top k: -inf at 0 (the paper)."
    ),
    dask_address: Optional[str] = typer.Option(None, "--dask-address"),
    workers: int = typer.Option(2, "--workers"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Re-rank every list toward a desired group distribution; metrics before and after."""
    from flows.rerank import RerankOptions, run_rerank

    options = RerankOptions(
        algorithm=algorithm, k=k, desired=desired, list_column=list_column,
        score_column=score_column, group_column=group_column, smoothing=smoothing,
    )  # fmt: skip
    try:
        result = run_rerank(candidates, out, options, dask_address=dask_address, n_workers=workers)
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        o = Console(soft_wrap=True)
        o.print(
            f"re-ranked {r['lists']} lists ({r['rows_in']} candidates) with {r['algorithm']}, "
            f"top {r['k']}: {r['rows_out']} rows -> {r['out']}; metrics per list -> {r['metrics']}"
        )
        table = Table("mean over lists", "before (top-k by score)", "after")
        for key in ("min_skew", "max_skew", "ndkl", "infeasible_index", "ndcg"):
            b, a = r["mean"]["before"][key], r["mean"]["after"][key]
            table.add_row(
                key, "-inf" if b is None else f"{b:.4f}", "-inf" if a is None else f"{a:.4f}"
            )
        table.add_row(
            "lists infeasible",
            str(r["mean"]["before"]["infeasible_lists"]),
            str(r["mean"]["after"]["infeasible_lists"]),
        )
        o.print(table)
        o.print(f"{r['timings']['total']:.2f} s")

    _emit(result, as_json, render)


@app.command()
def audit(
    dataset: str = typer.Option(
        "adult",
        "--dataset",
        help="adult | german | bank (from ../shared/data or --data-dir), adult:PATH / german:PATH / bank:PATH, or an integer CSV with a 'label' column.",
    ),
    protected: list[str] = typer.Option(..., "--protected", help="Protected attribute (repeat)."),
    model: Optional[str] = typer.Option(
        None, "--model", help="A pickled classifier with predict_proba (or a torch.save module)."
    ),
    train: Optional[str] = typer.Option(
        None,
        "--train",
        help="Train the model to test: 'mlp', the paper's 64-32-16-8-4 network (the default without --model).",
    ),
    seeds: int = typer.Option(1000, "--seeds", help="Global seeds (clustered from the data)."),
    local: int = typer.Option(1000, "--local", help="Local steps per discriminatory input."),
    max_iter: int = typer.Option(10, "--max-iter", help="Global iterations per seed."),
    objective: str = typer.Option(
        "loss", "--objective", help="loss (ADF's: toward the decision boundary) | probability."
    ),
    baseline: list[str] = typer.Option(
        ["aequitas", "random"],
        "--baseline",
        help="aequitas | random (repeat); --no-baselines for none.",
    ),
    no_baselines: bool = typer.Option(False, "--no-baselines", help="Run ADF alone."),
    retrain: bool = typer.Option(False, "--retrain", help="Retrain with 5% of the inputs found."),
    repeats: int = typer.Option(5, "--repeats", help="Retraining repeats (averaged)."),
    train_iter: int = typer.Option(50, "--train-iter", help="Training epochs of the MLP."),
    out: Optional[str] = typer.Option(
        None, "--out", help="Folder for samples, model, metrics, plot."
    ),
    data_dir: Optional[str] = typer.Option(None, "--data-dir"),
    seed: int = typer.Option(0, "--seed"),
    dask_address: Optional[str] = typer.Option(None, "--dask-address"),
    workers: int = typer.Option(2, "--workers"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Search a classifier for discriminatory inputs (ADF, against AEQUITAS and random search) and
    measure its discrimination; optionally retrain with some of the inputs found."""
    from flows.audit import AuditOptions, run_audit

    options = AuditOptions(
        dataset=dataset, protected=list(protected), model=model, train=train, seeds=seeds,
        local=local, max_iter=max_iter, objective=objective,
        baselines=() if no_baselines else tuple(baseline), retrain=retrain, repeats=repeats, train_iter=train_iter, seed=seed, data_dir=data_dir,
        progress=not as_json,
    )  # fmt: skip
    try:
        result = run_audit(options, out, dask_address=dask_address, n_workers=workers)
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        o = Console(soft_wrap=True)
        o.print(
            f"{r['dataset']} ({r['rows']:,} rows), {r['model']}, protected {', '.join(r['protected'])}: "
            f"discrimination rate {r['discrimination_rate']:.2%} of random inputs"
        )
        from rich import box

        table = Table(box=box.SIMPLE_HEAD)
        for header in (
            "method",
            "#ID",
            "#GDiff",
            "success",
            "global",
            "seconds",
            "IDs/s",
            "1k IDs",
        ):
            table.add_column(header, no_wrap=True)
        for key, name in (("adf", "ADF"), ("aequitas", "AEQUITAS"), ("random", "random")):
            if key not in r:
                continue
            m = r[key]
            to_1000 = m["seconds_to_1000_ids"]
            table.add_row(
                name, f"{m['ids']:,}", f"{m['generated']:,}", f"{m['success_rate']:.1%}",
                "-" if m["global_ids"] is None else f"{m['global_ids']:,}", f"{m['seconds']:.2f}",
                f"{m['ids_per_second'] or 0:,.0f}", "never" if to_1000 is None else f"{to_1000:.2f} s",
            )  # fmt: skip
        o.print(table)
        if "retrain" in r:
            t = r["retrain"]
            o.print(
                f"retrained {t['repeats']}x with {t['samples']:,} of them: discrimination rate "
                f"{t['rate_before']:.2%} -> {t['rate_after']:.2%}"
                + (f" ({t['improvement']:.0%} better)" if t["improvement"] is not None else "")
            )
        if "out" in r:
            o.print(f"samples, model, metrics and plot in {r['out']}")

    _emit(result, as_json, render)


@app.command()
def forget(
    store: str = typer.Option(..., "--store"),
    ids: Optional[str] = typer.Option(None, "--ids", help="Comma-separated ids."),
    ids_file: Optional[str] = typer.Option(
        None, "--ids-file", help="A .npy, or text with one id per line."
    ),
    dask_address: Optional[str] = typer.Option(None, "--dask-address"),
    workers: int = typer.Option(2, "--workers"),
    lock_timeout: float = typer.Option(0.0, "--lock-timeout"),
    purge_history: bool = typer.Option(
        False,
        "--purge-history",
        help="Also drop every earlier snapshot (they still hold the erased rows) and delete "
        "the objects only they used. Time travel before this commit is lost.",
    ),  # fmt: skip
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Forget a batch of ids: erase the rows, drop them from the index, update the model."""
    from flows.forget import ForgetOptions, parse_ids, run_forget

    try:
        if (ids is None) == (ids_file is None):
            raise FairpipeInputError("Give exactly one of --ids or --ids-file.")
        wanted = parse_ids(text=ids, path=ids_file)
        result = run_forget(
            store, wanted, ForgetOptions(lock_timeout=lock_timeout, purge_history=purge_history),
            dask_address=dask_address, n_workers=workers,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        console.print(
            f"forgot {len(r['deleted'])} ids ({len(r['unknown'])} unknown, "
            f"{len(r['already_deleted'])} already forgotten); commit {r['commit']} "
            f"in {r['timings']['total']:.1f} s"
        )
        if r.get("model") == "dc" and r["deleted"]:
            console.print(
                f"tree: {r['leaves_recomputed']} leaves and {r['nodes_recomputed']} nodes recomputed"
            )
        elif r.get("model") == "q" and r["deleted"]:
            console.print(
                f"q-k-means: {r['certified']} deletions certified, retrained: {r['retrained']}"
            )
        if "summary_nodes_recomputed" in r:
            console.print(
                f"summary: {r['summary_nodes_recomputed']} nodes recomputed, "
                f"error(S) = {r['summary_error']}"
            )
        if r["unknown"]:
            console.print(f"unknown ids: {r['unknown'][:10]}")
        if "purged" in r:
            p = r["purged"]
            console.print(
                f"history purged: {p['snapshots_before']} -> {p['snapshots_after']} snapshots, "
                f"{p['chunks_deleted']} chunks ({p['bytes_deleted'] / 1e6:.1f} MB) deleted"
            )

    _emit(result, as_json, render)


@app.command()
def summarize(
    store: str = typer.Option(..., "--store"),
    k: int = typer.Option(..., "--k", help="Summary size (at most k elements)."),
    lower: Optional[float] = typer.Option(
        None, "--lower", help="Lower bound of every group, as a fraction of k (floor(lower * k))."
    ),
    upper: Optional[float] = typer.Option(
        None, "--upper", help="Upper bound of every group, as a fraction of k (ceil(upper * k))."
    ),
    bounds: Optional[str] = typer.Option(
        None, "--bounds", help='JSON file: {"group": [lower, upper], ...} in elements.'
    ),
    utility: str = typer.Option("exemplar", "--utility", help="exemplar | facility."),
    rule: str = typer.Option(
        "swap", "--rule", help="swap (exchange gain, default) | ck (Chakrabarti-Kale, 1/4 bound)."
    ),
    eval_size: int = typer.Option(2048, "--eval-size", help="Evaluation points per node."),
    tree_width: int = typer.Option(16, "--tree-width", help="Children per node."),
    tree_height: int = typer.Option(2, "--tree-height", help="Levels below the root."),
    seed: int = typer.Option(0, "--seed"),
    dask_address: Optional[str] = typer.Option(None, "--dask-address"),
    workers: int = typer.Option(2, "--workers"),
    lock_timeout: float = typer.Option(0.0, "--lock-timeout"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Select a fair summary of k points (per-group lower and upper bounds): one commit."""
    from flows.summarize import SummarizeOptions, run_summarize

    options = SummarizeOptions(
        k=k, lower=lower, upper=upper, bounds_file=bounds, utility=utility, rule=rule,
        eval_size=eval_size, width=tree_width, height=tree_height, seed=seed,
        lock_timeout=lock_timeout,
    )  # fmt: skip
    try:
        result = run_summarize(store, options, dask_address=dask_address, n_workers=workers)
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        out = Console(soft_wrap=True)
        out.print(
            f"summary of {len(r['ids'])} of {r['n_alive']} points ({r['utility']}, rule {r['rule']}): "
            f"utility {r['value']:.4g} on {r['eval_points']} evaluation points, "
            f"error(S) = {r['error']}, {r['oracle_calls']} gain evaluations; commit {r['commit']} "
            f"in {r['timings']['total']:.1f} s ({r['elements_per_second']:.0f} elements/s)"
        )
        table = Table("group", "lower", "upper", "in summary")
        for name, count in r["counts"].items():
            lo, up = r["bounds"][name]
            table.add_row(name, str(lo), str(up), str(count))
        out.print(table)
        out.print("ids: " + " ".join(map(str, r["ids"])))

    _emit(result, as_json, render)


@app.command()
def predict(
    store: str = typer.Option(..., "--store"),
    query_row: Optional[int] = typer.Option(None, "--query-row"),
    query_file: Optional[Path] = typer.Option(None, "--query-file"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The nearest root centroid of a stored row or of each row of a .npy file."""
    import numpy as np

    from flows.predict import predict_store

    try:
        queries = None
        if query_file is not None:
            if not query_file.exists():
                raise FairpipeInputError(f"Query file {str(query_file)!r} does not exist.")
            queries = np.load(query_file, allow_pickle=False)
        result = predict_store(store, query_rows=query_row, queries=queries)
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        for c, dist in zip(r["clusters"], r["distances"]):
            print(f"cluster {c}  distance {dist:.4g}")

    _emit(result, as_json, render)


@app.command()
def info(
    store: str = typer.Option(..., "--store"), as_json: bool = typer.Option(False, "--json")
) -> None:
    """Show a store's size, groups, LSH parameters and commit history."""
    from storage.store import FairpipeStore

    try:
        st = FairpipeStore.open(store)
        attrs = st.require_data()
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    from storage.summary import has_summary, read_summary_ids, summary_attrs

    result = {"store": store, **attrs, "history": st.history()}
    session = st.readonly_session()
    if has_summary(session):
        result["summary"] = {**summary_attrs(session), "ids": read_summary_ids(session).tolist()}

    def render(r):
        print(
            f"{r['store']}: {r['n']} points ({r['n_alive']} alive) x {r['d']} dims, "
            f"groups {r['group_names']}"
        )
        print(f"LSH {r['lsh']}; suggested radius {r['suggested_radius']:.4g}")
        if "summary" in r:
            s = r["summary"]
            print(
                f"fair summary: {len(s['ids'])} of k={s['k']} ({s['utility']}), error(S) = "
                f"{s['error']}, per group {s['counts']}"
            )
        shown = [h for h in r["history"] if not h["internal"]]
        for h in shown:
            print(f"{h['id']}  {h['time']}  {h['message']}")
        hidden = len(r["history"]) - len(shown)
        if hidden:
            print(f"({hidden} internal checkpoints of these commits not shown; --json lists them)")

    _emit(result, as_json, render)


@app.command()
def demo(
    store: Optional[str] = typer.Option(
        None, "--store", help="Folder for the demo store (default: a temporary folder)."
    ),
    queries: int = typer.Option(20, "--queries"),
    plot: Optional[str] = typer.Option(None, "--plot", help="PNG path for the TV plot."),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Ingest the built-in digits, sample fair neighbours, print a TV report and write a plot."""
    from flows.demo import run_demo

    try:
        result = run_demo(
            store=store,
            n_queries=queries,
            seed=seed,
            plot=plot,
            log=(lambda *_: None) if as_json else console.print,
        )
    except Exception as exc:  # noqa: BLE001
        _fail(_unwrap(exc))

    def render(r):
        ev = r["evaluation"]
        table = Table(
            title=f"TV to uniform over M(q): {ev['queries']} queries, "
            f"|M(q)| {min(ev['neighbourhood_sizes'])}-{max(ev['neighbourhood_sizes'])}, "
            f"noise floor {ev['noise_floor']:.4f}"
        )
        for col in ("method", "mean TV", "x noise floor", "samples/s"):
            table.add_column(col, justify="right")
        for m, v in ev["methods"].items():
            table.add_row(
                m, f"{v['tv']:.4f}", f"{v['ratio_to_floor']:.2f}", f"{v['samples_per_s']:,.0f}"
            )
        Console().print(table)
        print(f"plot: {r['plot']}\nstore: {r['store']}\ntotal {r['seconds']:.1f} s")

    _emit(result, as_json, render)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
