"""A store on an S3-compatible server (moto's, started by the test as its own process): ingest,
forget and erasure against real object storage, including garbage collection removing the
erased chunks from the bucket."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import IngestOptions
from fairpipe.storage.erasure import holds
from fairpipe.storage.receipts import read_receipts
from fairpipe.storage.store import FairpipeStore

THREADS = dict(n_workers=1, processes=False)
BUCKET = "fairpipe-test"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """``moto_server`` on a free port, with a bucket; AWS_* variables point at it."""
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "server.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-p", str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}  # fmt: skip
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    for _ in range(100):
        try:
            client.create_bucket(Bucket=BUCKET)
            break
        except Exception:
            time.sleep(0.1)
    try:
        yield client
    finally:
        mp.undo()
        proc.terminate()
        proc.wait(timeout=30)


def bucket_objects(client, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
    return out


def holding(objects: dict[str, bytes], needles: list[bytes]) -> list[str]:
    return [key for key, raw in objects.items() if holds(raw, needles)]


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


def test_a_missing_bucket_is_one_clear_error(s3_server):
    from fairpipe.errors import FairpipeInputError

    with pytest.raises(FairpipeInputError, match="Cannot reach the store s3://no-such-bucket/x"):
        FairpipeStore.open("s3://no-such-bucket/x")


def test_a_server_that_is_down_is_one_clear_error_before_any_retry(monkeypatch):
    """A wrong port or a stopped server: named at once (one TCP connection), not after the S3
    client's retries."""
    from fairpipe.errors import FairpipeInputError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(FairpipeInputError, match=f"no server answers at http://127.0.0.1:{port}"):
        FairpipeStore.open("s3://bucket/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:notaport")
    with pytest.raises(FairpipeInputError, match="has no valid port"):
        FairpipeStore.open("s3://bucket/x")


def test_a_store_is_never_made_inside_another_in_a_bucket(s3_server):
    from fairpipe.errors import FairpipeInputError

    url = f"s3://{BUCKET}/outer"
    with FairpipeStore.creating(url):
        pass
    before = bucket_objects(s3_server, "outer/")
    for inner in (f"{url}/inner", f"{url}/chunks/x/", f"{url}/queue"):
        with pytest.raises(FairpipeInputError, match=f"is inside the store {url};"):
            with FairpipeStore.creating(inner):
                pass
    assert bucket_objects(s3_server, "outer/") == before
    with FairpipeStore.creating(f"s3://{BUCKET}/outer-sibling"):  # a prefix, not a folder
        pass
