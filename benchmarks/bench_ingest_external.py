"""Ingest on an external Dask cluster against the embedded one:

    .venv/bin/python benchmarks/bench_ingest_external.py [--n 1000000] [--runs 2]

Each run starts a fresh ``dask scheduler`` and two ``dask worker --no-nanny --nthreads 1``
processes (as a user's cluster), ingests the built-in ``gaussian`` data set (d = 128, 16
clusters, bucket width 40) with ``--dask-address`` and then with the embedded LocalCluster, and
measures numpy hashing the same points in a separate process (two BLAS threads, as
``bench_lsh.py`` does; the flows package sets one thread for its workers). Prints each run's
stage timings and both ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BASELINE = (
    "import sys; sys.path.insert(0, {bench!r}); from bench_lsh import numpy_hash_seconds; "
    "print(numpy_hash_seconds({n}, 128, 0))"
)


def start_cluster(port: int, env: dict) -> list[subprocess.Popen]:
    from distributed import Client

    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--port", str(port),
                               "--dashboard-address", ":0"], **quiet)]  # fmt: skip
    address = f"tcp://127.0.0.1:{port}"
    for _ in range(2):
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, "--nthreads", "1",
                                       "--no-nanny", "--no-dashboard"], **quiet))  # fmt: skip
    with Client(address, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
    return procs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import IngestOptions
    from fairpipe.flows.prefect_api import prefect_api

    options = IngestOptions(n_hashes=15, n_tables=100, bucket_width=40.0,  # numpy's k and L
                            gaussian={"n": args.n, "d": 128, "clusters": 16, "groups": 4})  # fmt: skip
    with prefect_api() as url:
        env = dict(os.environ, PREFECT_API_URL=url)
        for run in range(args.runs):
            port = 8790 + run
            procs = start_cluster(port, env)
            out: dict = {}
            try:
                for how in ("external", "embedded"):
                    folder = tempfile.mkdtemp()
                    kw = {"dask_address": f"tcp://127.0.0.1:{port}"} if how == "external" else {}
                    t0 = time.perf_counter()
                    res = run_ingest("gaussian", f"{folder}/store", options, **kw)
                    out[how] = {k: round(v, 2) for k, v in res["timings"].items()}
                    out[how]["wall"] = round(time.perf_counter() - t0, 2)
                    shutil.rmtree(folder)
            finally:
                for p in procs[::-1]:
                    p.terminate()
                for p in procs:
                    p.wait()
            env_2 = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
            code = BASELINE.format(bench=str(ROOT / "benchmarks"), n=args.n)
            base = float(subprocess.run([sys.executable, "-c", code], env=env_2, text=True,
                                        capture_output=True, check=True).stdout.split()[-1])  # fmt: skip
            print(f"run {run + 1}: numpy hashing {base:.2f} s")
            for how, t in out.items():
                print(f"  {how:9s} flow {t['total']:6.2f} s ({t['total'] / base:.2f}x)  "
                      f"hash and write {t['hash_and_write']:.2f}  index {t['bucket_index']:.2f}")  # fmt: skip
            print(json.dumps({"numpy": base, **out}))


if __name__ == "__main__":
    main()
