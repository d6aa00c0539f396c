"""Sources where the data is, and the staging area in the store's own storage: an ingest into a
store in a bucket (moto's S3 server) stages nothing in the client's temporary folder; a local
source reaches workers that do not share the client's disk as blocks; URL sources are read by
the workers; a failed first ingest into a new prefix leaves no object behind."""

from __future__ import annotations

import re
import tempfile

import numpy as np
import pytest

from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import IngestOptions
from fairpipe.storage.store import FairpipeStore
from tests.conftest import BUCKET

# The reference stores: the embedded cluster, one worker (the cluster given by address has two).
THREADS = dict(n_workers=1, processes=False)
OPTS = dict(n_hashes=3, n_tables=6, chunk_rows=256, seed=2)
ARRAYS = ("points", "ids", "groups", "alive", "lsh/segment_lengths", "lsh/bucket_counts",
          "lsh/projections")  # fmt: skip


def keys_under(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def same_store(a: str, b: str) -> None:
    from fairpipe.storage.index import read_segments

    sa, sb = FairpipeStore.open(a), FairpipeStore.open(b)
    for name in ARRAYS:
        assert np.array_equal(sa.read(name), sb.read(name)), name
    assert np.array_equal(read_segments(sa.readonly_session())[1],
                          read_segments(sb.readonly_session())[1])  # fmt: skip
    drop = {"sources"}
    assert {k: v for k, v in sa.attrs().items() if k not in drop} == {
        k: v for k, v in sb.attrs().items() if k not in drop
    }


@pytest.fixture(scope="module")
def cluster(prefect_server):
    """Two single-thread workers in this process, reached by address as a user's cluster is
    (their scratch space made before a test watches the temporary folder)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as running:  # fmt: skip
        yield dict(dask_address=running.scheduler_address)


@pytest.fixture
def private_tmpdir(tmp_path, monkeypatch):
    """The client's temporary folder, watched: an ingest must create nothing in it."""
    tmp = tmp_path / "client-tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_an_ingest_into_a_bucket_stages_nothing_in_the_client_temp_folder(
    cluster,
    s3_server,
    tmp_path,
    private_tmpdir,
):
    X = np.random.default_rng(3).normal(size=(1500, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    url = f"s3://{BUCKET}/staged"
    res = run_ingest(str(tmp_path / "x.npy"), url, IngestOptions(**OPTS), **cluster)
    assert res["n"] == 1500 and res["chunks"] == 6
    assert list(private_tmpdir.iterdir()) == []
    assert not [k for k in keys_under(s3_server, "staged/") if ".fairpipe-staging" in k]
    # An ingest killed with its staging area in the bucket: the next ingest removes it.
    s3_server.put_object(Bucket=BUCKET, Key="staged/.fairpipe-staging.k1ll3d/000000000000",
                         Body=b"keys")  # fmt: skip
    np.save(tmp_path / "more.npy", X[:300] + 1)
    res = run_ingest(str(tmp_path / "more.npy"), url, IngestOptions(), **cluster)
    assert res["n"] == 1800 and res["stale_staging_removed"] == 1
    assert not [k for k in keys_under(s3_server, "staged/") if ".fairpipe-staging" in k]
    assert list(private_tmpdir.iterdir()) == []
    local = tmp_path / "local"
    run_ingest(str(tmp_path / "x.npy"), str(local), IngestOptions(**OPTS), **THREADS)
    run_ingest(str(tmp_path / "more.npy"), str(local), IngestOptions(), **THREADS)
    same_store(url, str(local))


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A table of 3,000 rows with ids and groups, as Parquet (several row groups), as CSV, and
    as a folder of three Parquet files."""
    import pandas as pd

    rng = np.random.default_rng(5)
    frame = pd.DataFrame(rng.normal(size=(3000, 5)).astype(np.float32), columns=list("abcde"))
    frame["who"] = rng.permutation(10**6)[:3000] * 7 + 3
    frame["sex"] = rng.choice(["f", "m", "x"], size=3000)
    folder = tmp_path_factory.mktemp("sources")
    frame.to_parquet(folder / "people.parquet", row_group_size=700)
    frame.to_csv(folder / "people.csv", index=False)
    (folder / "parts").mkdir()
    for i, (a, b) in enumerate([(0, 1000), (1000, 1100), (1100, 3000)]):  # a Parquet data set
        frame.iloc[a:b].to_parquet(folder / "parts" / f"part-{i}.parquet", row_group_size=400,
                                   index=False)  # fmt: skip
    return folder, frame


@pytest.fixture
def jobs_never_open_a_path(monkeypatch):
    """The local files jobs read on a Dask worker (none on a cluster given by address)."""
    import fairpipe.flows.jobs
    from fairpipe.datasets import read_source_rows

    opened: list[str] = []

    def read(plan, a, b):
        from distributed import get_worker

        try:
            get_worker()
            if plan.kind in ("npy", "csv", "parquet"):
                opened.append(plan.path)
        except ValueError:
            pass  # the client, or a flow's own append
        return read_source_rows(plan, a, b)

    monkeypatch.setattr(fairpipe.flows.jobs, "read_source_rows", read)
    return opened


@pytest.mark.parametrize("name", ["people.parquet", "people.csv"])
def test_a_local_table_reaches_the_workers_as_blocks_and_gives_the_same_store(
    cluster,
    s3_server,
    table,
    tmp_path,
    name,
    jobs_never_open_a_path,
):
    folder, _ = table
    opts = IngestOptions(**OPTS, id_column="who", group_column="sex")
    url = f"s3://{BUCKET}/blocks-{name.replace('.', '-')}"
    res = run_ingest(str(folder / name), url, opts, **cluster)
    assert res["n"] == 3000 and res["chunks"] == 12 and jobs_never_open_a_path == []
    local = tmp_path / "local"
    run_ingest(str(folder / name), str(local), opts, **THREADS)
    assert set(jobs_never_open_a_path) == {str(folder / name)}  # the embedded cluster's do
    same_store(url, str(local))
    if name == "people.parquet":  # the same rows as a folder of files, sent as blocks
        res = run_ingest(str(folder / "parts"), str(tmp_path / "parts"), opts, **cluster)
        assert res["n"] == 3000 and set(jobs_never_open_a_path) == {str(folder / name)}
        same_store(str(tmp_path / "parts"), str(local))


def test_bad_rows_found_by_the_client_and_a_failed_first_ingest_leaves_no_object(
    cluster,
    s3_server,
    table,
    tmp_path,
    private_tmpdir,
    monkeypatch,
):
    from fairpipe.errors import FairpipeInputError

    left: list[str] = []  # the objects when the failed creation begins its clean-up
    remove = FairpipeStore._remove_created

    def removing(store, before):
        left.extend(keys_under(s3_server, "failed/"))
        remove(store, before)

    monkeypatch.setattr(FairpipeStore, "_remove_created", removing)
    _, frame = table
    bad = frame.copy()
    bad.loc[2100, "c"] = np.nan
    bad.to_csv(tmp_path / "bad.csv", index=False)
    before = keys_under(s3_server, "")
    # Given parameters and no scaling: no sample read ahead, so the bad row is met by the chunk
    # reads, after the store was made and the first chunks written.
    opts = IngestOptions(
        **OPTS, bucket_width=1.0, id_column="who", group_column="sex", scale="none"
    )
    with pytest.raises(FairpipeInputError, match="Line 2102 of bad.csv holds a NaN value"):
        run_ingest(str(tmp_path / "bad.csv"), f"s3://{BUCKET}/failed", opts, **cluster)
    # (the transaction removed its chunk objects and staging area before)
    assert any("/snapshots/" in k for k in left), left
    assert keys_under(s3_server, "failed") == [] and keys_under(s3_server, "") == before
    assert list(private_tmpdir.iterdir()) == []


@pytest.fixture(scope="module")
def in_bucket(s3_server, table):
    """The table in the bucket: one Parquet file, the same rows as a prefix of three Parquet
    files (a data set), and a CSV."""
    folder, frame = table
    for name in ("people.parquet", "people.csv"):
        s3_server.upload_file(str(folder / name), BUCKET, f"src/{name}")
    for i in range(3):
        s3_server.upload_file(str(folder / "parts" / f"part-{i}.parquet"), BUCKET,
                              f"src/parts/part-{i}.parquet")  # fmt: skip
    s3_server.put_object(Bucket=BUCKET, Key="src/parts/_SUCCESS", Body=b"")
    return f"s3://{BUCKET}/src"


@pytest.fixture(scope="module")
def local_stores(prefect_server, table, tmp_path_factory):
    """The table's two files ingested into local stores (the embedded cluster's workers read
    them)."""
    folder, _ = table
    made = {}
    for name in ("people.parquet", "people.csv"):
        made[name] = str(tmp_path_factory.mktemp("local") / name)
        run_ingest(str(folder / name), made[name], IngestOptions(**TABLE_OPTS), **THREADS)
    return made


TABLE_OPTS = dict(OPTS, id_column="who", group_column="sex")


@pytest.mark.parametrize(
    "source, same_as",
    [("people.parquet", "people.parquet"), ("parts/", "people.parquet"), ("parts", "people.parquet"),
     ("people.csv", "people.csv")],
)  # fmt: skip
def test_a_url_source_is_read_by_the_workers(
    cluster, in_bucket, local_stores, tmp_path, monkeypatch, source, same_as
):
    import fairpipe.flows.jobs
    from fairpipe.datasets import read_source_rows

    read_on_workers: list[str] = []

    def read(plan, a, b):
        from distributed import get_worker

        get_worker()  # (raises off a worker)
        read_on_workers.append(plan.path)
        return read_source_rows(plan, a, b)

    monkeypatch.setattr(fairpipe.flows.jobs, "read_source_rows", read)
    url = f"{in_bucket}/{source}"
    res = run_ingest(url, str(tmp_path / "store"), IngestOptions(**TABLE_OPTS), **cluster)
    assert res["n"] == 3000 and len(read_on_workers) == res["chunks"] == 12
    assert set(read_on_workers) == {url}
    same_store(str(tmp_path / "store"), local_stores[same_as])


@pytest.mark.parametrize(
    "source, message",
    [
        ("nope.parquet", "Source s3://fairpipe-test/src/nope.parquet does not exist"),
        ("nothing-here/", "Source s3://fairpipe-test/src/nothing-here/ holds no Parquet files"),
        ("people.txt", "Source s3://fairpipe-test/src/people.txt: expected a .parquet, .csv"),
        (
            "//no-such-bucket/x.csv",
            "Source s3://no-such-bucket/x.csv (does not exist|cannot be read)",
        ),
    ],
)
def test_a_url_source_that_is_not_there_exits_2_naming_it_before_anything_is_written(
    in_bucket,
    s3_server,
    tmp_path,
    monkeypatch,
    source,
    message,
):
    from typer.testing import CliRunner

    import fairpipe.flows.cli._runner
    from fairpipe.flows.cli import app

    started = []  # a command starts its Prefect server only after its checks
    monkeypatch.setattr(
        fairpipe.flows.cli._runner, "launch_early", lambda: started.append("server")
    )
    before = keys_under(s3_server, "")
    url = f"s3:{source}" if source.startswith("//") else f"{in_bucket}/{source}"
    out = CliRunner().invoke(app, ["ingest", url, "--store",
                                   f"s3://{BUCKET}/never"], catch_exceptions=False)  # fmt: skip
    assert out.exit_code == 2 and re.match(f"error: {message}", out.stderr), out.stderr
    assert keys_under(s3_server, "") == before and started == []


@pytest.mark.parametrize("failure", ["bad row read by a worker", "a job's bug"])
def test_a_first_ingest_failing_on_the_workers_leaves_no_object(
    cluster, s3_server, in_bucket, table, tmp_path, monkeypatch, failure
):
    import fairpipe.flows.jobs
    from fairpipe.errors import FairpipeInputError

    _, frame = table
    source = f"{in_bucket}/people.csv"
    expected: tuple = (RuntimeError, "disk on fire")
    if failure == "bad row read by a worker":
        bad = frame.copy()
        bad.loc[2100, "c"] = np.inf
        bad.to_csv(tmp_path / "bad.csv", index=False)
        s3_server.upload_file(str(tmp_path / "bad.csv"), BUCKET, "src/bad.csv")
        source = f"{in_bucket}/bad.csv"
        expected = (FairpipeInputError, f"Line 2102 of {source} holds an inf value")
    else:
        write = fairpipe.flows.jobs.write_points

        def failing(fork, start, X, sketch):
            if start == 1024:
                raise RuntimeError("disk on fire")
            return write(fork, start, X, sketch)

        monkeypatch.setattr(fairpipe.flows.jobs, "write_points", failing)
    before = keys_under(s3_server, "")
    opts = IngestOptions(**TABLE_OPTS, bucket_width=1.0)  # no sample: the workers meet the row
    with pytest.raises(expected[0], match=expected[1]):
        run_ingest(source, f"s3://{BUCKET}/failing", opts, **cluster)
    assert keys_under(s3_server, "failing") == []
    assert sorted(keys_under(s3_server, "")) == sorted(before)


@pytest.fixture(scope="module")
def web(table):
    """The table's folder served over plain HTTP (as a web server or a signed URL would)."""
    import functools
    import http.server
    import io
    import threading
    from pathlib import Path

    folder, _ = table

    class Ranges(http.server.SimpleHTTPRequestHandler):
        """Python's file server, answering a byte range as web servers and object stores do."""

        def send_head(self):
            found = self.headers.get("Range", "").removeprefix("bytes=").split("-")
            path = Path(self.translate_path(self.path))
            if len(found) != 2 or not path.is_file():
                return super().send_head()
            data = path.read_bytes()
            a = int(found[0])
            b = min(int(found[1]) + 1 if found[1] else len(data), len(data))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{b - 1}/{len(data)}")
            self.send_header("Content-Length", str(b - a))
            self.end_headers()
            return io.BytesIO(data[a:b])

        def log_message(self, *args):
            pass

    handler = functools.partial(Ranges, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_url_that_is_no_table_is_named_and_nothing_is_written(
    cluster, s3_server, in_bucket, table, tmp_path
):
    from fairpipe.errors import FairpipeInputError

    s3_server.put_object(Bucket=BUCKET, Key="src/junk.parquet", Body=b"not parquet at all")
    s3_server.put_object(Bucket=BUCKET, Key="src/mixed/a.parquet", Body=b"PAR1 nor this")
    s3_server.copy_object(
        Bucket=BUCKET,
        Key="src/other/a.parquet",
        CopySource={"Bucket": BUCKET, "Key": "src/parts/part-0.parquet"},
    )
    _, frame = table
    frame[["a", "b"]].to_parquet(tmp_path / "b.parquet")
    s3_server.upload_file(str(tmp_path / "b.parquet"), BUCKET, "src/other/b.parquet")
    cases = {
        "junk.parquet": f"{in_bucket}/junk.parquet is not a readable Parquet file",
        "mixed/": f"{in_bucket}/mixed/a.parquet is not a readable Parquet file",
        "other/": rf"{in_bucket}/other/b.parquet has the columns \['a', 'b'\]; the first file",
    }
    for source, message in cases.items():
        with pytest.raises(FairpipeInputError, match=message):
            run_ingest(f"{in_bucket}/{source}", f"s3://{BUCKET}/junk", IngestOptions(), **cluster)
    assert keys_under(s3_server, "junk") == []


def test_a_source_on_a_web_server_is_read_by_the_workers(cluster, web, local_stores, tmp_path):
    from fairpipe.errors import FairpipeInputError

    store = tmp_path / "store"
    run_ingest(f"{web}/people.parquet", str(store), IngestOptions(**TABLE_OPTS), **cluster)
    same_store(str(store), local_stores["people.parquet"])
    with pytest.raises(FairpipeInputError, match=f"Source {web}/nope.csv does not exist"):
        run_ingest(f"{web}/nope.csv", str(tmp_path / "never"), IngestOptions(), **cluster)
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("source", ["people.parquet", "people.csv", "parts/"])
def test_a_url_the_workers_cannot_read_names_the_url_and_the_worker(
    cluster, s3_server, in_bucket, tmp_path, monkeypatch, source
):
    """Read by the client (planned), refused to the workers (their credentials, their network):
    bad input naming both, and nothing left in the new store's place."""
    import fairpipe.datasets._source_io as source_io
    from fairpipe.datasets._remote import UrlUnreadable
    from fairpipe.errors import FairpipeInputError

    opened = source_io.open_url

    def refused_on_workers(url, size=None):
        from distributed import get_worker

        try:
            worker = get_worker()
        except ValueError:
            return opened(url, size)
        raise UrlUnreadable(f"access denied to {worker.address}")

    monkeypatch.setattr(source_io, "open_url", refused_on_workers)
    url = f"{in_bucket}/{source}"
    message = rf"Source {url} cannot be read on the worker inproc://\S+ \(access denied"
    with pytest.raises(FairpipeInputError, match=message):
        run_ingest(url, str(tmp_path / "store"), IngestOptions(**TABLE_OPTS), **cluster)
    assert not (tmp_path / "store").exists()
