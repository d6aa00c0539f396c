"""Audit flow: a classifier and a data set -> discriminatory inputs found by ADF (and the AEQUITAS
and random baselines, same budget), the model's discrimination rate, optionally retraining with
some of the inputs found.

Seeds are chosen by clustering the data (ADF) and split into fixed batches of ``SEEDS_PER_TASK``;
each batch runs global then local generation as a Dask task with its own random generator (seeded
from (seed, batch)), so the samples do not depend on the worker count. AEQUITAS gets the same
number of global inputs, in the same batches, and the same local steps per discriminatory input;
the random baseline gets as many inputs as ADF generated distinct ones. The methods run one after
the other, so each one's timing is its own.

Written to ``--out`` (only after everything succeeded, each file atomically): ``samples.parquet``
(the distinct discriminatory inputs, one column per attribute), ``model.pkl`` (the model that was
tested, so anyone can re-check the samples), ``metrics.json`` and ``ids.png`` (distinct
discriminatory inputs against time and against inputs generated, per method).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import time
from dataclasses import asdict
from pathlib import Path

from prefect.cache_policies import NO_CACHE

from fairpipe.audit import (
    Domain,
    adapter_for,
    adf_search,
    aequitas_search,
    check_discrimination,
    check_refittable,
    cluster_seeds,
    discrimination_rate,
    fit_quietly,
    load_model,
    merge_batches,
    paper_mlp,
    plot_traces,
    random_search,
    retraining_improvement,
    search_figures,
)
from fairpipe.datasets import AuditData, load_audit_data
from fairpipe.errors import FairpipeInputError, check_one_of
from fairpipe.flows.dask_map import on_cluster
from fairpipe.flows.options import AuditOptions
from fairpipe.flows.outputs import check_output_folder
from fairpipe.flows.private import flow, task
from fairpipe.flows.task_runner import default_task_runner, run_flow
from fairpipe.settings import AUDIT, BASELINES, RATE_SAMPLES, check_settings

# Seeds per Dask task: fixed (so the samples do not depend on the worker count) and large enough
# that a batch's walks are vectorised well (1,000 Adult seeds: 5.5 s in batches of 100, 3.9 s in
# batches of 250, one thread).
SEEDS_PER_TASK = 250
WARM_UP_TASKS = 4  # idle workers take one each
MODEL_AND_TRAIN = "Give either a model file (--model) or --train, not both."
TOO_FEW_ROWS = (
    "{name} has {rows} rows; ADF's seeds are drawn from the data, so it needs at least 4."
)


def check_request(o: AuditOptions):
    """Load and check everything before any search runs: (data, domain, model or None)."""
    check_settings("audit", (*AUDIT, RATE_SAMPLES), o)
    for b in o.baselines:
        check_one_of(b, BASELINES, "baselines", "audit")
    if o.model and o.train:
        raise FairpipeInputError(MODEL_AND_TRAIN)
    data = load_audit_data(o.dataset, o.data_dir)
    if data.X.shape[0] < 4:
        raise FairpipeInputError(TOO_FEW_ROWS.format(name=data.name, rows=data.X.shape[0]))
    domain = data.domain(o.protected)
    model = load_model(o.model) if o.model else None
    if model is not None:
        adapter_for(model, n_features=domain.d)
        if o.retrain:
            check_refittable(model)
    return data, domain, model


def train_model(data: AuditData, seed: int, max_iter: int):
    return fit_quietly(paper_mlp(seed, max_iter), data.X, data.y)


# -- Dask jobs: plain functions, each timed where it runs --------------------------------------------
def warm_up() -> int:
    """Import the search code in a worker (the first job on a cold worker process pays its
    imports), so the searches' clocks time the searches."""
    import sklearn.neural_network  # noqa: F401

    import fairpipe.audit  # noqa: F401

    return os.getpid()


def adf_batch(model, seeds, domain: Domain, n_local: int, max_iter: int, seed: int,
              objective: str):  # fmt: skip
    started = time.time()
    return adf_search(
        adapter_for(model), seeds, domain, n_local, max_iter, seed, objective
    ), started


def aequitas_batch(model, domain: Domain, n_global: int, n_local: int, seed: int):
    started = time.time()
    return aequitas_search(adapter_for(model), domain, n_global, n_local, seed), started


def random_batch(model, domain: Domain, budget: int, seed: int):
    started = time.time()
    return random_search(adapter_for(model), domain, budget, seed), started


# -- Prefect tasks: run in the flow's process, each sending its job to Dask ----------------------
@task(name="warm-up", cache_policy=NO_CACHE)
def warm_up_task(j: int) -> int:
    return on_cluster(warm_up)


@task(name="adf-batch", cache_policy=NO_CACHE)
def adf_batch_task(model, seeds, domain: Domain, n_local: int, max_iter: int, seed: int,
                   objective: str):  # fmt: skip
    return on_cluster(adf_batch, model, seeds, domain, n_local, max_iter, seed, objective)


@task(name="aequitas-batch", cache_policy=NO_CACHE)
def aequitas_batch_task(model, domain: Domain, n_global: int, n_local: int, seed: int):
    return on_cluster(aequitas_batch, model, domain, n_global, n_local, seed)


@task(name="random-search", cache_policy=NO_CACHE)
def random_task(model, domain: Domain, budget: int, seed: int):
    return on_cluster(random_batch, model, domain, budget, seed)


def _run_batches(submit, n_batches: int, bar, label: str):
    """Submit every batch, then collect them in order, advancing the progress bar."""
    t0 = time.time()
    futures = [submit(j) for j in range(n_batches)]
    task_id = bar.add_task(label, total=n_batches) if bar is not None else None
    parts = []
    for f in futures:
        parts.append(f.result())
        if bar is not None:
            ids = sum(p.discriminatory.shape[0] for p, _ in parts)
            bar.update(task_id, advance=1, description=f"{label}: {ids:,} IDs")
    return parts, t0, time.time() - t0


def _write_atomically(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def _progress(enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


@flow(name="fairpipe-audit", log_prints=False, task_runner=default_task_runner())
def audit_flow(options: AuditOptions, out: str | None = None) -> dict:
    o = options
    t_start = time.perf_counter()
    if out is not None:
        check_output_folder(out, "--out")  # before a search of minutes
    data, domain, model = check_request(o)
    timings: dict[str, float] = {}
    # Cold workers import while the model trains; the searches start once they are warm.
    warm = [warm_up_task.submit(j) for j in range(WARM_UP_TASKS)]
    if model is None:
        t0 = time.perf_counter()
        model = train_model(data, o.seed, o.train_iter)
        timings["train"] = time.perf_counter() - t0
    adapter = adapter_for(model, n_features=domain.d)
    t0 = time.perf_counter()
    seeds = cluster_seeds(data.X, o.n_seeds, seed=o.seed)
    timings["seeds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for w in warm:
        w.result()
    timings["warm_up_wait"] = time.perf_counter() - t0
    n_batches = -(-seeds.shape[0] // SEEDS_PER_TASK)
    batch_seed = [o.seed * 1_000_003 + j for j in range(n_batches)]
    metrics: dict = {
        "dataset": data.name,
        "protected": list(o.protected),
        "rows": int(data.X.shape[0]),
        "model": type(model).__name__,
        "seeds": int(seeds.shape[0]),
        "n_local": o.n_local,
        "max_iter": o.max_iter,
    }
    traces = {}
    with _progress(o.progress) as bar:
        parts, t0, seconds = _run_batches(
            lambda j: adf_batch_task.submit(
                model, seeds[j * SEEDS_PER_TASK : (j + 1) * SEEDS_PER_TASK], domain, o.n_local,
                o.max_iter, batch_seed[j], o.objective,
            ),
            n_batches, bar, "ADF",
        )  # fmt: skip
        found, traces["ADF"] = merge_batches(parts, t0)
        # Every sample is re-checked in the flow before it is reported.
        found = found[check_discrimination(adapter, found, domain)[0]]
        generated = sum(p.generated for p, _ in parts)  # distinct within each batch
        metrics["adf"] = search_figures(
            found, generated, sum(p.global_found for p, _ in parts), traces["ADF"], seconds
        )
        timings["adf"] = seconds
        if "aequitas" in o.baselines:
            sizes = [
                min(SEEDS_PER_TASK, seeds.shape[0] - j * SEEDS_PER_TASK) for j in range(n_batches)
            ]
            parts, t0, seconds = _run_batches(
                lambda j: aequitas_batch_task.submit(model, domain, sizes[j], o.n_local, batch_seed[j]),
                n_batches, bar, "AEQUITAS",
            )  # fmt: skip
            aeq_found, traces["AEQUITAS"] = merge_batches(parts, t0)
            metrics["aequitas"] = search_figures(
                aeq_found, sum(p.generated for p, _ in parts),
                sum(p.global_found for p, _ in parts), traces["AEQUITAS"], seconds,
            )  # fmt: skip
            timings["aequitas"] = seconds
        if "random" in o.baselines:
            parts, t0, seconds = _run_batches(
                lambda j: random_task.submit(model, domain, max(generated, 1), o.seed),
                1, bar, "random",
            )  # fmt: skip
            rnd_found, traces["random"] = merge_batches(parts, t0)
            metrics["random"] = search_figures(
                rnd_found, parts[0][0].generated, None, traces["random"], seconds
            )
            timings["random"] = seconds
    metrics["discrimination_rate"] = discrimination_rate(
        adapter, domain, o.rate_samples, seed=o.seed
    )
    if o.retrain and found.shape[0]:
        t0 = time.perf_counter()
        metrics["retrain"] = retraining_improvement(
            model, adapter, data.X, data.y, found, domain, repeats=o.repeats, seed=o.seed,
            rate_samples=o.rate_samples,
        )  # fmt: skip
        timings["retrain"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    metrics["timings"] = timings
    metrics["options"] = {k: v for k, v in asdict(o).items() if k != "progress"}
    if out is not None:
        import pandas as pd

        folder = Path(out)
        folder.mkdir(exist_ok=True)  # its parent exists (checked first)
        frame = pd.DataFrame(found, columns=list(domain.names))
        _write_atomically(folder / "samples.parquet", lambda p: frame.to_parquet(p, index=False))
        _write_atomically(folder / "model.pkl", lambda p: p.write_bytes(pickle.dumps(model)))
        title = f"{data.name}, protected {', '.join(o.protected)}"
        _write_atomically(folder / "ids.png", lambda p: plot_traces(traces, p, title))
        text = json.dumps(metrics, indent=1, default=str)
        _write_atomically(folder / "metrics.json", lambda p: p.write_text(text))
        metrics["out"] = str(folder)
    return metrics


def run_audit(
    options: AuditOptions,
    out=None,
    dask_address=None,
    n_workers=2,
    processes=True,
    dask_cluster=None,
):
    if out is not None:
        check_output_folder(str(out), "--out")
    check_request(options)  # bad input fails here, before a cluster starts
    return run_flow(audit_flow, options, None if out is None else str(out),
                    dask_address=dask_address, n_workers=n_workers, processes=processes, dask_cluster=dask_cluster)  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(run_audit(AuditOptions(n_seeds=100, n_local=100)), indent=1, default=str))
