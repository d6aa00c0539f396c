"""Ingest from a URL source on the second host (tests/second_host/conftest.py): its workers read the
source themselves, with the credentials in their own environment."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from tests.second_host.conftest import BUCKET, PEOPLE
from tests.second_host.test_second_host import store_arrays

runner = CliRunner()


def invoke(*args: object):
    from fairpipe.flows.cli import app

    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_an_s3_source_is_read_by_the_workers_and_gives_the_local_files_store(
    s3_env, people_source, tmp_path
):
    host = s3_env
    host.s3.upload_file(str(people_source), BUCKET, "sources/people.parquet")
    before = host.task_counts()
    url = f"s3://{BUCKET}/from-url"
    made = invoke("ingest", f"s3://{BUCKET}/sources/people.parquet", "--store", url, *PEOPLE,
                  "--dask-address", host.scheduler)  # fmt: skip
    assert made.exit_code == 0, made.output
    assert host.task_counts().get("ingest_chunk", 0) > before.get("ingest_chunk", 0)
    local = tmp_path / "local"
    assert invoke("ingest", people_source, "--store", local, *PEOPLE).exit_code == 0
    remote, here = store_arrays(url), store_arrays(str(local))
    assert sorted(remote) == sorted(here)
    for path, array in here.items():
        assert np.array_equal(remote[path], array), path


def test_a_url_source_the_workers_cannot_read_is_one_line_and_leaves_nothing(s3_env, people_source):
    """The file served over plain http by the S3 server at 127.0.0.1: the client reads it there,
    the workers (on the second host) cannot."""
    host = s3_env
    host.s3.upload_file(str(people_source), BUCKET, "sources/public.parquet",
                        ExtraArgs={"ACL": "public-read"})  # fmt: skip
    local = host.endpoint.replace(host.host_ip, "127.0.0.1")
    source = f"{local}/{BUCKET}/sources/public.parquet"
    store = f"s3://{BUCKET}/unreadable"
    out = invoke("ingest", source, "--store", store, *PEOPLE, "--dask-address", host.scheduler)
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: Source {source} cannot be read on "), (
        out.stderr
    )
    assert "the worker tcp://10.77." in lines[0]  # named: a worker on the second host
    left = host.s3.list_objects_v2(Bucket=BUCKET, Prefix="unreadable").get("Contents", [])
    assert left == []  # a failed first ingest leaves no object behind
