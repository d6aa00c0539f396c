"""fairpipe against its peers on the same points and queries:

    .venv/bin/python benchmarks/bench_peers.py [--n 1000000] [--d 128] [--clusters 16]
        [--queries 20] [--store DIR] [--out benchmarks/out]

The points are ``fairpipe ingest gaussian --gaussian-n N --gaussian-d D --gaussian-clusters C``
(every other option at its default); the queries are 20 of its rows, chosen by a hash of their
ids; r is the store's suggested radius (the radius ``fairpipe sample`` queries at by default).
The truth, B(q, r), is found by brute force (exact distances, in blocks of rows).

Compared, on one machine and in one process:

- fairpipe: the store as ``fairpipe ingest`` builds it, queried through
  ``fairpipe.storage.reader.open_reader(url)``, without ``preload()`` (queries read what they need from the
  store) and with it (the whole index in memory);
- FAISS IndexIVFFlat, nlist = 4 sqrt(n), trained on the points; nprobe tuned: the smallest power
  of two whose range search finds, on the same queries, the mean coverage fairpipe reaches and
  at least 0.95;
- FAISS exact range search (IndexFlatL2.range_search).

A FAISS sample is one range search, then uniform picks from what it returned. Measured: coverage
|found ∩ B(q, r)| / |B(q, r)|; TV to uniform on B(q, r) for S = 100 |B(q, r)| samples; single-
sample latency (median over the queries, warm: the process, the index and the page cache warmed
on other rows; for fairpipe without preload each query is new to the reader); samples/s for
100,000 samples of one query (the search included; median over the queries); build time and
bytes (FAISS: the serialized index; fairpipe: the store's bytes beyond the points); forgetting one
id with erasure (fairpipe: ``fairpipe forget``, which erases the row from the store's history;
FAISS: ``remove_ids``, in memory only).

FAISS is an optional benchmark dependency (``pip install -c constraints.txt -e ".[bench]"``);
without it the FAISS columns are skipped with a message. Output: a table with each figure next to
its target, ``peers.json`` and ``peers.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairpipe.neighbors import (  # noqa: E402
    coverage,
    expected_tv_on_ball,
    hash_order,
    noise_floor,
    true_balls,
    tv_to_uniform,
)

PER_POINT = 100  # S = 100 |B(q, r)| samples per query for the TV
MANY = 100_000  # samples of one query for the throughput
WARM_ROWS = 5  # other rows queried first
BATCH_SAMPLES = 10  # samples of each query of the batch
TARGET_COVERAGE, TARGET_MIN_COVERAGE, TARGET_TV = 0.95, 0.9, 1.5  # TV: x the noise floor
TARGET_WARM_MS = 10.0  # a warm query without preload()
TARGET_MANY_PER_S = 10e6  # 100,000 samples of one query, hot
NO_FAISS = (
    "FAISS columns skipped: faiss is not installed (it is an optional benchmark dependency: "
    '`pip install -c constraints.txt -e ".[bench]"`).'
)


def rss_bytes() -> int:
    """The process's resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_json(args: list[str], env: dict) -> tuple[dict, float]:
    """(the command's --json result, its wall seconds); a failure stops the benchmark."""
    t0 = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"{' '.join(args[:3])} failed (exit {out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout), wall


# -- the systems: each finds a query's points within r and draws from them -----------------------
class Fairpipe:
    """A store reader; ``preload`` reads the index (the tables of the radius's scale) into
    memory first."""

    def __init__(self, url: str, preload: bool, radius: float):
        from fairpipe.storage.reader import open_reader

        self.name = "fairpipe + preload()" if preload else "fairpipe"
        self.reader = open_reader(url)
        self.preload_s = self.preload_rss = None
        if preload:
            before, t0 = rss_bytes(), time.perf_counter()
            self.reader.preload(radius)
            self.preload_s, self.preload_rss = time.perf_counter() - t0, rss_bytes() - before

    def batch(self, rows: np.ndarray, radius: float, k: int, seed: int) -> int:
        """``k`` samples of each of ``rows`` in one call (a batch of 64 or more reads the
        scale's index once); returns the samples drawn."""
        res = self.reader.sample(query_rows=rows, radius=radius, n_samples=k, seed=seed,
                                 include_query=True)  # fmt: skip
        return int(res.counts.sum())

    def find(self, row: int, radius: float) -> np.ndarray:
        # The gaussian source's ids are its row numbers (run checks it). The query's own row
        # counts, as in the peers' range searches.
        return np.sort(self.reader.neighbourhood(query_rows=[row], radius=radius,
                                                 include_query=True)[0])  # fmt: skip

    def sample(self, row: int, radius: float, k: int, seed: int) -> np.ndarray:
        res = self.reader.sample(query_rows=[row], radius=radius, n_samples=k, seed=seed,
                                 include_query=True)  # fmt: skip
        return res.rows[0, : res.counts[0]]


class Faiss:
    """A FAISS index: a sample is one range search, then uniform picks from its result."""

    def __init__(self, name: str, index, build_s: float, X: np.ndarray):
        import faiss

        self.name, self.index, self.build_s, self.X = name, index, build_s, X
        self.bytes = int(faiss.serialize_index(index).nbytes)
        self.bytes_beyond_points = self.bytes - X.size * 4

    def find(self, row: int, radius: float) -> np.ndarray:
        _, _, found = self.index.range_search(self.X[row : row + 1], radius * radius)
        return found

    def sample(self, row: int, radius: float, k: int, seed: int) -> np.ndarray:
        found = self.find(row, radius)
        if found.size == 0:
            return found
        return found[np.random.default_rng(seed).integers(0, found.size, size=k)]

    def batch(self, rows: np.ndarray, radius: float, k: int, seed: int) -> int:
        """One batched range search of ``rows``, then ``k`` uniform picks from each result."""
        lims, _, found = self.index.range_search(self.X[rows], radius * radius)
        rng, drawn = np.random.default_rng(seed), 0
        for i in range(rows.shape[0]):
            hits = found[lims[i] : lims[i + 1]]
            if hits.size:
                drawn += hits[rng.integers(0, hits.size, size=k)].size
        return drawn


def faiss_ivf(X: np.ndarray, nlist: int):
    import faiss

    t0 = time.perf_counter()
    quantizer = faiss.IndexFlatL2(X.shape[1])
    index = faiss.IndexIVFFlat(quantizer, X.shape[1], nlist)
    # FAISS asks for 39 training points per list at least (and warns below); 64 per list.
    train = X[np.random.default_rng(0).permutation(X.shape[0])[: 64 * nlist]]
    index.train(train)
    index.add(X)
    return index, time.perf_counter() - t0


def faiss_flat(X: np.ndarray):
    import faiss

    t0 = time.perf_counter()
    index = faiss.IndexFlatL2(X.shape[1])
    index.add(X)
    return index, time.perf_counter() - t0


# -- the measurements --------------------------------------------------------------------------------
def measure(
    system, queries: np.ndarray, warm: np.ndarray, balls: list[np.ndarray], r: float
) -> dict:
    """Latency first (each query new to the system), then coverage, TV on B(q, r), and the
    throughput of ``MANY`` samples of one query."""
    for j, row in enumerate(warm):
        system.sample(int(row), r, 1, seed=j)
    first, again = [], []
    for j, row in enumerate(queries):
        for times in (first, again):
            t0 = time.perf_counter()
            got = system.sample(int(row), r, 1, seed=j)
            times.append(time.perf_counter() - t0)
            assert got.size == 1
    cover, tvs, drawn, asked, found_sizes = [], [], 0, 0, []
    for j, (row, B) in enumerate(zip(queries, balls)):
        found = system.find(int(row), r)
        found_sizes.append(int(found.size))
        cover.append(coverage(found, B))
        S = PER_POINT * B.size
        got = system.sample(int(row), r, S, seed=1000 + j)
        drawn, asked = drawn + got.size, asked + S
        tvs.append(tv_to_uniform(got, B) if got.size else 1.0)
    rates, many_drawn = [], []
    for j, row in enumerate(queries):
        t0 = time.perf_counter()
        got = system.sample(int(row), r, MANY, seed=2000 + j)
        rates.append(got.size / (time.perf_counter() - t0))
        many_drawn.append(int(got.size))
    return {
        "latency_ms": float(np.median(first)) * 1e3,
        "latency_again_ms": float(np.median(again)) * 1e3,
        "coverage": cover,
        "mean_coverage": float(np.mean(cover)),
        "min_coverage": float(np.min(cover)),
        "found_sizes": found_sizes,
        "tv_ball": float(np.mean(tvs)),
        "tv_ball_per_query": tvs,
        "drawn": int(drawn),
        "asked": int(asked),
        "samples_per_s": float(np.median(rates)),
        "many_drawn": many_drawn,
        "many_drawn_share": sum(many_drawn) / (MANY * len(many_drawn)),
    }


def batch_timed(system, rows: np.ndarray, r: float) -> dict:
    """``BATCH_SAMPLES`` samples of each of ``rows`` at once: seconds and queries a second
    (fairpipe without preload(): its index read included)."""
    t0 = time.perf_counter()
    drawn = system.batch(rows, r, BATCH_SAMPLES, seed=3)
    seconds = time.perf_counter() - t0
    return {"batch_s": seconds, "batch_queries": int(rows.shape[0]),
            "batch_qps": rows.shape[0] / seconds, "batch_drawn": drawn}  # fmt: skip


def tune_nprobe(system: Faiss, queries, balls, r: float, target: float) -> tuple[int, dict]:
    """The smallest power of two reaching ``target`` mean coverage on the queries, and the
    mean coverage of each nprobe tried."""
    curve: dict[int, float] = {}
    nprobe = 1
    while True:
        system.index.nprobe = nprobe
        curve[nprobe] = float(np.mean([coverage(system.find(int(q), r), B)
                                       for q, B in zip(queries, balls)]))  # fmt: skip
        if curve[nprobe] >= target or nprobe >= system.index.nlist:
            return nprobe, curve
        nprobe = min(2 * nprobe, system.index.nlist)


def forget_fairpipe(exe: str, env: dict, store: str, row: int, r: float, query: int) -> dict:
    """``fairpipe forget`` of one id (the drain erases it from the store's history: the default
    erasure_retention is 0), then the proof: a new reader neither finds nor draws it, and no
    stored file (decompressed and scanned) holds its point's or sketch's bytes."""
    from fairpipe.storage.erasure import files_holding, row_needles
    from fairpipe.storage.reader import open_reader

    needles = row_needles(store, [row])
    res, wall = run_json([exe, "forget", "--store", store, "--ids", str(row), "--json"], env)
    reader = open_reader(store)
    found = reader.neighbourhood(query_rows=[query], radius=r)[0]
    drawn = reader.sample(query_rows=[query], radius=r, n_samples=10_000, seed=5).ids[0]
    t0 = time.perf_counter()
    leaks = files_holding(Path(store), needles)
    files = sum(1 for p in Path(store).rglob("*") if p.is_file())
    return {
        "flow_s": float(res["timings"]["total"]),
        "command_s": wall,
        "erasure": res.get("erasure"),
        "still_found": bool(np.isin(row, found)),
        "still_drawn": bool(np.isin(row, drawn)),
        "files_scanned": files,
        "files_holding_its_bytes": len(leaks),
        "scan_s": time.perf_counter() - t0,
    }


def forget_faiss(system: Faiss, row: int, r: float, query: int) -> dict:
    """``remove_ids`` of one id. FAISS keeps no history to erase: the index is an object in
    memory, and a copy saved before (``write_index``, here ``serialize_index``) still holds the
    vector; erasing it is the application's work (rewrite every saved copy)."""
    import faiss

    needle = system.X[row].astype("<f4").tobytes()
    saved = faiss.serialize_index(system.index).tobytes()
    t0 = time.perf_counter()
    removed = system.index.remove_ids(np.array([row], dtype=np.int64))
    seconds = time.perf_counter() - t0
    after = faiss.serialize_index(system.index).tobytes()
    return {
        "remove_ids_s": seconds,
        "removed": int(removed),
        "still_found": bool(np.isin(row, system.find(query, r))),
        "in_a_copy_saved_before": needle in saved,
        "in_a_copy_saved_after": needle in after,
    }


# -- the report ---------------------------------------------------------------------------------------
def fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "met" if ok else "NOT met"


def print_table(res: dict) -> list[tuple[str, ...]]:
    systems = res["systems"]
    names = list(systems)
    floor = res["noise_floor"]
    fp, pre = systems["fairpipe"], systems["fairpipe + preload()"]
    ivf = next((systems[n] for n in names if n.startswith("FAISS IVF")), None)
    equal = ivf is not None and min(fp["mean_coverage"], pre["mean_coverage"]) >= TARGET_COVERAGE
    rows: list[tuple[str, ...]] = []

    def row(figure: str, key: str, spec: str, target: str, scale: float = 1.0):
        values = [systems[n].get(key) for n in names]
        cells = [v if isinstance(v, str) else fmt(None if v is None else v * scale, spec)
                 for v in values]  # fmt: skip
        rows.append((figure, *cells, target))

    best = max(fp["mean_coverage"], pre["mean_coverage"])
    row("coverage of B(q, r), mean", "mean_coverage", ".3f",
        f">= 0.95: {verdict(best >= TARGET_COVERAGE)}")  # fmt: skip
    row("coverage of B(q, r), worst query", "min_coverage", ".3f",
        f">= 0.90: {verdict(min(fp['min_coverage'], pre['min_coverage']) >= TARGET_MIN_COVERAGE)}")  # fmt: skip
    row("TV on B(q, r), S = 100 |B|", "tv_ball", ".4f", f"floor {floor:.4f}")
    worst_tv = max(fp["tv_ball"], pre["tv_ball"]) / floor
    row("  x noise floor", "tv_ball", ".2f", f"<= 1.5x: {verdict(worst_tv <= TARGET_TV)}",
        1 / floor)  # fmt: skip
    row("  drawn / asked (TV runs)", "drawn_share", ".3f", "1")
    # Targets against FAISS IVF: single sample ahead of it at equal coverage >= 0.95; many
    # samples within 2x of it. The ratios are printed whatever the coverage.
    if ivf is None:
        lat_target = many_target = "FAISS IVF: not measured (faiss not installed)"
    else:
        ratios = [ivf["latency_ms"] / fp["latency_ms"], ivf["latency_ms"] / pre["latency_ms"]]
        outcome = verdict(min(ratios) > 1) if equal else "n/a (fairpipe's coverage < 0.95)"
        lat_target = (f"< FAISS IVF at equal coverage >= 0.95; its time / fairpipe's "
                      f"{ratios[0]:.2g}x, with preload {ratios[1]:.2g}x: {outcome}")  # fmt: skip
        share = pre["samples_per_s"] / ivf["samples_per_s"]
        many_target = (f">= FAISS IVF / 2; with preload {share:.2g}x FAISS IVF: "
                       f"{verdict(share >= 0.5)}")  # fmt: skip
    row("single sample, median ms (warm)", "latency_ms", ".3f", lat_target)
    row("  the same query again, ms", "latency_again_ms", ".3f", "")
    row("100,000 samples of one query, M/s", "samples_per_s", ".2f", many_target, 1e-6)
    row("  drawn / asked (100,000-sample runs)", "many_drawn_share", ".3f", "1")
    queries = fp.get("batch_queries", 0)
    batch_target = "FAISS IVF: not measured"
    if ivf is not None:
        ahead = max(fp["batch_qps"], pre["batch_qps"]) / ivf["batch_qps"]
        batch_target = (f"ahead of FAISS IVF's batched range search; {ahead:.2g}x it: "
                        f"{verdict(ahead > 1)}")  # fmt: skip
    row(f"{queries:,} queries x {BATCH_SAMPLES} samples at once, queries/s", "batch_qps", ",.0f",
        batch_target)  # fmt: skip
    row("build, s", "build_s", ".1f", "")
    row("index bytes beyond the points, per point", "bytes_per_point", ".0f", "")
    row("forget one id, s", "forget_s", ".3f", "")
    row("  erased from every stored byte", "erasure", "", "FAISS: no history; saved copies keep it")
    widths = [max(len(str(r[i])) for r in rows + [("figure", *names, "target")])
              for i in range(len(names) + 2)]  # fmt: skip
    header = ("figure", *names, "target")
    for r in [header, *rows]:
        print("  " + "  ".join(str(c).ljust(w) if i in (0, len(r) - 1) else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))), flush=True)  # fmt: skip
    print(f"  sampler engineer's targets: a warm query without preload() <= {TARGET_WARM_MS:.0f} ms: "
          f"{fp['latency_ms']:.1f} ms, {verdict(fp['latency_ms'] <= TARGET_WARM_MS)}; 100,000 "
          f"samples of one query >= 10M/s (preload): {pre['samples_per_s'] / 1e6:.2f}M/s, "
          f"{verdict(pre['samples_per_s'] >= TARGET_MANY_PER_S)}")  # fmt: skip
    return rows


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = res["systems"]
    names = list(systems)
    colours = [f"C{i}" for i in range(len(names))]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    panels = [
        ("mean_coverage", "coverage of B(q, r), mean", None, TARGET_COVERAGE),
        ("tv_ratio", "TV on B(q, r) / noise floor", None, TARGET_TV),
        ("latency_ms", "single sample, median ms (log)", "log", None),
        ("samples_per_s", "100,000 samples of one query, samples/s (log)", "log", None),
        ("bytes_per_point", "index bytes beyond the points, per point", None, None),
    ]
    for ax, (key, title, scale, target) in zip(axes.flat, panels):
        vals = [systems[n].get(key) or 0.0 for n in names]
        bars = ax.bar(range(len(names)), vals, color=colours)
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
        if target is not None:
            ax.axhline(target, color="k", linestyle="dashed", label=f"target {target}")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace(" (", "\n(").replace(" + ", "\n+ ") for n in names],
                           fontsize=7)  # fmt: skip
        ax.set_title(title, fontsize=9)
        if scale:
            ax.set_yscale(scale)
        ax.margins(y=0.15)
    ax = axes.flat[5]
    curve = res.get("nprobe_curve") or {}
    if curve:
        xs = sorted(int(k) for k in curve)
        ax.plot(xs, [curve[str(x)] if str(x) in curve else curve[x] for x in xs], "o-",
                label="FAISS IVF")  # fmt: skip
        ax.set_xscale("log", base=2)
    ax.axhline(systems["fairpipe"]["mean_coverage"], color="C0", linestyle="dotted",
               label="fairpipe")  # fmt: skip
    ax.axhline(TARGET_COVERAGE, color="k", linestyle="dashed", label="target 0.95")
    ax.set_title("mean coverage of B(q, r) against nprobe", fontsize=9)
    ax.set_xlabel("nprobe", fontsize=8)
    ax.legend(fontsize=7)
    fig.suptitle(
        f"fairpipe and FAISS on {res['n']:,} x {res['d']} Gaussian points ({res['clusters']} "
        f"clusters), {res['queries']} queries, r = {res['radius']:.4g}", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="points (default 1,000,000)")
    ap.add_argument("--d", type=int, default=128, help="dimensions (default 128)")
    ap.add_argument("--clusters", type=int, default=16, help="Gaussian clusters (default 16)")
    ap.add_argument("--queries", type=int, default=20, help="query rows (default 20)")
    ap.add_argument("--store", default=None,
                    help="an existing store of these points to use (it is not ingested again; "
                         "its build time is then unknown, and the forget changes it)")  # fmt: skip
    ap.add_argument(
        "--batch",
        type=int,
        default=10_000,
        help="queries of the batch row, 10 samples each (default 10,000)",
    )
    ap.add_argument("--radius-factor", type=float, default=1.0,
                    help="the query radius in units of the store's suggested radius r "
                         "(default 1; the store's range is up to 4 r)")  # fmt: skip
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import faiss
    except ImportError:
        faiss = None
        print(NO_FAISS, flush=True)
    exe = str(Path(sys.executable).with_name("fairpipe"))
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PREFECT_HOME=f"{tmp}/prefect")
        store, build = args.store, None
        if store is None:
            store = f"{tmp}/store"
            print(f"ingest: fairpipe ingest gaussian --gaussian-n {args.n} --gaussian-d {args.d} "
                  f"--gaussian-clusters {args.clusters}", flush=True)  # fmt: skip
            build, wall = run_json(
                [exe, "ingest", "gaussian", "--gaussian-n", str(args.n), "--gaussian-d",
                 str(args.d), "--gaussian-clusters", str(args.clusters), "--store", store,
                 "--json"], env)  # fmt: skip
            build["command_s"] = wall
            print(f"  {build['timings']['total']:.1f} s in the flow ({wall:.1f} s command), "
                  f"lsh {build['lsh']}", flush=True)  # fmt: skip
        res = run(args, store, build, faiss, exe, env)
    print_table(res)
    if faiss is None:
        print(NO_FAISS)
    stem = "peers" if args.radius_factor == 1 else f"peers_{args.radius_factor:g}r"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=float))
    plot(res, out / f"{stem}.png")
    print(f"  json: {out / f'{stem}.json'}\n  plot: {out / f'{stem}.png'}")


def run(args, store: str, build: dict | None, faiss, exe: str, env: dict) -> dict:
    from fairpipe.storage.reader import open_reader
    from fairpipe.storage.store import FairpipeStore

    st = FairpipeStore.open(store)
    X, ids, alive = st.read("points"), st.read("ids"), st.read("alive").astype(bool)
    n, d = X.shape
    if not np.array_equal(ids, np.arange(n)):
        raise SystemExit("the store's ids are not its row numbers (ingest gaussian gives them)")
    attrs = open_reader(store).attrs
    r = float(attrs["suggested_radius"]) * args.radius_factor
    live = np.flatnonzero(alive)
    order = live[hash_order(ids[live], 0, salt=0x0E)]
    # Queries: the first rows in that order whose ball holds another point (a ball of one is
    # fair to everyone in it), as evaluate_tv's min_size = 2; the warm-up rows come after them.
    t0 = time.perf_counter()
    queries, balls, tried = [], [], 0
    while len(queries) < args.queries and tried < live.size:
        batch = order[tried : tried + 2 * args.queries]
        tried += batch.size
        for row, ball in zip(batch, true_balls(X, X[batch], r, alive=alive)):
            if ball.size >= 2 and len(queries) < args.queries:
                queries.append(int(row))
                balls.append(ball)
    truth_s = time.perf_counter() - t0
    queries = np.array(queries, dtype=np.int64)
    warm = order[tried : tried + WARM_ROWS]
    sizes = [int(b.size) for b in balls]
    floor = noise_floor(PER_POINT)
    print(f"n={n:,} d={d} r={r:.4g} ({args.radius_factor:g} x the store's suggested radius); "
          f"{len(queries)} queries "
          f"({tried} rows tried), |B(q, r)| {min(sizes)}-{max(sizes)} (median "
          f"{np.median(sizes):.0f}), brute force {truth_s:.1f} s; lsh {attrs['lsh']}",
          flush=True)  # fmt: skip
    store_bytes = folder_bytes(Path(store))
    # The batch: the next live rows in hash order (the queries above among them or not).
    batch_rows = order[: min(args.batch, live.size)].astype(np.int64)
    systems: dict[str, dict] = {}
    for preload in (False, True):
        fp = Fairpipe(store, preload, r)
        t0 = time.perf_counter()
        m = measure(fp, queries, warm, balls, r)
        m.update(batch_timed(fp, batch_rows, r))
        m.update(
            build_s=None if build is None else float(build["timings"]["total"]),
            bytes=store_bytes,
            bytes_per_point=(store_bytes - n * d * 4) / n,
            preload_s=fp.preload_s,
            preload_rss_bytes=fp.preload_rss,
        )
        systems[fp.name] = m
        print(f"  {fp.name}: measured in {time.perf_counter() - t0:.1f} s"
              + (f" (preload {fp.preload_s:.1f} s, +{fp.preload_rss / 2**20:,.0f} MB)"
                 if preload else ""), flush=True)  # fmt: skip
        del fp
        gc.collect()
    nprobe, curve, peers = None, {}, []
    if faiss is not None:
        nlist = int(round(4 * math.sqrt(n)))
        index, build_s = faiss_ivf(X, nlist)
        ivf = Faiss("FAISS IVF", index, build_s, X)
        target = max(TARGET_COVERAGE, systems["fairpipe"]["mean_coverage"])
        nprobe, curve = tune_nprobe(ivf, queries, balls, r, target)
        ivf.name = f"FAISS IVF (nlist {nlist}, nprobe {nprobe})"
        index, build_s = faiss_flat(X)
        flat = Faiss("FAISS exact", index, build_s, X)
        peers = [ivf, flat]
        print(f"  FAISS {faiss.__version__}, {faiss.omp_get_max_threads()} threads; IVF built in "
              f"{ivf.build_s:.1f} s, nprobe {nprobe} for mean coverage >= {target:.3f}: "
              f"{curve}", flush=True)  # fmt: skip
        for peer in peers:
            t0 = time.perf_counter()
            m = measure(peer, queries, warm, balls, r)
            m.update(batch_timed(peer, batch_rows, r))
            m.update(build_s=peer.build_s, bytes=peer.bytes,
                     bytes_per_point=peer.bytes_beyond_points / n)  # fmt: skip
            systems[peer.name] = m
            print(f"  {peer.name}: measured in {time.perf_counter() - t0:.1f} s", flush=True)
    # Forget one point of the first query's ball (not the query): it must be neither found nor
    # drawn afterwards.
    gone = int(next(b for b in balls[0] if b != queries[0]))
    f = forget_fairpipe(exe, env, store, gone, r, int(queries[0]))
    erased = not (f["still_found"] or f["still_drawn"] or f["files_holding_its_bytes"])
    print(f"  fairpipe forget: {f['flow_s']:.2f} s in the flow ({f['command_s']:.1f} s command); "
          f"then found {f['still_found']}, drawn {f['still_drawn']}, its bytes in "
          f"{f['files_holding_its_bytes']} of {f['files_scanned']} files (scan "
          f"{f['scan_s']:.1f} s)", flush=True)  # fmt: skip
    for name in ("fairpipe", "fairpipe + preload()"):
        systems[name].update(forget_s=f["flow_s"], forget=f,
                             erasure="yes, 0 files" if erased else "NO")  # fmt: skip
    for peer in peers:
        f = forget_faiss(peer, gone, r, int(queries[0]))
        systems[peer.name].update(forget_s=f["remove_ids_s"], forget=f,
                                  erasure="no: memory only")  # fmt: skip
    for m in systems.values():
        m["tv_ratio"] = m["tv_ball"] / floor
        m["drawn_share"] = m["drawn"] / m["asked"]
    expected = [expected_tv_on_ball(round(c * b), b, PER_POINT * b)
                for c, b in zip(systems["fairpipe"]["coverage"], sizes)]  # fmt: skip
    return {
        "n": n, "d": d, "clusters": args.clusters, "queries": len(queries), "radius": r,
        "radius_factor": args.radius_factor,
        "query_rows": queries.tolist(), "ball_sizes": sizes, "noise_floor": floor,
        "fairpipe_expected_tv_ball": float(np.mean(expected)), "lsh": attrs["lsh"],
        "faiss": None if faiss is None else faiss.__version__,
        "faiss_threads": None if faiss is None else faiss.omp_get_max_threads(),
        "nprobe": nprobe, "nprobe_curve": curve, "forgotten_row": gone,
        "build": build, "systems": systems,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }  # fmt: skip


if __name__ == "__main__":
    main()
