"""Random faults across the commands of a store's life, each followed by what a user would do
next, checked against the same life lived without faults.

One life: ``ingest`` a CSV into a new store, ``ingest`` an append, ``fit``, ``summarize``,
``forget`` (a drain of four filed requests), ``backfill`` (a backlog in parts). It is lived once
without faults (the reference: every object of ``main`` recorded after each step), then
``--episodes`` times with one fault injected into each step, chosen at random:

- ``SIGKILL`` to the command's process group, ``SIGTERM`` to the command, or ``SIGINT`` to the
  group (a Ctrl-C), at a random moment of the step (up to its reference duration); then the step
  is run again;
- the step started twice at once (two creators, two appenders, two fits, two drains...): one
  waits for or is refused by the other's lock (exit 3, its error in one line), and is then run
  again;
- before a drain, hostile objects dropped into its queue (bad JSON, a name that disagrees with
  its content, objects and arrays nested 200,000 deep, a huge object, a folder, a link): the
  drain sets them aside and applies the rest;
- before a step (after the first), damaged metadata: a byte flipped in, or the end cut from, a
  manifest, the current snapshot or an older one, or a manifest made to list one chunk fewer
  (the one an older commit made, as Icechunk wrote it). ``verify``, a query, ``info`` and the
  step itself then each exit 4 with one error line (``verify``: its report), or exit 0 with the
  answer the undamaged store gives (a query, ``info``); never 1, never another answer. Then the
  file is restored (from a copy, as the error line says) and the step is run again.

After each step, checked: nothing of an interrupted command is left running; every exit is 0, 3
(busy), 130 (interrupted), -9 (killed), or 2 for an append rerun that finds its ids already
committed (its rows went in before the signal); a failed command's stderr ends in one error line
and holds no traceback; every
object of ``main`` (receipts aside: they hold times and request ids) equals the reference's after
the same step; no request is left pending; each receipt appears once.

Run: .venv/bin/python benchmarks/bench_hostile.py [--episodes 9] [--n 4000] [--seed 0]
[--faults damaged-metadata,SIGKILL,...]
(about 8 minutes at the defaults: 54 faults). Prints a table and, with --json, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
D = 8


def life(work: Path) -> list[tuple[str, list[str]]]:
    """The steps of a store's life: (name, the command's arguments after the store)."""
    return [
        ("ingest", ["ingest", str(work / "people.csv"), "--id-column", "id", "--group-column",
                    "group", "--n-tables", "10", "--chunk-rows", "512", "--seed", "4"]),
        ("append", ["ingest", str(work / "more.csv"), "--id-column", "id", "--group-column",
                    "group"]),
        ("fit", ["fit", "--n-clusters", "6"]),
        ("summarize", ["summarize", "--k", "8", "--lower", "0.1", "--upper", "0.6"]),
        ("forget", ["forget", "--max-batch", "3"]),
        ("backfill", ["backfill", "--ids-file", str(work / "backlog.txt"), "--batch-size", "20"]),
    ]  # fmt: skip


def argv(step: list[str], store: Path) -> list[str]:
    return [str(BIN / "fairpipe"), step[0], *step[1:2], "--store", str(store), *step[2:],
            "--workers", "1"] if step[0] == "ingest" else [str(BIN / "fairpipe"), step[0],
            "--store", str(store), *step[1:], "--workers", "1"]  # fmt: skip


def write_sources(work: Path, n: int, seed: int) -> None:
    g = np.random.default_rng(seed)
    ids = g.permutation(20 * n)[: n + n // 5] + 100_000
    X = g.normal(size=(ids.size, D)).astype(np.float32)
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(D)])
    frame.insert(0, "id", ids)
    frame["group"] = g.choice(["a", "b", "c"], size=ids.size)
    frame.iloc[:n].to_csv(work / "people.csv", index=False)
    frame.iloc[n:].to_csv(work / "more.csv", index=False)
    gone = g.choice(ids, size=12 + 60, replace=False)
    np.save(work / "requests.npy", gone[:12])
    (work / "backlog.txt").write_text("\n".join(map(str, [*gone[12:], 7, 8])) + "\n")


def file_requests(work: Path, store: Path, env: dict) -> None:
    """Four deletion requests, filed as producers do before the drain."""
    gone = np.load(work / "requests.npy")
    for j in range(4):
        ids = ",".join(map(str, gone[3 * j : 3 * j + 3]))
        out = subprocess.run([str(BIN / "fairpipe"), "request-deletion", "--store", str(store),
                              "--ids", ids, "--reason", f"r{j}"], env=env, capture_output=True,
                             text=True)  # fmt: skip
        assert out.returncode == 0, out.stderr


HOSTILE = {
    "20261127T000000000000Z-aaaaaaaa.json": b'{"request": "20261127T000000000000Z-other", '
    b'"ids": [1], "requested_at": "2026-11-27T00:00:00"}',
    "20261127T000000000001Z-aaaaaaab.json": b'{"request": ',
    "20261127T000000000002Z-aaaaaaac.json": b"\xff\xfe",
    "notes.json": b"{}",
    # Nested past the JSON parser's recursion limit, as objects and as arrays.
    "20261127T000000000005Z-aaaaaaaf.json": b'{"a":' * 200_000 + b"1" + b"}" * 200_000,
    "20261127T000000000006Z-aaaaaab0.json": b"[" * 200_000 + b"]" * 200_000,
}


def drop_hostile(store: Path, rng) -> int:
    queue = store / "queue"
    queue.mkdir(exist_ok=True)
    names = rng.choice(sorted(HOSTILE), size=int(rng.integers(1, len(HOSTILE) + 1)), replace=False)
    for name in names:
        (queue / name).write_bytes(HOSTILE[name])
    extra = int(rng.integers(0, 3))
    if extra >= 1:
        (queue / "20261127T000000000003Z-aaaaaaad.json").mkdir()
    if extra >= 2:
        with open(queue / "20261127T000000000004Z-aaaaaaae.json", "wb") as f:
            f.truncate(40 * 1024 * 1024)
    return len(names) + extra


# What a reader answers, compared with the undamaged store's (times aside).
READERS = [["verify"], ["sample", "--query-row", "7", "--mode", "buckets", "--json"],
           ["info", "--json"]]  # fmt: skip


def comparable(text: str):
    """A command's JSON output without what varies from run to run (timings, times)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("timings", "seconds")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    try:
        return strip(json.loads(text))
    except ValueError:
        return text


def damage_metadata(store: Path, rng) -> tuple[str, list[tuple[Path, bytes]]]:
    """Damage one metadata object of ``store`` at random; returns (what was done, the files and
    their bytes to restore)."""
    from fairpipe.storage.store import FairpipeStore
    from tests.storage.test_manifests import coordinates, drop_chunk_reference, manifest_file

    how = str(rng.choice(["manifest", "tip-snapshot", "older-snapshot", "dropped-reference"]))
    if how == "dropped-reference":  # a manifest Icechunk wrote, listing one chunk fewer
        array = str(rng.choice(["points", "ids", "alive", "lsh/segments"]))
        target = manifest_file(store, array)
        saved = [(target, target.read_bytes())]
        chunk = coordinates(store, array)[0]
        drop_chunk_reference(store, array, "/".join(["c", *map(str, chunk)]))
        return f"{how} of {array}", saved
    history = [h["id"] for h in FairpipeStore.open(str(store)).history()]
    if how == "manifest":
        manifests = sorted((store / "manifests").iterdir())
        target = manifests[int(rng.integers(len(manifests)))]
    elif how == "tip-snapshot" or len(history) < 2:
        target = store / "snapshots" / history[0]
    else:
        target = store / "snapshots" / history[int(rng.integers(1, len(history)))]
    data = target.read_bytes()
    if rng.random() < 0.5:
        at = int(rng.integers(0, len(data)))
        flipped = bytes([data[at] ^ (1 << int(rng.integers(8)))])
        target.write_bytes(data[:at] + flipped + data[at + 1 :])
        return f"{how} byte {at} flipped", [(target, data)]
    target.write_bytes(data[: int(rng.integers(0, len(data)))])
    return f"{how} cut short", [(target, data)]


def damage_outcome(out: subprocess.CompletedProcess, want: str | None) -> str | None:
    """What is wrong with a command's outcome on damaged metadata (None: nothing): exit 4 ending
    in one error line (after progress, which a backfill shows; ``verify``: its report on
    stdout), or exit 0 with the undamaged answer."""
    lines = out.stderr.strip().splitlines()
    if out.returncode == 4:
        report = not lines and ("damaged: " in out.stdout or "corrupt: " in out.stdout)
        ended = bool(lines) and lines[-1].startswith("error: ") and "Traceback" not in out.stderr
        if report or (ended and not out.stdout):
            return None
        return f"exit 4 without one error line: {out.stderr[-300:]}"
    if out.returncode == 0:
        if want is None or comparable(out.stdout) == comparable(want):
            return None
        return "exit 0 with another answer than the undamaged store's"
    return f"exit {out.returncode}: {out.stderr[-300:]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=9)
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--own-servers", action="store_true",
                    help="each command starts its own Prefect server, as with no PREFECT_API_URL")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--faults", default="",
                    help="the kinds of fault to draw from, comma-separated (default: every kind)")  # fmt: skip
    a = ap.parse_args()
    only = {f for f in a.faults.split(",") if f}

    from fairpipe.flows.prefect_api import prefect_api
    from fairpipe.storage.queue import pending
    from fairpipe.storage.receipts import read_receipts
    from fairpipe.storage.store import FairpipeStore
    from tests.flows.test_deploy import stored_objects
    from tests.test_hostile import group_alive

    rng = np.random.default_rng(a.seed)
    work = Path(tempfile.mkdtemp(prefix="fairpipe-hostile-"))
    os.environ["PREFECT_HOME"] = str(work / "prefect-home")
    write_sources(work, a.n, a.seed)
    steps = life(work)

    def receipts_of(store: Path) -> list[tuple]:
        got = read_receipts(FairpipeStore.open(str(store)).readonly_session())
        return sorted((r["n_ids"], tuple(r["not_found"]), r["reason"]) for r in got)

    with prefect_api() as api:
        env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache")}
        if a.own_servers:
            env.pop("PREFECT_API_URL", None)
        else:
            env["PREFECT_API_URL"] = api

        def read(command, store):
            return subprocess.run([str(BIN / "fairpipe"), command[0], "--store", str(store),
                                   *command[1:]], env=env, capture_output=True, text=True,
                                  timeout=900)  # fmt: skip

        def run(step, store, check=True):
            out = subprocess.run(argv(step, store), env=env, capture_output=True, text=True,
                                 timeout=900)  # fmt: skip
            if check and out.returncode != 0:
                raise SystemExit(f"{step[0]} failed ({out.returncode}): {out.stderr}")
            return out

        # The reference life, without faults.
        ref_store, reference, seconds = work / "reference", [], []
        for name, step in steps:
            if name == "forget":
                file_requests(work, ref_store, env)
            t0 = time.perf_counter()
            run(step, ref_store)
            seconds.append(time.perf_counter() - t0)
            reference.append((stored_objects(ref_store), receipts_of(ref_store)))
            print(f"reference {name}: {seconds[-1]:.1f} s", file=sys.stderr)

        faults: Counter = Counter()
        failures: list[str] = []
        codes: Counter = Counter()
        t_start = time.perf_counter()
        for episode in range(a.episodes):
            store = work / f"episode-{episode}" / "store"
            for k, (name, step) in enumerate(steps):
                if name == "forget":
                    file_requests(work, store, env)
                kinds = ["SIGKILL", "SIGTERM", "SIGINT", "twice"]
                if name == "forget":
                    kinds.append("hostile-queue")
                if k > 0:  # a store to damage
                    kinds.append("damaged-metadata")
                if only:  # (none of them at this step: the step alone)
                    kinds = [kind for kind in kinds if kind in only] or ["none"]
                kind = str(rng.choice(kinds))
                faults[kind] += 1
                where = f"episode {episode} {name} ({kind})"
                if kind == "none":
                    pass
                elif kind == "damaged-metadata":
                    sound = {tuple(r): read(r, store) for r in READERS[1:]}
                    wanted = {r: out.stdout for r, out in sound.items() if out.returncode == 0}
                    how, saved = damage_metadata(store, rng)
                    where = f"{where[:-1]}: {how})"
                    for r in READERS:
                        if tuple(r) in sound and tuple(r) not in wanted:
                            continue  # (refused on the sound store too: a forgotten row)
                        out = read(r, store)
                        codes[out.returncode] += 1
                        wrong = damage_outcome(out, wanted.get(tuple(r)))
                        if wrong:
                            failures.append(f"{where} {r[0]}: {wrong}")
                    out = run(step, store, check=False)
                    codes[out.returncode] += 1
                    wrong = damage_outcome(out, None)
                    if wrong and not (out.returncode == 2 and "already in the store" in out.stderr):
                        failures.append(f"{where} {name}: {wrong}")
                    for path, data in saved:  # restored from a copy, as the error line says
                        path.write_bytes(data)
                elif kind == "hostile-queue":
                    dropped = drop_hostile(store, rng)
                    out = run(step, store, check=False)
                    codes[out.returncode] += 1
                    aside = json.loads(subprocess.run(
                        [str(BIN / "fairpipe"), "status", "--store", str(store), "--json"],
                        env=env, capture_output=True, text=True).stdout)["set_aside"]["count"]  # fmt: skip
                    if out.returncode != 0 or aside < dropped:
                        failures.append(f"{where}: exit {out.returncode}, {aside}/{dropped} set "
                                        f"aside: {out.stderr[-300:]}")  # fmt: skip
                elif kind == "twice":
                    procs = [subprocess.Popen(argv(step, store), env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True)
                             for _ in range(2)]  # fmt: skip
                    for p in procs:
                        _, err = p.communicate(timeout=900)
                        codes[p.returncode] += 1
                        # An ingest that starts after the other committed finds its ids there.
                        late = p.returncode == 2 and "already in the store" in err
                        ok = p.returncode in (0, 3) or late
                        # A failure ends in one line (after progress, which a backfill shows).
                        last = err.strip().splitlines()[-1:] if p.returncode else ["error:"]
                        clean = last and last[0].startswith("error:") and "Traceback" not in err
                        if not ok or not clean:
                            failures.append(f"{where}: exit {p.returncode}: {err[-300:]}")
                else:
                    sig = getattr(signal, kind)
                    proc = subprocess.Popen(argv(step, store), env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True,
                                            start_new_session=True)  # fmt: skip
                    try:
                        proc.wait(timeout=float(rng.uniform(0.2, seconds[k])))
                    except subprocess.TimeoutExpired:
                        if sig == signal.SIGTERM:
                            proc.send_signal(sig)
                        else:
                            os.killpg(proc.pid, sig)
                    _, err = proc.communicate(timeout=900)
                    codes[proc.returncode] += 1
                    deadline = time.monotonic() + 20
                    while group_alive(proc.pid) and time.monotonic() < deadline:
                        time.sleep(0.2)
                    if group_alive(proc.pid):
                        failures.append(f"{where}: processes left running")
                        os.killpg(proc.pid, signal.SIGKILL)
                    if proc.returncode not in (0, 130, -9, -2, -15):  # -2, -15: while Python starts
                        failures.append(f"{where}: exit {proc.returncode}: {err[-300:]}")
                # What a user does next: run the step again.
                again = run(step, store, check=False)
                codes[again.returncode] += 1
                committed_before = (
                    name in ("ingest", "append") and "already in the store" in again.stderr
                )
                if again.returncode != 0 and not committed_before:
                    failures.append(
                        f"{where}: the rerun exited {again.returncode}: {again.stderr[-300:]}"
                    )
                objects, receipts = reference[k]
                got = stored_objects(store)
                differing = sorted(
                    x for x in objects.keys() | got.keys() if objects.get(x) != got.get(x)
                )
                if differing:
                    failures.append(
                        f"{where}: {len(differing)} objects differ, e.g. {differing[:3]}"
                    )
                if receipts_of(store) != receipts or pending(str(store)):
                    failures.append(f"{where}: receipts or pending requests differ")
                print(f"{where}: {'ok' if not failures or not failures[-1].startswith(where) else 'FAILED'}",
                      file=sys.stderr)  # fmt: skip
            shutil.rmtree(store.parent, ignore_errors=True)
        elapsed = time.perf_counter() - t_start

    n_faults = sum(faults.values())
    result = {"episodes": a.episodes, "faults": n_faults, "by_kind": dict(faults),
              "exit_codes": {str(k): v for k, v in sorted(codes.items())},
              "failures": failures, "seconds": elapsed,
              "reference_seconds": dict(zip([s for s, _ in steps], seconds))}  # fmt: skip
    rows = [("faults injected", n_faults)]
    rows += [(f"  {kind}", count) for kind, count in sorted(faults.items())]
    rows += [("exit codes seen", ", ".join(f"{k}: {v}" for k, v in sorted(codes.items()))),
             ("checks failed", len(failures)), ("seconds", f"{elapsed:.0f}")]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    for f in failures:
        print(f"FAILED {f}")
    if a.json:
        print(json.dumps(result))
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
