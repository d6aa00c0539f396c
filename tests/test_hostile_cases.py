"""A hostile user's cases, each run through the ``fairpipe`` program as a user would (a process of
its own): paths that escape or nest, hostile objects in the queue and in JSON inputs, lookalike
digits, damaged metadata, closed and broken streams, special files, a shared PREFECT_HOME, and a
refused forget. Each checks the exit code, the one line on stderr, and that nothing changed or
was created.

benchmarks/bench_hostile.py runs many more random faults than fit in a test run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.cli.test_filesystems import mounts  # noqa: F401 (a fixture: tmpfs mounts)
from tests.storage.test_manifests import drop_chunk_reference, manifest_file

BIN = Path(sys.executable).parent
N, D = 600, 4
FIRST_ID = 200_000


# -- the program, as a user runs it -----------------------------------------------------------------
def fairpipe(*args, env: dict, timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    """``fairpipe ARGS`` in a process of its own, its output captured as text."""
    return subprocess.run([str(BIN / "fairpipe"), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout, **popen)  # fmt: skip


def one_error(out: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """Assert that the command exited ``code`` with one line on stderr, ``error: ...`` holding
    each of ``words``, nothing on stdout and no traceback; return the line."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert out.stdout == "", out.stdout
    return lines[0]


def tree_state(*folders: Path) -> dict[str, str]:
    """Every entry under ``folders`` (links not followed): its kind and, for a file, a digest of
    its bytes. Equal before and after a command: it changed and created nothing there."""
    state: dict[str, str] = {}
    for folder in folders:
        if not os.path.lexists(folder):
            state[str(folder)] = "absent"
            continue
        for root, dirs, files in os.walk(folder):
            for name in dirs + files:
                path = Path(root) / name
                if path.is_symlink():
                    state[str(path)] = "link to " + os.readlink(path)
                elif path.is_dir():
                    state[str(path)] = "folder"
                elif path.is_file():
                    state[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    state[str(path)] = "special"
    return state


# -- the store every case starts from ----------------------------------------------------------------
@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile-cases")


@pytest.fixture(scope="module")
def env(prefect_server, work) -> dict:
    """The commands' environment: the session's Prefect server, cache and HOME of their own."""
    (work / "home").mkdir(exist_ok=True)
    return {**os.environ, "PREFECT_API_URL": prefect_server, "XDG_CACHE_HOME": str(work / "cache"),
            "HOME": str(work / "home")}  # fmt: skip


@pytest.fixture(scope="module")
def source(work) -> Path:
    """A table of N people: an id column, a group column, D features."""
    g = np.random.default_rng(0)
    frame = pd.DataFrame(
        g.normal(size=(N, D)).astype(np.float32), columns=[f"x{i}" for i in range(D)]
    )
    frame.insert(0, "id", np.arange(FIRST_ID, FIRST_ID + N))
    frame["group"] = g.integers(0, 2, size=N)
    frame.to_csv(work / "people.csv", index=False)
    return work / "people.csv"


@pytest.fixture(scope="module")
def base(prefect_server, source, work) -> Path:
    """A store ingested, fitted and summarized (in this process, on threads): copy it with
    :func:`copy_of` before a case that may change it."""
    from fairpipe.flows.fit import run_fit
    from fairpipe.flows.ingest import run_ingest
    from fairpipe.flows.options import FitOptions, IngestOptions, SummarizeOptions
    from fairpipe.flows.summarize import run_summarize

    store = work / "base"
    threads = dict(n_workers=1, processes=False)
    run_ingest(str(source), str(store), IngestOptions(id_column="id", group_column="group",
                                                      n_tables=4, chunk_rows=128, seed=1),
               **threads)  # fmt: skip
    run_fit(str(store), FitOptions(n_clusters=3, height=2), **threads)
    run_summarize(
        str(store), SummarizeOptions(k=6, lower=0.2, upper=0.8, fanout=4, height=2), **threads
    )
    return store


def copy_of(base: Path, where: Path) -> Path:
    """A copy of the store ``base`` at ``where`` (a case's own)."""
    shutil.copytree(base, where)
    return where


# == paths that escape or nest =======================================================================
INGEST = ["--id-column", "id", "--group-column", "group", "--workers", "1"]


@pytest.mark.parametrize("inner", ["inner", "chunks/x", "queue", "refs/deeper/still"])
def test_a_store_is_never_made_inside_another(env, base, source, work, inner):
    before = tree_state(base)
    out = fairpipe("ingest", source, "--store", base / inner, *INGEST, env=env)
    one_error(out, 2, f"is inside the store {base};")
    assert tree_state(base) == before


def test_erasure_never_collects_a_store_made_inside_another_by_hand(env, base, work):
    """A store inside another's chunks folder (made by hand, or by a release that allowed it):
    the outer store's drain refuses to garbage-collect over it, and the inner store is intact."""
    from fairpipe.storage.store import FairpipeStore

    store = copy_of(base, work / "holds-a-store")
    inner = store / "chunks" / "x"
    with FairpipeStore.creating(str(work / "inner-made-elsewhere")):
        pass
    shutil.move(work / "inner-made-elsewhere", inner)
    before = tree_state(inner)
    out = fairpipe("forget", "--store", store, "--ids", FIRST_ID + 5, env=env)
    one_error(out, 2, "holds the folder chunks/x, which is not the store's")
    assert tree_state(inner) == before


def test_a_dangling_link_as_the_store_makes_nothing_where_it_points(env, source, work):
    link, target = work / "dangling", work / "elsewhere" / "target"
    link.symlink_to(target)
    out = fairpipe("ingest", source, "--store", link, *INGEST, env=env)
    one_error(out, 2, "symbolic link", str(link), "names nothing")
    assert not (work / "elsewhere").exists()


@pytest.mark.parametrize("command", ["request-deletion", "forget"])
def test_a_queue_that_links_outside_the_store_is_refused(env, base, work, command):
    store = copy_of(base, work / f"linked-queue-{command}")
    outside = work / f"outside-{command}"
    outside.mkdir()
    (store / "queue").symlink_to(outside)
    before = tree_state(store, outside)
    out = fairpipe(command, "--store", store, "--ids", FIRST_ID, env=env)
    one_error(out, 2, f"{store / 'queue'} is a symbolic link (to {outside})",
              "fairpipe keeps the store's deletion requests there")  # fmt: skip
    assert tree_state(store, outside) == before


def test_a_link_to_a_store_is_the_store(env, base, work):
    link = work / "link-to-base"
    link.symlink_to(base)
    out = fairpipe("status", "--store", link, "--json", env=env)
    assert out.returncode == 0 and '"n": 600' in out.stdout, out.stderr


@pytest.mark.parametrize("command", ["ingest", "info"])
def test_a_loop_of_links_and_an_over_long_name_are_bad_input(env, source, work, command):
    (work / "loop-a").symlink_to(work / "loop-b")
    (work / "loop-b").symlink_to(work / "loop-a")
    long_name = work / "parent" / ("n" * 300) / "store"
    for store, words in ((work / "loop-a", "loop of symbolic links"),
                         (work / "loop-a" / "store", "loop of symbolic links"),
                         (long_name, "a name of 300 bytes")):  # fmt: skip
        before = tree_state(work / "parent")
        args = ("ingest", source, "--store", store, *INGEST) if command == "ingest" else (
            "info", "--store", store)  # fmt: skip
        one_error(fairpipe(*args, env=env), 2, words)
        assert tree_state(work / "parent") == before  # absent: nothing made on the way
    (work / "loop-a").unlink()
    (work / "loop-b").unlink()


# == hostile objects ===================================================================================
# Nested 200,000 deep, past the parser's recursion limit: as arrays, and as objects.
DEEP_ARRAY = b"[" * 200_000 + b"]" * 200_000
DEEP_OBJECT = b'{"a":' * 200_000 + b"1" + b"}" * 200_000
TOO_DEEP = "it nests arrays and objects 200,000 deep, over 64"


def test_deeply_nested_queue_objects_are_set_aside_and_the_drain_applies_the_rest(env, base, work):
    from fairpipe.storage.queue import file_request

    store = copy_of(base, work / "deep-queue")
    good = sorted([file_request(str(store), np.array([FIRST_ID + 10, FIRST_ID + 11])).request_id,
                   file_request(str(store), np.array([FIRST_ID + 12])).request_id])  # fmt: skip
    hostile = {"20261127T000000000000Z-deeparray.json": DEEP_ARRAY,
               "20261127T000000000001Z-deepobject.json": DEEP_OBJECT}  # fmt: skip
    for name, data in hostile.items():
        (store / "queue" / name).write_bytes(data)
    out = fairpipe("forget", "--store", store, "--json", env=env)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    result = json.loads(out.stdout)
    assert sorted(result["requests"]) == good
    assert sorted(result["deleted"]) == [FIRST_ID + 10, FIRST_ID + 11, FIRST_ID + 12]
    assert {n["object"] for n in result["set_aside"]} == set(hostile)
    assert os.listdir(store / "queue") == []
    # In the quarantine, as they were, each with a note saying why.
    status = json.loads(fairpipe("status", "--store", store, "--json", env=env).stdout)
    notes = {n["object"]: n for n in status["set_aside"]["objects"]}
    assert set(notes) == set(hostile)
    for name, data in hostile.items():
        assert TOO_DEEP in notes[name]["why"] and str(store / "queue" / name) in notes[name]["why"]
        assert (store / "quarantine" / notes[name]["moved_to"]).read_bytes() == data
    again = json.loads(fairpipe("forget", "--store", store, "--json", env=env).stdout)
    assert again["requests"] == [] and again["set_aside"] == []  # nothing left, nothing twice


@pytest.mark.parametrize("command", ["summarize", "rerank"])
def test_a_deeply_nested_json_input_is_refused_at_once(env, base, work, command):
    """A bounds file and a desired distribution go through the same bounded parser."""
    deep = work / f"deep-{command}.json"
    deep.write_bytes(DEEP_OBJECT)
    candidates, out_file = work / "deep-candidates.csv", work / "deep-ranked.csv"
    candidates.write_text("list,score,group\n1,0.9,0\n1,0.8,1\n")
    args = {"summarize": ("summarize", "--store", base, "--k", 6, "--bounds", deep),
            "rerank": ("rerank", candidates, "--out", out_file, "--k", 2, "--desired", deep)}  # fmt: skip
    before = tree_state(base, work / "deep-ranked.csv", work / "deep-ranked.metrics.csv")
    one_error(fairpipe(*args[command], env=env), 2, str(deep), TOO_DEEP)
    assert tree_state(base, work / "deep-ranked.csv", work / "deep-ranked.metrics.csv") == before


@pytest.mark.parametrize("command", ["request-deletion", "forget", "status"])
def test_a_queue_that_is_a_file_is_named_and_left_alone(env, base, work, command):
    store = copy_of(base, work / f"queue-is-a-file-{command}")
    (store / "queue").write_text("not a folder")
    args = {"request-deletion": ("request-deletion", "--store", store, "--ids", FIRST_ID + 1),
            "forget": ("forget", "--store", store),
            "status": ("status", "--store", store)}  # fmt: skip
    before = tree_state(store)
    one_error(fairpipe(*args[command], env=env), 2,
              f"{store / 'queue'} is not a folder: fairpipe keeps the store's deletion requests")  # fmt: skip
    assert tree_state(store) == before


# == lookalike digits and the numbers users type =======================================================
# Text that Python's int() reads as 200000 (or as a list of ids) but the rule of ids refuses.
LOOKALIKES = {
    "fullwidth": ("２０００００", "digits other than ASCII 0-9"),
    "arabic-indic": ("٢٠٠٠٠٠", "digits other than ASCII 0-9"),
    "underscore": ("200_000", "holds '_'"),
    "signed": (" +200000 ", "has a '+' sign"),
    "empty items": (",,", "is empty"),
    "an empty item": ("200000,,200001", "Item 2 of the 3"),
}


@pytest.mark.parametrize("command", ["show", "request-deletion", "forget"])
@pytest.mark.parametrize("case", list(LOOKALIKES))
def test_ids_are_ascii_digits_only(env, base, command, case):
    text, words = LOOKALIKES[case]
    before = tree_state(base)
    one_error(fairpipe(command, "--store", base, "--ids", text, env=env), 2, words)
    assert tree_state(base) == before  # no request filed, nothing erased


def test_an_ids_file_and_an_id_column_in_other_digits_are_refused(env, base, source, work):
    ids_file = work / "arabic-ids.txt"
    ids_file.write_text(f"{FIRST_ID}\n٢٠٠٠٠١\n", encoding="utf-8")
    before = tree_state(base)
    one_error(fairpipe("forget", "--store", base, "--ids-file", ids_file, env=env), 2,
              "on line 2 of arabic-ids.txt", "digits other than ASCII 0-9")  # fmt: skip
    table = pd.read_csv(source, dtype=str)
    table.loc[35, "id"] = "２０００３５"
    table.to_csv(work / "fullwidth.csv", index=False)
    out = fairpipe("ingest", work / "fullwidth.csv", "--store", work / "fullwidth-store",
                   *INGEST, env=env)  # fmt: skip
    one_error(out, 2, "２０００３５", "digits other than ASCII 0-9")
    assert not (work / "fullwidth-store").exists() and tree_state(base) == before


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["sample", "--query-id", FIRST_ID, "--n-samples", "５"], "--n-samples option"),
        (["sample", "--query-id", FIRST_ID, "--radius", "１.５"], "--radius option"),
        (["sample", "--query-id", FIRST_ID, "--radius", "1_0"], "holds '_'"),
        (["sample", "--query-row", "9223372036854775808"], "Query row 9223372036854775808 is"),
        (["sample", "--query-id", "２００００１"], "--query-id option"),
        (["configure", "--erasure-retention", "７d"], "digits other than ASCII 0-9"),
        (["configure", "--erasure-retention", "1 h"], "without spaces"),
        (["fit", "--n-clusters", " 3"], "has spaces around it"),
    ],
    ids=lambda v: " ".join(map(str, v)) if isinstance(v, list) else "",
)
def test_every_number_a_user_types_is_ascii(env, base, args, words):
    before = tree_state(base)
    one_error(fairpipe(args[0], "--store", base, *args[1:], env=env), 2, words)
    assert tree_state(base) == before


# == damaged metadata ===================================================================================
# A manifest that decodes yet lists a chunk fewer is made by Icechunk itself, in a copy
# (tests.storage.test_manifests.drop_chunk_reference); the other damage is bytes flipped or cut.
QUERY = ("--query-id", FIRST_ID + 3)


def snapshots_of(store: Path) -> list[str]:
    """The snapshots of ``main``, newest first."""
    from fairpipe.storage.store import FairpipeStore

    return [h["id"] for h in FairpipeStore.open(str(store)).history()]


def cut(file: Path, keep: int | None = None, flip: int = 0, at: int | None = None) -> None:
    """Keep the first ``keep`` bytes of ``file`` (default: all but 40), or flip ``flip`` bytes
    from ``at`` (default: its middle, past Icechunk's header, inside its compressed body)."""
    data = file.read_bytes()
    if flip:
        at = max(40, len(data) // 2 - flip // 2) if at is None else at
        data = data[:at] + bytes(b ^ 0xFF for b in data[at : at + flip]) + data[at + flip :]
        file.write_bytes(data)
    else:
        file.write_bytes(data[: len(data) - 40 if keep is None else keep])


def damaged_in_report(out: subprocess.CompletedProcess, *words: str) -> None:
    """``verify`` found damage: exit 4, its report on stdout naming ``words``, nothing on
    stderr (but the end of its progress bar)."""
    assert out.returncode == 4 and out.stderr.strip() == "", (out.stdout, out.stderr)
    lines = [line for line in out.stdout.splitlines() if line.startswith("damaged: ")]
    assert lines and all(any(w in line for line in lines) for w in words), out.stdout


@pytest.mark.parametrize(("array", "key"), [("points", "c/1/0"), ("lsh/segments", "c/1/0/0"),
                                           ("lsh/offsets", "c/0")])  # fmt: skip
def test_a_chunk_reference_a_manifest_dropped_is_exit_4_never_zeros(env, base, work, array, key):
    """A manifest that still decodes but no longer lists one chunk (the chunk would read as its
    fill value: points of zeros, an empty bucket, hash offsets of zero: another neighbourhood):
    verify names the array, readers and writers exit 4."""
    store = copy_of(base, work / f"dropped-{array.replace('/', '-')}")
    drop_chunk_reference(store, array, key)
    damaged_in_report(fairpipe("verify", "--store", store, env=env),
                      f"The manifest of array '{array}'", "lists")  # fmt: skip
    before = tree_state(store)
    for command in (["sample", *QUERY], ["sample", *QUERY, "--mode", "buckets"],
                    ["show", "--ids", FIRST_ID + 150]):  # fmt: skip
        out = fairpipe(*command, "--store", store, env=env)
        if array.startswith("lsh/") and command[0] == "show":
            assert out.returncode == 0, out.stderr  # show reads no index
            continue
        one_error(out, 4, f"The manifest of array '{array}' in the store {store} is damaged",
                  "chunks where commit", "fairpipe verify --store")  # fmt: skip
    one_error(fairpipe("forget", "--store", store, "--ids", FIRST_ID + 9, env=env), 4, array)
    after = tree_state(store)
    after.pop(str(store / "queue"), None)  # (the forget's queue folder, left empty)
    assert after == before


@pytest.mark.parametrize("how", ["truncated", "flipped"])
def test_a_manifest_icechunk_cannot_read_is_exit_4(env, base, work, how):
    store = copy_of(base, work / f"manifest-{how}")
    cut(manifest_file(store, "points"), **({"keep": 60} if how == "truncated" else {"flip": 16}))
    damaged_in_report(fairpipe("verify", "--store", store, env=env), "points")
    one_error(fairpipe("sample", "--store", store, *QUERY, env=env), 4, "'points'", str(store))


@pytest.mark.parametrize("how", ["truncated", "flipped", "format version"])
def test_a_damaged_current_snapshot_is_exit_4_for_every_reader(env, base, work, how):
    store = copy_of(base, work / f"tip-{how}")
    tip = snapshots_of(store)[0]
    if how == "format version":  # the byte after Icechunk's magic and implementation name
        data = bytearray((store / "snapshots" / tip).read_bytes())
        data[36] ^= 0x08
        (store / "snapshots" / tip).write_bytes(bytes(data))
    else:
        # Flipped at the start of the compressed body (its frame header), which no decoder
        # reads past: bytes flipped in a body's middle may still decode, into another snapshot.
        cut(store / "snapshots" / tip, **({} if how == "truncated" else {"flip": 16, "at": 40}))
    for command in (["verify"], ["info"], ["sample", *QUERY], ["history"]):
        one_error(fairpipe(*command, "--store", store, env=env), 4,
                  f"Snapshot {tip} in the store {store} is damaged")  # fmt: skip


def test_a_damaged_ancestor_snapshot_is_found_by_verify_and_the_history(env, base, work):
    """An older snapshot cut short: verify reports it (exit 4), the history cannot be shown
    (exit 4); a query of the current snapshot, which reads none of it, answers as before."""
    store = copy_of(base, work / "ancestor")
    want = fairpipe("sample", "--store", store, *QUERY, "--seed", 3, "--json", env=env)
    ancestor = snapshots_of(store)[1]
    cut(store / "snapshots" / ancestor)
    damaged_in_report(fairpipe("verify", "--store", store, env=env), f"Snapshot {ancestor}")
    one_error(fairpipe("info", "--store", store, env=env), 4, f"Snapshot {ancestor}")
    got = fairpipe("sample", "--store", store, *QUERY, "--seed", 3, "--json", env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["queries"] == json.loads(want.stdout)["queries"]


def test_the_rank_sampler_over_a_damaged_chunk_exits_4_never_by_a_signal(env, base, work):
    """The campaign's crash: a query whose load meets a damaged chunk of points printed its
    error, then died by SIGABRT or SIGSEGV (a fetch still in flight met the interpreter's
    teardown). Eight queries at once, each reading every chunk: each exits 4 with one line."""
    from tests.storage.test_integrity import damage, stored_chunks

    store = copy_of(base, work / "rank-damaged")
    damage(store, stored_chunks(store)[("points", (2, 0))])  # rows 256-383
    runs = [subprocess.Popen([str(BIN / "fairpipe"), "sample", "--store", str(store),
                              "--query-id", str(FIRST_ID + 7 * i), "--mode", "buckets",
                              "--sampler", "rank"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for i in range(8)]  # fmt: skip
    for run in runs:
        stdout, stderr = run.communicate(timeout=120)
        done = subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)
        one_error(done, 4, "Chunk (2, 0) of array 'points'", str(store))


# == streams and special files ==========================================================================
def test_a_closed_stdout_discards_the_result_and_the_command_still_works(env, base):
    out = subprocess.run(f"{BIN / 'fairpipe'} info --store {base} >&-", shell=True, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr


@pytest.mark.parametrize("args", [["history"], ["info"], ["history", "--json"]])
def test_a_reader_gone_from_stdout_ends_the_command_quietly(env, base, args):
    """``fairpipe history | head -n1``: the reader is gone before the result is out (here it
    closes the pipe at once); the command ends with 141, as a command ended by SIGPIPE does,
    and says nothing."""
    proc = subprocess.Popen([str(BIN / "fairpipe"), args[0], "--store", str(base), *args[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)  # fmt: skip
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


def test_a_full_stdout_names_stdout_not_the_store(env, base):
    with open("/dev/full", "w") as full:
        out = subprocess.run([str(BIN / "fairpipe"), "info", "--store", str(base), "--json"],
                             stdout=full, stderr=subprocess.PIPE, env=env, text=True,
                             timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == ("error: Cannot write the result to standard output: No space left "
                          "on device.\n")  # fmt: skip


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_source_or_ids_file_that_is_not_a_file_is_refused_at_once(env, base, work, kind):
    special = work / f"special-{kind}.csv"
    if kind == "fifo":
        os.mkfifo(special)
    else:
        special.symlink_to("/dev/zero")
    what = "named pipe (FIFO)" if kind == "fifo" else "character device"
    before = tree_state(base)
    out = fairpipe("ingest", special, "--store", work / f"from-{kind}", *INGEST, env=env,
                   timeout=30)  # fmt: skip
    one_error(out, 2, f"SOURCE {special} is a {what}")
    out = fairpipe("forget", "--store", base, "--ids-file", special, env=env, timeout=30)
    one_error(out, 2, f"--ids-file {special} is a {what}")
    assert not (work / f"from-{kind}").exists() and tree_state(base) == before
    special.unlink()


def test_an_unusable_prefect_home_is_one_line(env, base, work):
    home = work / "prefect-home-file"
    home.write_text("not a folder")
    alone = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    out = fairpipe("fit", "--store", base, env={**alone, "PREFECT_HOME": str(home)}, timeout=60)
    one_error(out, 2, f"PREFECT_HOME is {home}, which is not a folder")


# == two terminals, one PREFECT_HOME =====================================================================
def test_two_creators_on_a_new_prefect_home_one_wins_the_other_is_told_busy(env, source, work):
    """One user, two terminals, a new PREFECT_HOME and no Prefect server: both commands start a
    server of their own on one new database, and both try to make the same new store. One
    makes it; the other waits for the first server to make the database (never two at once:
    no database errors), then finds the store made meanwhile: exit 3, one line."""
    home, store = work / "shared-prefect-home", work / "two-terminals"
    alone = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    alone["PREFECT_HOME"] = str(home)
    args = [str(BIN / "fairpipe"), "ingest", str(source), "--store", str(store), *INGEST]
    first = subprocess.Popen(args, env=alone, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    second = subprocess.Popen(args, env=alone, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    outs = [(p.wait(timeout=240), *p.communicate()) for p in (first, second)]
    codes = sorted(code for code, _, _ in outs)
    assert codes == [0, 3], outs
    (loser,) = [err for code, _, err in outs if code == 3]
    assert len(loser.splitlines()) == 1 and loser.startswith(f"error: Store {store}"), loser
    (winner,) = [err for code, _, err in outs if code == 0]
    assert "Traceback" not in winner and "ERROR" not in winner, winner


# == a refused forget ===================================================================================
def queued(store: Path) -> list[str]:
    folder = store / "queue"
    return sorted(os.listdir(folder)) if folder.exists() else []


def hold_lock(store: Path) -> int:
    """Hold the store's writer lock from this process (another writer at work); returns the fd
    (closing it releases the lock)."""
    import fcntl

    fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_forget_refused_as_busy_withdraws_its_request_or_keeps_it_as_told(env, base, work):
    store = copy_of(base, work / "busy-forget")
    fd = hold_lock(store)
    try:
        out = fairpipe("forget", "--store", store, "--ids", f"{FIRST_ID + 1},{FIRST_ID + 2}",
                       env=env)  # fmt: skip
        # Refused before anything starts: no request is filed (nor withdrawn).
        line = one_error(out, 3, "being written by another process")
        assert "request" not in line.lower() and queued(store) == []
        out = fairpipe("forget", "--store", store, "--ids", f"{FIRST_ID + 1}", "--unapplied",
                       "keep", env=env)  # fmt: skip
        line = one_error(out, 3, "stays filed: the next drain applies it")
        (kept,) = queued(store)
        assert kept.removesuffix(".json") in line
    finally:
        os.close(fd)
    status = json.loads(fairpipe("status", "--store", store, "--json", env=env).stdout)
    assert status["pending_requests"]["count"] == 1, status
    assert status["pending_requests"]["oldest"] == kept.removesuffix(".json")


def test_a_forget_that_meets_damage_withdraws_its_request(env, base, work):
    from tests.storage.test_integrity import damage, stored_chunks

    store = copy_of(base, work / "damaged-forget")
    damage(store, stored_chunks(store)[("points", (0, 0))])  # rows 0-127
    before = tree_state(store)
    out = fairpipe("forget", "--store", store, "--ids", f"{FIRST_ID + 3}", env=env)
    one_error(out, 4, "points", "The request for these 1 ids is withdrawn")
    after = tree_state(store)
    assert after.pop(str(store / "queue")) == "folder"  # the queue's folder, left empty
    assert queued(store) == [] and after == before


# == crashes ============================================================================================
def fill(folder: Path) -> None:
    """Take every free byte of the filesystem holding ``folder``."""
    with open(folder / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:  # unbuffered: nothing is left to write when it is closed
            f.write(b"\0" * 4096)


def test_a_request_on_a_full_disk_is_one_line_and_leaves_nothing(env, base, mounts):  # noqa: F811
    """The line, exit 2 (never an abort after it: the program ends without the interpreter's
    teardown), and no temporary file or queue folder left, try after try."""
    folder = mounts("4m")
    store = copy_of(base, folder / "store")
    fill(folder)
    before = tree_state(store)
    ids = ",".join(str(FIRST_ID + i) for i in range(300))
    for _ in range(3):
        out = fairpipe("request-deletion", "--store", store, "--ids", ids, env=env)
        one_error(out, 2, f"No space left on device writing {store} (")
        assert tree_state(store) == before


def test_a_forget_on_a_full_disk_files_nothing_and_says_so(env, base, mounts):  # noqa: F811
    folder = mounts("4m")
    store = copy_of(base, folder / "store")
    fill(folder)
    before = tree_state(store)
    out = fairpipe("forget", "--store", store, "--ids", FIRST_ID + 7, env=env)
    # Refused before anything starts (less room than a commit): no request filed, none to take
    # back.
    line = one_error(out, 2, f"No space left on device writing {store} (")
    assert "request" not in line and tree_state(store) == before


def test_a_radius_beyond_any_float_square_holds_every_point(env, base):
    out = fairpipe("sample", "--store", base, "--query-id", FIRST_ID, "--radius", "1e308",
                   "--n-samples", 5, "--json", env=env)  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr
    (query,) = json.loads(out.stdout)["queries"]
    # Every candidate of its buckets is within r: its neighbourhood is all of them but itself.
    assert query["neighbourhood_size"] == query["candidates"] - 1 and query["drawn"] == 5, query


def test_a_gaussian_larger_than_a_store_holds_is_refused_at_once(env, work):
    store = work / "huge-gaussian"
    out = fairpipe("ingest", "gaussian", "--gaussian-n", 10**13, "--store", store, env=env)
    one_error(out, 2, "The --gaussian-n option", "an integer from 1 to 2147483647",
              "a store indexes at most 2^31 - 1 rows", "Got 10000000000000 instead")  # fmt: skip
    assert not os.path.lexists(store)


def test_a_parquet_column_of_lists_is_named_with_its_type(env, work):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source, store = work / "lists.parquet", work / "lists-store"
    pq.write_table(pa.table({"id": [1, 2], "x0": [0.5, 1.5], "tags": pa.array([[1.0], [2.0, 3.0]]),
                             "group": ["a", "b"]}), source)  # fmt: skip
    out = fairpipe("ingest", source, "--store", store, *INGEST, env=env)
    one_error(out, 2, "Column 'tags' of lists.parquet holds lists (list<element: double>); a "
                      "feature column must hold one number per row.")  # fmt: skip
    assert not os.path.lexists(store)


def rerank_cases(work: Path) -> dict:
    """Candidate tables a rerank refuses: (arguments, the words of its line)."""
    frame = pd.DataFrame({"list": [1, 1, 2, 2], "score": [0.9, 0.8, 0.7, 0.6],
                          "group": ["a", "b", "a", "b"]})  # fmt: skip
    frame.to_csv(work / "ranked-in.csv", index=False)
    (work / "latin1.csv").write_bytes(frame.to_csv(index=False).encode() + b"2,0.5,caf\xe9\n")
    (work / "text.parquet").write_text(frame.to_csv(index=False))
    return {
        "latin-1": ((work / "latin1.csv",), ("latin1.csv is not UTF-8 text: line 6 holds the "
                                             "byte 0xe9. Save it as UTF-8.",)),
        "text named .parquet": ((work / "text.parquet",), ("text.parquet is not a readable "
                                                           "Parquet file (Parquet magic bytes",)),
    }  # fmt: skip


@pytest.mark.parametrize("case", ["latin-1", "text named .parquet"])
def test_rerank_of_a_malformed_table_is_refused_at_once(env, work, case):
    args, words = rerank_cases(work)[case]
    out_file = work / "ranked.csv"
    before = tree_state(out_file, work / "ranked.metrics.csv")
    out = fairpipe("rerank", args[0], "--out", out_file, *args[1:], env=env, timeout=30)
    one_error(out, 2, *words)
    assert tree_state(out_file, work / "ranked.metrics.csv") == before


@pytest.mark.parametrize("command", ["ingest", "audit"])
def test_a_named_data_set_file_that_is_not_utf8_is_named(env, work, command):
    """The named data sets' and the audit's files are read by the same reader as every table."""
    latin = work / "latin1-data.csv"
    latin.write_bytes(b"age,sex,label\n39,0,1\n" + "é,1,0\n".encode("latin-1"))
    store, out_folder = work / "named-latin1-store", work / "named-latin1-audit"
    args = {"ingest": ("ingest", f"mnist:{latin}", "--store", store, "--workers", 1),
            "audit": ("audit", "--dataset", latin, "--protected", "sex", "--out", out_folder)}  # fmt: skip
    one_error(fairpipe(*args[command], env=env), 2,
              "latin1-data.csv is not UTF-8 text: line 3 holds the byte 0xe9")  # fmt: skip
    assert not os.path.lexists(store) and not os.path.lexists(out_folder)


def test_rerank_of_a_k_beyond_every_list_ranks_each_list_whole_at_once(env, work):
    """A k larger than every list (10^12) is each list ranked whole, as a k of its length: the
    work follows the lists, never k."""
    rerank_cases(work)
    runs = {}
    for k in (10**12, 2):
        out = work / f"ranked-k{k}.csv"
        done = fairpipe("rerank", work / "ranked-in.csv", "--out", out, "--k", k, "--json",
                        env=env, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        runs[k] = pd.read_csv(out)
    assert runs[10**12].equals(runs[2])  # both lists hold 2 candidates
