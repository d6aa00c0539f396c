"""The flows on a store in a bucket of an S3-compatible server (moto's): ingest, forget and
erasure against real object storage, including garbage collection removing the erased chunks
from the bucket, and the deletion queue in the bucket."""

from __future__ import annotations

import json

import numpy as np

from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import IngestOptions
from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.store import FairpipeStore
from tests.conftest import BUCKET, bucket_objects, holding

THREADS = dict(n_workers=1, processes=False)


def test_a_store_in_a_bucket_forgets_and_erases_the_rows_from_every_object(
    prefect_server, s3_server, tmp_path
):
    X = np.random.default_rng(8).normal(size=(800, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    url = f"s3://{BUCKET}/people"
    opts = IngestOptions(n_hashes=3, n_tables=4, chunk_rows=256, seed=1)
    res = run_ingest(str(tmp_path / "x.npy"), url, opts, **THREADS)
    assert res["n"] == 800
    st = FairpipeStore.open(url)
    assert np.array_equal(st.read("points"), X)
    needles = [X[r].astype("<f4").tobytes() for r in (4, 9)]
    assert len(holding(bucket_objects(s3_server, "people/"), needles)) >= 1
    forgot = run_forget(url, st.read("ids")[[4, 9]], **THREADS)
    assert sorted(forgot["deleted"]) == sorted(st.read("ids")[[4, 9]].tolist())
    assert forgot["erasure"]["chunks_deleted"] > 0  # garbage collection in the bucket
    assert holding(bucket_objects(s3_server, "people/"), needles) == []
    st = FairpipeStore.open(url)
    assert not st.read("points")[[4, 9]].any() and st.read("alive").sum() == 798
    (r,) = read_receipts(st.readonly_session())
    assert r["n_ids"] == 2 and r["erased_at"] is not None


def test_the_queue_lives_in_the_bucket_and_many_producers_lose_nothing(
    prefect_server, s3_server, tmp_path
):
    import threading

    from fairpipe.storage.queue import file_request, pending

    X = np.random.default_rng(9).normal(size=(400, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    url = f"s3://{BUCKET}/queued"
    run_ingest(str(tmp_path / "x.npy"), url, IngestOptions(n_hashes=3, n_tables=4), **THREADS)
    filed: list[str] = []

    def produce(k):
        for j in range(4):
            filed.append(file_request(url, np.array([10 * k + j]), f"producer {k}").request_id)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(filed) == pending(url) and len(set(filed)) == 24
    keys = bucket_objects(s3_server, "queued/queue/")
    assert len(keys) == 24 and all(k.endswith(".json") for k in keys)
    # Objects a hostile producer can put in a bucket: path-like names, a name that disagrees
    # with its content. Set aside, never applied, never in the way.
    rid = "20261127T000000000000Z-aaaaaaaa"
    hostile = {
        "queued/queue/../../victim.json": b"{}",
        f"queued/queue/sub/{rid}.json": b"{}",
        f"queued/queue/{rid}.json": json.dumps({"request": "../../../victim", "ids": [300],
                                                "requested_at": "2026-11-27T00:00:00"}).encode(),
    }  # fmt: skip
    for key, data in hostile.items():
        s3_server.put_object(Bucket=BUCKET, Key=key, Body=data)
    res = run_forget(url, None, **THREADS)
    assert sorted(res["requests"]) == sorted(filed) and len(res["deleted"]) == 24
    # The '..' key cannot be listed, read or moved by obstore: it stays, named by status.
    assert len(res["set_aside"]) == 2
    assert pending(url) == [] and list(bucket_objects(s3_server, "queued/queue/")) == [
        "queued/queue/../../victim.json"
    ]
    from fairpipe.flows.status import store_status

    assert store_status(url)["set_aside"]["unlistable"] == ["queued/queue/../../victim.json"]
    receipts = read_receipts(FairpipeStore.open(url).readonly_session())
    assert sorted(r["request"] for r in receipts) == sorted(filed)
    aside = bucket_objects(s3_server, "queued/quarantine/")
    assert len(aside) == 2 * 2 and 300 in FairpipeStore.open(url).read("ids")
