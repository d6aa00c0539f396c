"""What the records of fairpipe.storage.manifests and their checks cost, against what they sit in: run

    .venv/bin/python benchmarks/bench_records.py [--rows 1000000] [--d 16] [--repeat 5]

A store is built in a temporary folder, in this process: ``fairpipe.flows.ingest.run_ingest`` of the
``gaussian`` generator (``--rows`` x ``--d``, every other option at its default, one Dask worker
in this process). Then, best of ``--repeat`` unless said otherwise, each figure next to a
baseline measured in the same run:

- the record of a commit: the time in ``record_for``, timed inside ``fairpipe.storage.manifests.commit``
  (both wrapped with a timer, nothing else changed), next to the rest of that commit (Icechunk's
  own ``Session.commit``), for the ingest's commits (the store's creation, its checkpoints, the
  ingest's own: summed, once), a transaction that rewrites the first chunk of ``points`` with the
  same values, and a 2-id forget (``fairpipe.flows.forget.run_forget`` in this process: the commit of its
  batch, not those of its receipts); and ``record_for`` called directly on a writable session at
  the tip with the parent's record hidden, so that it lists every array and group (what a
  commit on a parent without a record lists), next to the walk of the store's nodes through
  zarr it starts with;
- the base check a transaction makes (``check_snapshot`` of the tip, on a store just opened, as
  a command's transaction meets it), next to an empty transaction without it (its writer lock,
  branch and session: the transaction's other work);
- a reader's checks, on a repository opened afresh each time: ``readonly_session``
  (``expect``), the root group (``check_groups``) and the arrays a one-query sample opens
  (``check_array``: ``points``, ``sketch``, ``sketch_residual``, ``ids``, ``alive`` and the
  ``lsh`` arrays) through ``fairpipe.storage.arrays``, next to the same session, group and arrays opened
  through zarr on ``session.store`` (no checks, and no manifest read); and a cold one-query
  ``fairpipe sample`` (a fresh process, the check functions wrapped with a timer): the time
  inside the checks, next to the process's wall time;
- the record's size (``json.dumps`` of the ingest commit's ``fairpipe_manifests`` entry) next to
  the size of the snapshot file that holds it;
- ``verify_history`` of the whole history of ``main`` (what ``fairpipe verify`` adds for
  manifests and snapshots), next to ``fairpipe.storage.integrity.verify_store``, which runs it and then
  reads every chunk of the tip.

The forgets run last: their erasure (the store's default retention, 0) expires the history.
Nothing is asserted: the figures are printed. About a minute at the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fairpipe.storage.manifests as manifests  # noqa: E402
from fairpipe.storage.arrays import open_array, open_group, read_array  # noqa: E402
from fairpipe.storage.chunks import zarr_api  # noqa: E402
from fairpipe.storage.snapshot_checks import check_snapshot, verify_history  # noqa: E402
from fairpipe.storage.store import FairpipeStore  # noqa: E402
from fairpipe.storage.urls import make_storage, parse_store_url  # noqa: E402
from fairpipe.storage.writes import write_rows  # noqa: E402

# The arrays a cold one-query sample opens (each checked once: check_array).
SAMPLE_ARRAYS = ("ids", "alive", "points", "sketch", "sketch_residual", "lsh/projections",
                 "lsh/offsets", "lsh/multipliers", "lsh/segments", "lsh/segment_lengths")  # fmt: skip

# A cold `fairpipe sample` in a fresh process, fairpipe.storage.manifests' checks wrapped with a timer;
# the time inside them is written to argv[2] as the program exits (it ends with os._exit).
COLD_SAMPLE = """
import os, sys, time
store, out, row = sys.argv[1:4]
import fairpipe.storage.light as light
import fairpipe.storage.manifests as m
spent, depth = [0.0], [0]
def timed(fn):
    def wrapper(*args, **kwargs):
        depth[0] += 1
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent[0] += time.perf_counter() - t
    return wrapper
for name in ("expect", "check_groups", "check_array"):
    setattr(m, name, timed(getattr(m, name)))
light.expect, light.check_groups = m.expect, m.check_groups
real_exit = os._exit
def leave(code):
    with open(out, "w") as f:
        f.write(f"{spent[0]} {code}")
    real_exit(code)
os._exit = leave
sys.argv = ["fairpipe", "sample", "--store", store, "--query-row", row, "--n-samples", "10",
            "--json"]
from fairpipe.flows.cli import main
main()
"""


class Commits:
    """Each commit made through ``fairpipe.storage.manifests.commit`` while installed: (message,
    seconds in ``record_for``, seconds of the whole commit)."""

    def __init__(self) -> None:
        self.made: list[tuple[str, float, float]] = []
        self._record = 0.0

    @contextlib.contextmanager
    def installed(self):
        record_for, commit = manifests.record_for, manifests.commit

        def timed_record(*args, **kwargs):
            t = time.perf_counter()
            try:
                return record_for(*args, **kwargs)
            finally:
                self._record = time.perf_counter() - t

        def timed_commit(repo, session, message, metadata=None):
            t = time.perf_counter()
            snapshot = commit(repo, session, message, metadata)
            self.made.append((message, self._record, time.perf_counter() - t))
            return snapshot

        manifests.record_for, manifests.commit = timed_record, timed_commit
        try:
            yield self
        finally:
            manifests.record_for, manifests.commit = record_for, commit


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def every_array_record(store: FairpipeStore) -> float:
    """``record_for`` on a writable session at the tip, its parent's record hidden: every
    array and group listed."""
    session = store.repo.writable_session("main")
    parent_record = manifests.parent_record
    manifests.parent_record = lambda repo, snapshot_id: None
    try:
        return timed(manifests.record_for, store.repo, session, "every array")
    finally:
        manifests.parent_record = parent_record


def rewrite_chunk(store: FairpipeStore, values: np.ndarray) -> None:
    with store.transaction("bench: one chunk of points rewritten") as txn:
        write_rows(txn.session, "points", 0, values)


def empty_transaction(store: FairpipeStore) -> None:
    with store.transaction("bench: nothing written"):
        pass


def checked_open(path: str, arrays: list[str]) -> float:
    """A fresh repository's read-only session, root group and ``arrays``, opened as a reader
    opens them (checked); the seconds after the repository's own open."""
    spec = parse_store_url(path)
    repo = fresh_repo(path, spec)
    manifests._EXPECTED.clear()  # a fresh process has checked nothing
    t = time.perf_counter()
    store = FairpipeStore(path, repo, spec)
    session = store.readonly_session()
    open_group(session)
    for name in arrays:
        open_array(session, name)
    return time.perf_counter() - t


def plain_open(path: str, arrays: list[str]) -> float:
    """The same through zarr on ``session.store``: no checks."""
    zarr = zarr_api()
    repo = fresh_repo(path, parse_store_url(path))
    t = time.perf_counter()
    session = repo.readonly_session(branch="main")
    zarr.open_group(session.store, mode="r")
    for name in arrays:
        zarr.open_array(session.store, path=name, mode="r")
    return time.perf_counter() - t


def fresh_repo(path: str, spec):
    import icechunk

    return icechunk.Repository.open(make_storage(path, spec))


def cold_sample(path: str, out: Path, query_row: int) -> tuple[float, float]:
    """(seconds inside the checks, wall seconds) of a cold one-query ``fairpipe sample``."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", COLD_SAMPLE, path, str(out), str(query_row)],
                   capture_output=True, check=True, cwd=ROOT)  # fmt: skip
    wall = time.perf_counter() - t
    spent, code = out.read_text().split()
    if code != "0":
        raise RuntimeError(f"fairpipe sample exited {code}")
    return float(spent), wall


def best_commits(made: list[tuple[str, float, float]], of: str) -> tuple[str, str, str]:
    """(the least time in ``record_for``, the least of the rest of the commit, what that is)."""
    return ms(min(r for _, r, _ in made)), ms(min(c - r for _, r, c in made)), of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from fairpipe.flows.forget import run_forget
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import ForgetOptions, IngestOptions
    from fairpipe.storage.integrity import verify_store

    reps = range(args.repeat)
    rng = np.random.default_rng(0)
    commits = Commits()
    # (what, figure, baseline, what the baseline is), printed at the end in this order
    rows: dict[str, tuple[str, str, str]] = dict.fromkeys(
        ["ingest", "every", "chunk", "forget", "base", "reader", "cold", "size", "verify"],
        ("", "", ""),
    )
    names: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "s")
        t = time.perf_counter()
        with commits.installed():
            run_ingest("gaussian", path, IngestOptions(gaussian={"n": args.rows, "d": args.d}),
                       n_workers=1, processes=False)  # fmt: skip
        ingest_s = time.perf_counter() - t
        made = commits.made
        names["ingest"] = f"record: the ingest's {len(made)} commits (once)"
        rows["ingest"] = (ms(sum(r for _, r, _ in made)), ms(sum(c - r for _, r, c in made)),
                          "Icechunk's commits")  # fmt: skip

        store = FairpipeStore.open(path)
        tip = store.repo.lookup_branch("main")
        record = store.repo.lookup_snapshot(tip).metadata[manifests.RECORD_KEY]
        snapshot_file = Path(path) / "snapshots" / tip  # the ingest's
        names["every"] = "record: every array listed"
        walk = min(timed(manifests._nodes, store.repo.writable_session("main")) for _ in reps)
        rows["every"] = (ms(min(every_array_record(store) for _ in reps)), ms(walk),
                         "of which zarr's walk of the nodes")  # fmt: skip

        session = store.readonly_session()
        block = int(open_array(session, "points").chunks[0])
        values = read_array(session, "points", slice(0, block))
        commits.made = []
        with commits.installed():
            for _ in reps:
                rewrite_chunk(store, values)
        names["chunk"] = "record: one chunk of points rewritten"
        rows["chunk"] = best_commits(commits.made, "Icechunk's commit")

        checks, empties = [], []
        for _ in reps:
            opened = FairpipeStore.open(path)  # as a command opens it (expect, check_groups)
            tip = opened.repo.lookup_branch("main")
            checks.append(timed(check_snapshot, opened, tip))
            opened = FairpipeStore.open(path)
            opened._published = tip  # (its base check skipped)
            empties.append(timed(empty_transaction, opened))
        names["base"] = "base check (check_snapshot)"
        rows["base"] = (ms(min(checks)), ms(min(empties)), "an empty transaction without it")

        arrays = [a for a in SAMPLE_ARRAYS if a in record["arrays"]]
        checked, plain = [], []
        for _ in reps:
            checked.append(checked_open(path, arrays))
            plain.append(plain_open(path, arrays))
        names["reader"] = f"reader: session, root, {len(arrays)} arrays"
        rows["reader"] = (ms(min(checked)), ms(min(plain)), "the same opened through zarr")

        out = Path(tmp) / "spent"
        cold = [cold_sample(path, out, int(r)) for r in rng.integers(0, args.rows, args.repeat)]
        names["cold"] = "cold fairpipe sample: in the checks"
        rows["cold"] = (ms(min(c for c, _ in cold)), ms(min(w for _, w in cold)),
                        "the process's wall time")  # fmt: skip

        names["size"] = "record size (JSON)"
        rows["size"] = (f"{len(json.dumps(record).encode())} B",
                        f"{snapshot_file.stat().st_size} B", "the ingest's snapshot file")  # fmt: skip

        history, whole = [], []
        for _ in reps:
            opened = FairpipeStore.open(path)
            tip = opened.repo.lookup_branch("main")
            history.append(timed(verify_history, opened, tip))
            whole.append(timed(verify_store, FairpipeStore.open(path)))
        n_snapshots = verify_history(store, tip)["snapshots"]
        names["verify"] = f"verify_history ({n_snapshots} snapshots)"
        rows["verify"] = (ms(min(history)), ms(min(whole)), "verify_store (with it)")

        # Last: a forget's erasure (at the store's default retention, 0) expires the history.
        ids = read_array(store.readonly_session(), "ids")
        commits.made = []
        with commits.installed():
            for _ in reps:
                forgotten = rng.choice(ids, size=2, replace=False)
                ids = np.setdiff1d(ids, forgotten)
                before = len(commits.made)
                run_forget(path, ids=forgotten.tolist(), options=ForgetOptions(), n_workers=1,
                           processes=False)  # fmt: skip
                del commits.made[before + 1 :]  # its batch's commit (not its receipts' ones)
        names["forget"] = "record: 2-id forget"
        rows["forget"] = best_commits(commits.made, "Icechunk's commit")

    print(f"{args.rows} rows, d = {args.d} (ingest {ingest_s:.1f} s): {len(record['arrays'])} "
          f"arrays, {len(record['groups'])} groups, {record['chunks']} chunks; "
          f"best of {args.repeat}")  # fmt: skip
    print(f"  {'':<40} {'figure':>10}  {'baseline':>10}  baseline")
    for key, (figure, baseline, of) in rows.items():
        print(f"  {names[key]:<40} {figure:>10}  {baseline:>10}  {of}")


if __name__ == "__main__":
    main()
