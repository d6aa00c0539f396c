"""A store on an S3-compatible server (moto's, started by the test as its own process): opened,
made and refused as a folder store is. The flows on it (ingest, forget, erasure and the queue in
the bucket): tests/flows/test_object_store.py."""

from __future__ import annotations

import socket

import pytest

from fairpipe.storage.store import FairpipeStore
from tests.conftest import BUCKET, bucket_objects


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
