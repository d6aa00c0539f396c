"""The deletion queue drained: requests filed by many producers, drained in batches exactly once, with
receipts; crashes between the steps of a drain; the commands over it."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner
from zarr.errors import ArrayNotFoundError, GroupNotFoundError

from fairpipe.flows.backfill import run_backfill
from fairpipe.flows.cli import app
from fairpipe.flows.forget import _apply_batch, run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import BackfillOptions, ForgetOptions, IngestOptions
from fairpipe.storage.arrays import read_array
from fairpipe.storage.erasure import files_holding, row_needles
from fairpipe.storage.queue import ABANDONED_AFTER_SECONDS, file_request, pending, read_request
from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.store import FairpipeStore

THREADS = dict(n_workers=1, processes=False)
runner = CliRunner()


@pytest.fixture
def store(prefect_server, tmp_path):
    X = np.random.default_rng(0).normal(size=(600, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    opts = IngestOptions(seed=2, n_hashes=3, n_tables=4, bucket_width=2.0, chunk_rows=128)
    run_ingest(str(tmp_path / "x.npy"), str(tmp_path / "s"), opts, **THREADS)
    return str(tmp_path / "s")


def alive_ids(url):
    st = FairpipeStore.open(url)
    s = st.readonly_session()
    return set(read_array(s, "ids")[read_array(s, "alive")].tolist())


def test_many_producers_then_a_drain_in_batches_applies_each_request_once(store):
    filed: list[str] = []

    def produce(k):
        for j in range(5):
            filed.append(file_request(store, np.array([10 * k + j, 10 * k + j + 1000]),
                                      f"producer {k}").request_id)  # fmt: skip

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(filed) == pending(store) and len(set(filed)) == 40  # nothing lost
    res = run_forget(store, None, ForgetOptions(max_batch=20), **THREADS)
    assert len(res["batches"]) == 4 and sorted(res["requests"]) == sorted(filed)
    assert pending(store) == []  # applied objects deleted: their ids live nowhere else
    gone = {10 * k + j for k in range(8) for j in range(5)}
    assert not gone & alive_ids(store) and len(alive_ids(store)) == 600 - 40
    receipts = read_receipts(FairpipeStore.open(store).readonly_session())
    assert sorted(r["request"] for r in receipts) == sorted(filed)
    for r in receipts:
        assert r["n_ids"] == 2 and len(r["not_found"]) == 1 and r["not_found"][0] >= 1000
        assert r["commit"] in {b["commit"] for b in res["batches"]} and r["applied_at"]
        assert r["reason"].startswith("producer ")
    # The commits say which requests they applied, never which ids.
    for snap in FairpipeStore.open(store).history():
        said = snap["message"] + json.dumps(snap["metadata"])
        for request in filed:  # request ids are timestamps: 20261125T115432811000Z holds 1000
            said = said.replace(request, "")
        assert "1000" not in said
    again = run_forget(store, None, **THREADS)  # nothing pending: no commit
    assert again["batches"] == [] and again["commit"] is None


def test_a_crash_after_the_commit_does_not_apply_a_request_twice(store):
    rid = file_request(store, np.array([3, 4])).request_id
    # A drain that committed the batch and died before deleting the request object.
    _apply_batch(FairpipeStore.open(store), [read_request(store, rid)], ForgetOptions())
    head = FairpipeStore.open(store).history()[0]["id"]
    assert pending(store) == [rid]
    res = run_forget(store, None, **THREADS)
    assert res["batches"] == [] and pending(store) == []
    st = FairpipeStore.open(store)
    receipts = read_receipts(st.readonly_session())
    assert [r["request"] for r in receipts] == [rid] and receipts[0]["commit"] == head
    # The rerun only wrote the receipt's commit id, then erased the rows from history.
    assert [h["message"] for h in st.history()[:2]] == ["receipts: erased from history", "receipts"]
    assert len(alive_ids(store)) == 598
    assert 3 not in alive_ids(store)


def test_forget_ids_is_a_request_and_a_drain(store):
    file_request(store, np.array([7]))
    res = run_forget(store, [8, 9], ForgetOptions(reason="ticket 1"), **THREADS)
    assert sorted(res["deleted"]) == [7, 8, 9] and len(res["requests"]) == 2
    receipts = read_receipts(FairpipeStore.open(store).readonly_session())
    assert [r["reason"] for r in receipts] == ["", "ticket 1"]


def test_a_drain_deletes_the_files_of_producers_killed_before_filing(store, tmp_path):
    """A producer killed between writing its temporary file and linking it filed nothing: the
    file is no request (never applied), but it holds ids, so the next drain deletes it once it
    is older than a producer could still be working on it."""
    queue = tmp_path / "s" / "queue"
    file_request(store, np.array([5]))
    old = queue / ".20261124T000000000000Z-deadbeef.json.a1b2c3.tmp"
    young = queue / ".20261124T000001000000Z-cafef00d.json.d4e5f6.tmp"
    for p in (old, young):
        p.write_text(json.dumps({"ids": [6, 7]}))
    past = time.time() - ABANDONED_AFTER_SECONDS - 60
    os.utime(old, (past, past))
    status = json.loads(invoke("status", "--store", store, "--json").stdout)
    assert status["pending_requests"]["count"] == 1 and status["pending_requests"]["abandoned"] == 1
    res = run_forget(store, None, **THREADS)
    assert res["deleted"] == [5] and res["abandoned_removed"] == 1
    assert not old.exists() and young.exists()  # a producer may still be linking the young one
    assert 6 in alive_ids(store) and 7 in alive_ids(store)  # never filed: never applied


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_commands(store, tmp_path):
    out = invoke("request-deletion", "--store", store, "--ids", "1,2,5000", "--reason", "gdpr",
                 "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    rid = json.loads(out.stdout)["request"]
    status = json.loads(invoke("status", "--store", store, "--json").stdout)
    assert status["pending_requests"]["count"] == 1 and status["pending_requests"]["oldest"] == rid
    assert status["n_alive"] == 600
    assert status["layout"] == {"format": 2, "keys": "exact", "sketch": True,
                                "sketch_residual": True, "current": True}  # fmt: skip
    assert "layout: format 2, exact keys\n" in invoke("status", "--store", store).stdout
    assert invoke("forget", "--store", store, "--json").exit_code == 0
    receipts = json.loads(invoke("receipts", "--store", store, "--request", rid, "--json").stdout)
    (r,) = receipts["receipts"]
    assert r["not_found"] == [5000] and r["reason"] == "gdpr" and r["n_ids"] == 3
    status = json.loads(invoke("status", "--store", store, "--json").stdout)
    assert status["pending_requests"]["count"] == 0 and status["n_alive"] == 598
    # Bad input: a clear error (exit 2) and nothing filed.
    (tmp_path / "bad.txt").write_text("1\n2\nx3\n")
    (tmp_path / "empty.txt").write_text("")
    for args, says in (
        (("--ids-file", tmp_path / "bad.txt"), "'x3'"),
        (("--ids-file", tmp_path / "empty.txt"), "holds no ids"),
        (("--ids", "1", "--ids-file", tmp_path / "bad.txt"), "exactly one"),
    ):
        bad = invoke("request-deletion", "--store", store, *args)
        assert bad.exit_code == 2 and says in bad.output, bad.output
    assert pending(store) == []
    bad = invoke("receipts", "--store", store, "--request", "nope")
    assert bad.exit_code == 2 and "no receipt for request nope" in bad.output
    bad = invoke("forget", "--store", store, "--max-batch", "0")
    assert bad.exit_code == 2 and "max-batch" in bad.output.replace("max_batch", "max-batch")
    bad = invoke("request-deletion", "--store", tmp_path / "nothing", "--ids", "1")
    assert bad.exit_code == 2 and "no fairpipe store" in bad.output.lower()


def point_bytes(url, rows):
    """The stored bytes of the points, sketch and residual rows of ``rows`` (as the rows hold
    them now)."""
    needles = row_needles(url, rows)
    assert len(needles) == 3 * len(rows)  # the store keeps a sketch and its residual
    return needles


def test_the_erasure_proof_holds_on_pixel_data(prefect_server, tmp_path):
    """Integer rows holding 0 and 255 (pixels) are their own sketch reconstruction: every
    residual row is the same bytes, so it is no needle (it would be found in the live rows'
    chunks after a complete erasure); the point and sketch needles are, and are gone."""
    X = np.random.default_rng(0).integers(0, 256, size=(300, 16)).astype(np.float32)
    X[:, 0], X[:, 1] = 0, 255
    np.save(tmp_path / "x.npy", X)
    store = str(tmp_path / "s")
    opts = IngestOptions(seed=2, n_hashes=3, n_tables=4, bucket_width=200.0, chunk_rows=128)
    run_ingest(str(tmp_path / "x.npy"), store, opts, **THREADS)
    needles = row_needles(store, [3, 200])
    assert len(needles) == 4  # points and sketch rows
    assert len({n for _, n in files_holding(store, needles)}) == 4
    ids = FairpipeStore.open(store).read("ids")
    run_forget(store, [int(ids[3]), int(ids[200])], **THREADS)
    assert files_holding(store, needles) == []


@pytest.mark.parametrize("index_jobs", [False, True])
def test_a_drain_with_the_default_retention_leaves_no_byte_of_the_erased_rows(
    store, monkeypatch, index_jobs
):
    """Also when the batch's index rewrite runs as Dask jobs (whose forks add a checkpoint on
    the drain's private branch): no snapshot holds the rows."""
    import fairpipe.flows.forget

    if index_jobs:
        monkeypatch.setattr(fairpipe.flows.forget, "DISTRIBUTED_INDEX_ROWS", 1)
    st = FairpipeStore.open(store)
    ids = st.read("ids")
    rows = [3, 200, 577]
    needles = point_bytes(store, rows)
    assert len({n for _, n in files_holding(store, needles)}) == 9  # the scan finds them
    rid = file_request(store, ids[rows]).request_id
    res = run_forget(store, None, **THREADS)
    assert res["erasure"]["receipts_erased"] == 1 and res["erasure"]["chunks_deleted"] > 0
    assert files_holding(store, needles) == []  # in no snapshot, manifest or chunk
    st = FairpipeStore.open(store)
    for snap in st.history():  # every remaining snapshot reads the rows erased (or no points)
        try:
            points = st.read("points", session=st.readonly_session(snap["id"]))
        except (ArrayNotFoundError, GroupNotFoundError):  # the repository's empty first snapshot
            continue
        assert not points[rows].any()
        assert not st.read("sketch", session=st.readonly_session(snap["id"]))[rows].any()
    (r,) = read_receipts(st.readonly_session())
    assert r["request"] == rid and r["erased_at"] >= r["applied_at"]


def test_a_retention_keeps_a_recovery_window_until_a_later_drain(store):
    bad = invoke("configure", "--store", store, "--erasure-retention", "-1h")
    assert bad.exit_code == 2 and "erasure_retention" in bad.output
    bad = invoke("configure", "--store", store, "--erasure-retention", "soon")
    assert bad.exit_code == 2 and "'soon'" in bad.output
    out = invoke("configure", "--store", store, "--erasure-retention", "3s", "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["before"] == "0"
    ids = FairpipeStore.open(store).read("ids")
    needles = point_bytes(store, [5])
    res = run_forget(store, [int(ids[5])], **THREADS)
    assert "erasure" not in res and files_holding(store, needles)  # time travel still works
    st = FairpipeStore.open(store)
    (r,) = read_receipts(st.readonly_session())
    assert r["erased_at"] is None
    status = json.loads(invoke("status", "--store", store, "--json").stdout)
    assert status["erasure_retention"] == "3s" and status["not_yet_erased"] == 1
    time.sleep(3.5)
    res = run_forget(store, None, **THREADS)  # nothing pending: the clock alone erases
    assert res["batches"] == [] and res["erasure"]["receipts_erased"] == 1
    assert files_holding(store, needles) == []
    (r,) = read_receipts(FairpipeStore.open(store).readonly_session())
    assert r["erased_at"] is not None


def test_backfill_resumes_after_an_interruption_and_applies_each_id_once(
    store, tmp_path, monkeypatch
):
    ids = FairpipeStore.open(store).read("ids")
    backlog = np.r_[ids[::3], ids[:30:3], [10**9]]  # 200 ids, 10 duplicates, 1 unknown
    (tmp_path / "backlog.csv").write_text("id,ticket\n" + "".join(f"{i},t{i}\n" for i in backlog))
    import fairpipe.flows.forget

    real = fairpipe.flows.forget._apply_batch
    calls = []

    def dies_on_the_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed between two batches' commits")
        return real(*args, **kwargs)

    monkeypatch.setattr(fairpipe.flows.forget, "_apply_batch", dies_on_the_third_batch)
    with pytest.raises(RuntimeError, match="killed between"):
        run_backfill(store, tmp_path / "backlog.csv", BackfillOptions(batch_size=50), **THREADS)
    monkeypatch.undo()
    assert len(pending(store)) == 3 and len(alive_ids(store)) == 600 - 100
    res = run_backfill(store, tmp_path / "backlog.csv", BackfillOptions(batch_size=50), **THREADS)
    assert res["ids_given"] == 211 and res["duplicates"] == 10 and res["unique"] == 201
    assert res["parts"] == 5 and res["parts_filed"] == 0 and res["parts_applied_before"] == 2
    assert res["forgotten"] == 100 and res["unknown"] == 1 and len(res["batches"]) == 3
    assert alive_ids(store) == set(ids.tolist()) - set(backlog.tolist())
    receipts = read_receipts(FairpipeStore.open(store).readonly_session())
    assert len(receipts) == 5 and sum(r["n_ids"] for r in receipts) == 201
    assert [x for r in receipts for x in r["not_found"]] == [10**9]
    # Parts follow the rows: each part's known ids are a run of neighbouring rows.
    again = run_backfill(store, tmp_path / "backlog.csv", BackfillOptions(batch_size=50), **THREADS)
    assert again["parts_applied_before"] == 5 and again["batches"] == []
    bad = invoke("backfill", "--store", store, "--ids-file", tmp_path / "backlog.csv",
                 "--batch-size", "0")  # fmt: skip
    assert bad.exit_code == 2 and "--batch-size" in bad.output
    (tmp_path / "bad.txt").write_text("1\n2\n\n3x\n")
    bad = invoke("backfill", "--store", store, "--ids-file", tmp_path / "bad.txt")
    assert bad.exit_code == 2 and "'3x'" in bad.output and "line 4" in bad.output
    assert pending(store) == []


def test_producers_filing_during_a_drain_lose_nothing(store):
    ids = FairpipeStore.open(store).read("ids")
    filed: list[str] = []
    stop = threading.Event()

    def produce():
        for j in range(40):  # while the drain runs (it keeps listing the queue) and after
            filed.append(file_request(store, ids[[j]], "during").request_id)
            time.sleep(0.1 if not stop.is_set() else 0.0)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        run_forget(store, None, ForgetOptions(max_batch=2), **THREADS)
    finally:
        stop.set()
        producer.join()
    run_forget(store, None, **THREADS)  # what was filed after the first drain looked
    receipts = read_receipts(FairpipeStore.open(store).readonly_session())
    assert sorted(r["request"] for r in receipts) == sorted(filed) and pending(store) == []
    assert not set(ids[: len(filed)].tolist()) & alive_ids(store)


def test_sigkilled_drains_apply_each_request_once_and_equal_an_uninterrupted_run(
    prefect_server, tmp_path
):
    """A few kills here; benchmarks/bench_sigkill.py does 50 (see docs/measurements/forgetting.md)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, root / "benchmarks" / "bench_sigkill.py", "--kills", "3", "--n", "3000",
         "--requests", "15", "--batch", "3", "--max-delay", "10", "--json"],
        capture_output=True, text=True, timeout=900, cwd=root,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, out.stdout + out.stderr
    assert result["kills"] >= 1 and result["each_request_once"] and result["receipts_equal"]
    assert result["objects_differing"] == [] and result["erased_bytes_found"] == []
    assert result["objects_compared"] > 50 and result["pending_left"] == 0


def test_a_queue_object_that_is_not_a_request_is_set_aside_and_the_rest_applied(store):
    from pathlib import Path

    file_request(store, np.array([1, 2]))
    (Path(store) / "queue" / "20200101T000000000000Z-junk.json").write_text("{not json")
    out = invoke("forget", "--store", store)
    assert out.exit_code == 0 and "1 queue objects set aside" in out.output
    assert len(alive_ids(store)) == 598 and pending(store) == []
    status = invoke("status", "--store", store).stdout
    assert "20200101T000000000000Z-junk.json" in status and "not valid JSON" in status


def test_backfill_parts_follow_the_leaves_so_each_leaf_is_recomputed_about_once():
    from fairpipe.flows.backfill import plan_parts
    from fairpipe.tree import leaf_of

    rng = np.random.default_rng(3)
    all_ids = rng.permutation(50_000) * 7 + 11
    wanted = np.r_[rng.choice(all_ids, 5_000, replace=False), [5, 6]]  # two unknown ids
    trees = ((4, 256), (9, 64))  # (seed, leaves): a summary tree, then a DC tree
    parts = plan_parts(all_ids, wanted, 500, trees)
    assert [p.size for p in parts] == [500] * 10 + [2] and np.isin([5, 6], parts[-1]).all()
    assert np.array_equal(np.sort(np.concatenate(parts)), np.sort(wanted))
    first = [leaf_of(p[np.isin(p, all_ids)], 4, 256) for p in parts]
    ordered = np.concatenate(first)
    assert np.all(np.diff(ordered) >= 0)  # the summary's leaves in order, part after part
    # So each leaf is recomputed by one part, or two where a part ends inside it.
    per_leaf = sum(np.bincount(np.unique(f), minlength=256) for f in first)
    assert per_leaf.max() <= 2 and per_leaf.sum() <= 256 + len(parts)


# -- the queue reads only what it wrote ------------------------------------------------------------
RID = "20261127T000000000000Z-aaaaaaaa"
GOOD = {"request": RID, "ids": [1, 2], "reason": "", "requested_at": "2026-11-27T00:00:00+00:00"}


def body(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def test_malformed_queue_objects_are_set_aside_and_never_stop_a_drain(store, tmp_path):
    """Each shape a hostile producer can leave in the queue folder: the drain applies the good
    request, moves every other object to the quarantine with a note, and ends (a name that
    disagrees with its content used to make every drain loop forever)."""
    queue = tmp_path / "s" / "queue"
    good = file_request(store, np.array([11])).request_id
    shapes = {
        "20261127T000000000000Z-aaaaaaaa.json": body(request="20261127T000000000000Z-other"),
        "20261127T000000000001Z-aaaaaaab.json": body(request="../../../victim"),
        "20261127T000000000002Z-aaaaaaac.json": b'{"request": ',
        "20261127T000000000003Z-aaaaaaad.json": body(ids=["12"]),
        "hello.json": body(),
        "20261127T000000000004Z-aaaaaaae.json.bak": body(),
        "bad\nname\x1b[2J.json": body(),
    }
    for name, data in shapes.items():
        (queue / name).write_bytes(data)
    huge = queue / "20261127T000000000005Z-aaaaaaaf.json"
    with open(huge, "wb") as f:  # sparse: its size is refused before anything is read
        f.truncate(33 * 1024 * 1024)
    (queue / "20261127T000000000006Z-aaaaaab0.json").mkdir()  # a folder
    (queue / "20261127T000000000007Z-aaaaaab1.json").symlink_to(tmp_path / "x.npy")  # a link
    os.mkfifo(queue / "20261127T000000000008Z-aaaaaab2.json")  # a pipe: opening must not block
    n_bad = len(shapes) + 4
    status = json.loads(invoke("status", "--store", store, "--json").stdout)
    assert status["pending_requests"]["unrecognised"] == 3  # by name; the rest once read

    res = run_forget(store, None, **THREADS)
    assert res["requests"] == [good] and res["deleted"] == [11]
    assert len(res["set_aside"]) == n_bad
    assert sorted(os.listdir(queue)) == []  # applied and set-aside objects are gone from it
    assert (tmp_path / "x.npy").exists()  # a link is moved, never what it points to
    assert 12 in alive_ids(store) and 1 in alive_ids(store)  # nothing of them was applied
    receipts = read_receipts(FairpipeStore.open(store).readonly_session())
    assert [r["request"] for r in receipts] == [good] and receipts[0]["commit"]

    aside = json.loads(invoke("status", "--store", store, "--json").stdout)["set_aside"]
    assert aside["count"] == n_bad and aside["where"] == str(tmp_path / "s" / "quarantine")
    why = {n["object"]: n["why"] for n in aside["objects"]}
    assert "'request' field is not its own name" in why["20261127T000000000000Z-aaaaaaaa.json"]
    assert "over 33,554,432" in why[huge.name] and "not a regular file" in why[
        "20261127T000000000006Z-aaaaaab0.json"]  # fmt: skip
    assert why["hello.json"] == "its name is not '<request id>.json'"
    moved = sorted(os.listdir(tmp_path / "s" / "quarantine"))
    assert len(moved) == 2 * n_bad  # each object and its note
    text = invoke("receipts", "--store", store).stdout
    assert f"{n_bad} queue objects set aside" in text and "\x1b" not in text
    again = run_forget(store, None, **THREADS)  # nothing left to do, nothing set aside twice
    assert again["batches"] == [] and again["set_aside"] == []


def test_a_drain_that_would_retry_applied_requests_stops_with_an_error(store, monkeypatch):
    """Every round of a drain must apply a request no round tried before: a batch that leaves
    no receipt (the shape of the old endless loop: receipts under another name than the
    request's object) raises instead of looping."""
    import fairpipe.flows.forget as forget
    import fairpipe.storage.drain as ledger

    file_request(store, np.array([3]))
    monkeypatch.setattr(forget, "_apply_batch", lambda store, batch, o: None)
    monkeypatch.setattr(ledger, "delete_requests", lambda url, rids: None)
    with pytest.raises(RuntimeError, match="came back to requests it had already applied"):
        forget.drain(FairpipeStore.open(store), ForgetOptions(), [])
