"""Audit flow: a classifier and a data set -> discriminatory inputs found by ADF (and baselines),
the model's discrimination rate, optionally retraining with some of the inputs found.

Seeds are chosen by clustering the data (ADF), split into fixed batches of ``SEEDS_PER_TASK``
seeds, and each batch runs global then local generation as a Dask task with its own random
generator (seeded from (seed, batch)), so the samples do not depend on the worker count. The
random baseline gets the same budget (the number of distinct inputs ADF generated).

Written to ``--out`` (only after everything succeeded): ``samples.parquet`` (the distinct
discriminatory inputs, one column per attribute), ``model.pkl`` (the model that was tested, so
anyone can re-check the samples), ``metrics.json`` and ``ids.png`` (distinct discriminatory inputs
against inputs generated, ADF and random).
"""

from __future__ import annotations

import json
import pickle
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fairpipe.adf import (
    Domain,
    adf_search,
    check_discrimination,
    cluster_seeds,
    discrimination_rate,
    random_search,
)
from fairpipe.audit_data import AuditData, load_audit_data
from fairpipe.errors import FairpipeInputError, check_positive_int
from fairpipe.model_adapters import adapter_for
from flows.ingest import _default_task_runner

SEEDS_PER_TASK = 100
HIDDEN = (64, 32, 16, 8, 4)  # the paper's six-layer network (with the output layer)
NO_MODEL_FILE = "The model file {path} does not exist."
BAD_MODEL_FILE = "The model file {path} could not be loaded: {why}."


@dataclass
class AuditOptions:
    dataset: str = "adult"
    protected: list[str] = field(default_factory=lambda: ["sex"])
    model: str | None = None  # a pickled classifier; None: train the paper's MLP
    seeds: int = 1000
    local: int = 1000
    max_iter: int = 10
    retrain: bool = False
    repeats: int = 1  # retraining repeats (the improvement is averaged)
    train_iter: int = 50
    seed: int = 0
    data_dir: str | None = None


def train_mlp(data: AuditData, seed: int, max_iter: int, X_extra=None, y_extra=None):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    X, y = data.X.astype(np.float64), data.y
    if X_extra is not None:
        X, y = np.vstack([X, X_extra]), np.concatenate([y, y_extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MLPClassifier(hidden_layer_sizes=HIDDEN, max_iter=max_iter, random_state=seed).fit(
            X, y
        )


def _load_model(path: str):
    p = Path(path)
    if not p.is_file():
        raise FairpipeInputError(NO_MODEL_FILE.format(path=path))
    try:
        with open(p, "rb") as fh:
            return pickle.load(fh)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is the user's file
        raise FairpipeInputError(BAD_MODEL_FILE.format(path=path, why=exc)) from None


def check_request(o: AuditOptions):
    """Load and check everything before any search runs: (data, domain, model or None)."""
    for name in ("seeds", "local", "max_iter", "repeats", "train_iter"):
        check_positive_int(getattr(o, name), name, "audit")
    data = load_audit_data(o.dataset, o.data_dir)
    domain = data.domain(o.protected)
    model = _load_model(o.model) if o.model else None
    if model is not None:
        adapter_for(model, n_features=domain.d)
    return data, domain, model


@task(name="adf-batch", cache_policy=NO_CACHE)
def adf_batch_task(model, seeds, domain: Domain, n_local: int, max_iter: int, seed: int):
    t0 = time.perf_counter()
    res = adf_search(adapter_for(model), seeds, domain, n_local, max_iter, seed)
    return res, time.perf_counter() - t0


def _majority_labels(adapter, X: np.ndarray, domain: Domain) -> np.ndarray:
    """Label each input by the model's majority decision over it and its protected variants."""
    values = domain.protected_values()
    n, P = X.shape[0], values.shape[0]
    cand = np.repeat(X[:, None, :], P, axis=1)
    cand[:, :, list(domain.protected)] = values[None]
    votes = adapter.predict(cand.reshape(n * P, domain.d).astype(np.float64)).reshape(n, P)
    return (votes.mean(axis=1) >= 0.5).astype(np.int64)


def _plot(adf_trace, rnd_trace, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, trace in (("ADF", adf_trace), ("random", rnd_trace)):
        if trace:
            g, f = zip(*trace)
            ax.plot(g, f, label=name)
    ax.set(xlabel="distinct inputs generated", ylabel="distinct discriminatory inputs", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@flow(name="fairpipe-audit", log_prints=False, task_runner=_default_task_runner())
def audit_flow(options: AuditOptions, out: str | None = None) -> dict:
    o = options
    t_start = time.perf_counter()
    data, domain, model = check_request(o)
    timings: dict[str, float] = {}
    if model is None:
        t0 = time.perf_counter()
        model = train_mlp(data, o.seed, o.train_iter)
        timings["train"] = time.perf_counter() - t0
    adapter = adapter_for(model, n_features=domain.d)
    seeds = cluster_seeds(data.X, o.seeds, seed=o.seed)
    t0 = time.perf_counter()
    futures = [
        adf_batch_task.submit(model, seeds[a : a + SEEDS_PER_TASK], domain, o.local, o.max_iter,
                              o.seed * 1_000_003 + j)
        for j, a in enumerate(range(0, seeds.shape[0], SEEDS_PER_TASK))
    ]  # fmt: skip
    parts = [f.result() for f in futures]
    timings["adf"] = time.perf_counter() - t0
    found = np.unique(np.concatenate([p[0].discriminatory for p in parts]), axis=0)
    generated = int(sum(p[0].generated for p in parts))  # distinct within each batch
    trace, base = [], (0, 0)
    for p, _ in parts:
        trace += [(base[0] + g, base[1] + f) for g, f in p.trace]
        base = trace[-1] if trace else base
    # Every sample is re-checked in the flow before it is reported.
    disc, _ = check_discrimination(adapter, found, domain)
    found = found[disc]
    t0 = time.perf_counter()
    rnd = random_search(adapter, domain, max(generated, 1), seed=o.seed)
    timings["random"] = time.perf_counter() - t0
    rate = discrimination_rate(adapter, domain, seed=o.seed)
    metrics: dict = {
        "dataset": data.name,
        "protected": list(o.protected),
        "rows": int(data.X.shape[0]),
        "seeds": int(seeds.shape[0]),
        "local": o.local,
        "adf": {
            "ids": int(found.shape[0]),
            "generated": generated,
            "global_ids": int(sum(p[0].global_found for p in parts)),
            "success_rate": found.shape[0] / generated if generated else 0.0,
            "ids_per_second": found.shape[0] / timings["adf"] if timings["adf"] > 0 else None,
        },
        "random": {
            "ids": int(rnd.discriminatory.shape[0]),
            "generated": rnd.generated,
            "success_rate": rnd.success_rate,
        },
        "discrimination_rate": rate,
    }
    if o.retrain and found.shape[0]:
        t0 = time.perf_counter()
        after = []
        rng = np.random.default_rng(o.seed)
        for r in range(o.repeats):
            take = rng.choice(found.shape[0], size=max(1, found.shape[0] // 20), replace=False)
            extra = found[take]
            labels = _majority_labels(adapter, extra, domain)
            retrained = train_mlp(data, o.seed + r, o.train_iter, extra.astype(float), labels)
            after.append(discrimination_rate(adapter_for(retrained), domain, seed=o.seed))
        metrics["retrain"] = {
            "samples": int(max(1, found.shape[0] // 20)),
            "rate_before": rate,
            "rate_after": float(np.mean(after)),
            "improvement": (rate - float(np.mean(after))) / rate if rate > 0 else None,
            "repeats": o.repeats,
        }
        timings["retrain"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    metrics["timings"] = timings
    if out is not None:
        import pandas as pd

        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(found, columns=list(domain.names)).to_parquet(folder / "samples.parquet")
        with open(folder / "model.pkl", "wb") as fh:
            pickle.dump(model, fh)
        _plot(trace, rnd.trace, folder / "ids.png", f"{data.name}, protected {o.protected}")
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
        metrics["out"] = str(folder)
    return metrics


def run_audit(options: AuditOptions, out=None, dask_address=None, n_workers=2, processes=True):
    from flows.runtime import prefect_api, task_runner

    check_request(options)  # bad input fails here, before a cluster starts
    with prefect_api():
        runner = task_runner(dask_address, n_workers=n_workers, processes=processes)
        return audit_flow.with_options(task_runner=runner)(
            options, None if out is None else str(out)
        )


if __name__ == "__main__":
    print(json.dumps(run_audit(AuditOptions(seeds=100, local=100)), indent=1, default=str))
