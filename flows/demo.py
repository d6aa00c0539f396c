"""The main job: ingest the built-in digits, build the index, sample fairly, report and plot;
then fit the deletion-efficient clustering tree, select a fair summary, and forget some people the
way production does: deletion requests filed, one drain, receipts, and the proof that the rows are
in no snapshot and no stored byte."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from fairpipe.flows.fit import run_fit
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import FitOptions, IngestOptions, SummarizeOptions
from fairpipe.flows.outputs import check_output_file
from fairpipe.flows.sample import load_sampler
from fairpipe.flows.summarize import run_summarize
from fairpipe.neighbors import evaluate_tv, hash_order, pick_queries, plot_tv
from fairpipe.storage.erasure import files_holding, row_needles
from fairpipe.storage.queue import file_request, pending
from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.rows import read_points_at
from fairpipe.storage.store import FairpipeStore


def run_demo(
    store: str | None = None,
    n_queries: int = 20,
    seed: int = 0,
    plot: str | None = None,
    source: str = "digits",
    log=print,
) -> dict:
    from distributed import LocalCluster

    from fairpipe.flows.cluster import local_cluster_kwargs
    from fairpipe.flows.prefect_api import prefect_api

    if plot is not None:
        check_output_file(plot, "--plot")
    t0 = time.perf_counter()
    # One Prefect server and one Dask cluster for the three flows (each would start its own).
    with prefect_api(), LocalCluster(**local_cluster_kwargs()) as cluster:
        result = _run_demo(store, n_queries, seed, plot, source, log, cluster.scheduler_address)
    result["seconds"] = time.perf_counter() - t0  # start-up of the server and cluster included
    return result


RADIUS_FACTOR = 1.5  # the demo's radius, in suggested radii


def demo_radius(source: str, seed: int) -> float:
    """1.5 x the suggested radius of ``source`` (the median nearest-neighbour distance in the
    width sample ingest reads: :class:`fairpipe.neighbors.DistanceProfile`)."""
    from fairpipe.datasets import plan_source
    from fairpipe.flows.parameters import width_sample
    from fairpipe.neighbors import DistanceProfile

    plan = plan_source(source, seed=seed)
    sample = width_sample(plan, plan.ids, seed)
    return RADIUS_FACTOR * DistanceProfile.of(sample).suggested_radius


def _run_demo(store, n_queries, seed, plot, source, log, dask_address) -> dict:
    folder = Path(store) if store else Path(tempfile.mkdtemp(prefix="fairpipe-demo-")) / "store"
    log(f"[1/7] ingest {source} into {folder} (Prefect flow on a local Dask cluster)")
    # The queries' radius: 1.5 x the suggested one (most digits then have several others within
    # it); k, L and w are chosen for it, as ingest does for every new store (recall 0.98).
    radius = demo_radius(source, seed)
    options = IngestOptions(seed=seed, radius=radius)
    ingest = run_ingest(source, str(folder), options, dask_address=dask_address)
    lsh = ingest["lsh"]
    log(
        f"      {ingest['n']} points x {ingest['d']} dims, {len(ingest['groups'])} groups, "
        f"commit {ingest['commit']}, {ingest['timings']['total']:.1f} s"
    )
    log("[2/7] open the committed index")
    nn, attrs = load_sampler(str(folder))
    queries = pick_queries(nn, n_queries, seed)
    log(
        f"[3/7] sample 100 x |B(q, r)| fair neighbours for {len(queries)} queries, radius "
        f"{radius:.2f}; the true balls B(q, r) by brute force"
    )
    done = {}

    def progress(sampler, j, total):
        if j == total and sampler not in done:
            done[sampler] = True
            log(f"      {sampler:<8} done")

    ev = evaluate_tv(nn, queries, radius, mode="exact", seed=seed, progress=progress)
    plot_path = plot or str(folder.parent / "fairpipe-demo-tv.png")
    log(
        f"      M(q) holds {ev['mean_coverage']:.1%} of B(q, r) on average (the worst query "
        f"{ev['min_coverage']:.1%})"
    )
    plot_tv({source: ev}, plot_path,
            f"{source}: fair sampling, n_hashes={lsh['n_hashes']}, n_tables={lsh['n_tables']} "
            f"(expected recall {lsh['expected_recall']:.2f}), r={radius:.1f}")  # fmt: skip
    log("[4/7] fit DC-k-means, n_clusters=10, 8 x 2 tree (Prefect flow; leaves solved on Dask)")
    fit = run_fit(
        str(folder),
        FitOptions(n_clusters=10, fanout=8, height=2, seed=seed),
        dask_address=dask_address,
    )
    log(
        f"      {fit['leaves']} leaves, {fit['nodes']} nodes, commit {fit['commit']}, "
        f"{fit['timings']['total']:.1f} s"
    )
    log("[5/7] fair summary: 20 digits, 1 to 4 of each label (Prefect flow; leaves on Dask)")
    summary = run_summarize(
        str(folder), SummarizeOptions(k=20, lower=0.05, upper=0.2, fanout=16, height=2, seed=seed),
        dask_address=dask_address,
    )  # fmt: skip
    log(
        f"      utility {summary['value']:.1f}, error(S) = {summary['error']}, per label "
        f"{list(summary['counts'].values())}, commit {summary['commit']}, "
        f"{summary['timings']['total']:.1f} s"
    )
    # Forget 20 people who are near neighbours of the queries (then check they are never drawn)
    # and 2 members of the summary (which must then be replaced).
    # (the query's own row counts, as in the evaluation above: the paper's setting)
    near = nn.sample(query_rows=queries, radius=radius, n_samples=20, seed=seed,
                     include_query=True).ids  # fmt: skip
    near = np.setdiff1d(near[near >= 0], nn.ids_[queries])
    gone = near[hash_order(near, seed, salt=0x0F)][:20]
    # (not queries: a forgotten row cannot be a query of the samples drawn after the drain)
    members = np.setdiff1d(summary["ids"], np.concatenate([gone, nn.ids_[queries]]))[:2]
    log(f"[6/7] file deletion requests: {gone.size} of the queries' neighbours, 2 summary members")
    requests = [file_request(str(folder), gone, "demo: neighbours of the queries"),
                file_request(str(folder), members, "demo: summary members")]  # fmt: skip
    log(f"      {len(pending(str(folder)))} requests pending: {requests[0].request_id}, ...")
    gone_rows = np.flatnonzero(np.isin(nn.ids_, np.concatenate([gone, members])))
    needles = row_needles(str(folder), gone_rows)  # their points and sketch rows

    def hits_in_samples(sampler) -> tuple[int, int]:
        drawn = sampler.sample(query_rows=queries, radius=radius, n_samples=1000, seed=seed + 1,
                               include_query=True)  # fmt: skip
        return int(np.isin(drawn.ids, gone).sum()), int(drawn.ids.size)

    before, n_drawn = hits_in_samples(nn)
    log("[7/7] drain the queue (one commit: rows, index, tree, summary), then erase from history")
    forget = run_forget(str(folder), None, dask_address=dask_address)
    hits, _ = hits_in_samples(load_sampler(str(folder))[0])
    log(
        f"      {len(forget['deleted'])} forgotten in {len(forget['batches'])} batch, "
        f"{forget['leaves_recomputed']} leaves and {forget['nodes_recomputed']} nodes "
        f"recomputed, commit {forget['commit']}, {forget['timings']['total']:.1f} s"
    )
    log(
        f"      summary: {forget['summary_nodes_recomputed']} nodes recomputed, error(S) = "
        f"{forget['summary_error']}"
    )
    log(f"      the forgotten ids in {n_drawn:,} samples: {before} before, {hits} after")
    st = FairpipeStore.open(str(folder))
    receipts = read_receipts(st.readonly_session())
    for r in receipts:
        log(f"      receipt {r['request']}: {r['n_ids']} ids, applied {r['applied_at']}, "
            f"erased from history {r['erased_at']}")  # fmt: skip
    in_snapshots = 0
    for snap in st.history():
        try:
            pts = read_points_at(st.readonly_session(snap["id"]), gone_rows)
        except Exception:  # the repository's empty first snapshot
            continue
        in_snapshots += int(pts.any(axis=1).sum())
    leaks = files_holding(folder, needles)
    n_files = sum(1 for p in folder.rglob("*") if p.is_file())
    log(f"      proof: the {gone_rows.size} rows hold data in {in_snapshots} rows of the "
        f"{len(st.history())} snapshots left, and {len(leaks)} of the {n_files} stored files "
        f"(decompressed and scanned) hold their bytes")  # fmt: skip
    return {
        "store": str(folder),
        "ingest": ingest,
        "evaluation": ev,
        "fit": fit,
        "summary": summary,
        "summary_members_forgotten": members.tolist(),
        "forget": forget,
        "receipts": receipts,
        "erasure_proof": {
            "rows": int(gone_rows.size),
            "snapshots": len(st.history()),
            "rows_in_snapshots": in_snapshots,
            "files_scanned": n_files,
            "files_holding_erased_bytes": len(leaks),
        },  # fmt: skip
        "forgotten_in_samples": {"before": before, "after": hits},
        "plot": plot_path,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run_demo(), indent=2, default=str))
