"""A filesystem that refuses to be written - read-only, full - is the user's to fix: exit 2 and one
line naming the path and what to do, wherever the write failed (this process, a flow, a Dask
worker, Icechunk). Output paths are checked before the work starts.

Real filesystems: tmpfs mounts (CI runs as root, which ignores permission bits, so a read-only
mount is the only way to refuse root a write), unmounted by the fixtures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairpipe.flows.cli import app
from fairpipe.flows.cli._runner import environment_error

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """Make tmpfs mounts (``mounts(size) -> folder``); all unmounted at the end."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: these tests mount filesystems")
        pytest.skip("mounting a filesystem needs root")
    made: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path_factory.mktemp("mount")
        _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
        made.append(folder)
        return folder

    yield mount
    for folder in reversed(made):
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(scope="module")
def read_only_store(mounts, digits_store) -> Path:
    """A copy of the digits store on a filesystem then mounted read-only."""
    folder = mounts("32m")
    shutil.copytree(digits_store[0], folder / "digits")
    _mount("-o", "remount,ro", str(folder))
    with pytest.raises(OSError, match="Read-only file system"):
        (folder / "x").write_text("root may not write here")
    return folder / "digits"


def read_only(path) -> str:
    return f"error: {path} is on a read-only filesystem; give a writable --store.\n"


def test_a_read_only_store_exits_2_naming_it(read_only_store, dask_address, tmp_path):
    store = read_only_store
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("5\n6\n")
    cluster = ["--dask-address", dask_address]
    for args in (["request-deletion", "--store", store, "--ids", 5],  # the queue, here
                 ["configure", "--store", store, "--erasure-retention", "1d"],  # the lock, here
                 ["forget", "--store", store, "--ids", 5, *cluster],  # the queue, in a flow
                 ["fit", "--store", store, "--n-clusters", 3, *cluster],  # before its flow
                 ["summarize", "--store", store, "--k", 3, "--lower", 0, *cluster],
                 ["backfill", "--store", store, "--ids-file", ids_file, *cluster],
                 ["ingest", "digits", "--store", store, *cluster]):  # fmt: skip
        out = invoke(*args)
        assert (out.exit_code, out.stderr, out.stdout) == (2, read_only(store), ""), args
    # Reading is fine.
    assert invoke("info", "--store", store).exit_code == 0
    # A new store there cannot be made.
    new = store.parent / "new"
    out = invoke("ingest", "digits", "--store", new, *cluster)
    assert out.exit_code == 2 and len(out.stderr.splitlines()) == 1 and str(new) in out.stderr


def test_a_read_only_filesystem_met_on_a_dask_worker(read_only_store, dask_address):
    """Dask raises a worker's error again in the client (rebuilt from its pickle): the path is
    the one the worker failed to write."""
    from distributed import Client

    target = read_only_store / "new-chunk"
    with Client(dask_address) as client:
        future = client.submit(Path.write_bytes, target, b"0", pure=False)
        with pytest.raises(OSError) as raised:
            future.result()
    message = environment_error(raised.value, {"store": str(read_only_store)})
    assert message == read_only(read_only_store).removeprefix("error: ").rstrip()


def test_a_full_disk_exits_2_naming_the_store(mounts, digits_store, dask_address):
    folder = mounts("4m")
    shutil.copytree(digits_store[0], folder / "digits")
    free = shutil.disk_usage(folder).free
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * (free - 8192))  # tmpfs: written pages are allocated
    store = folder / "digits"
    out = invoke("request-deletion", "--store", store, "--ids", ",".join(map(str, range(3000))))
    assert out.exit_code == 2 and out.stdout == ""
    assert out.stderr.startswith(f"error: No space left on device writing {store} (")
    assert out.stderr.endswith(" free there now); free space or give --store another folder.\n")
    # A command that writes a store asks for free space before it starts (less than a commit
    # needs: refused, the folder never made).
    new = folder / "new"
    out = invoke("ingest", "digits", "--store", new, "--dask-address", dask_address)
    assert (out.exit_code, out.stdout) == (2, ""), out.stderr
    assert out.stderr.startswith(f"error: No space left on device writing {new} (8.2 kB free")
    assert not new.exists()
    # With more room than a commit but less than its rows: an ingest's chunks, written by
    # Icechunk (its error names no file: the store is named).
    os.truncate(folder / "filler", (folder / "filler").stat().st_size - (3 << 19))
    out = invoke("ingest", "gaussian", "--gaussian-n", 50_000, "--store", new, "--dask-address",
                 dask_address)  # fmt: skip
    assert out.exit_code == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"error: No space left on device writing {new} (")
    assert not new.exists()  # the failed ingest took its folder away


def test_output_paths_are_checked_before_the_work(tmp_path, read_only_store):
    (tmp_path / "c.csv").write_text("list,score,group\n0,1.0,a\n0,0.5,b\n")
    nowhere = tmp_path / "nodir" / "x.csv"
    out = invoke("rerank", tmp_path / "c.csv", "--out", nowhere)
    assert out.exit_code == 2 and out.stderr == (
        f"error: The folder {nowhere.parent} of --out {nowhere} does not exist; create it first.\n"
    )
    out = invoke("rerank", tmp_path / "c.csv", "--out", tmp_path)
    assert (
        out.exit_code == 2
        and out.stderr == f"error: --out {tmp_path} is a folder; give a file name.\n"
    )
    on_read_only = read_only_store.parent / "ranked.csv"
    out = invoke("rerank", tmp_path / "c.csv", "--out", on_read_only)
    assert out.exit_code == 2 and out.stderr == (
        f"error: --out {on_read_only} is on a read-only filesystem; give a path on a writable "
        "one.\n"
    )
    # audit --out is a folder: an existing file there is refused before the search.
    (tmp_path / "file").write_text("mine")
    out = invoke("audit", "--protected", "sex", "--out", tmp_path / "file")
    assert out.exit_code == 2 and "is a file; give a folder" in out.stderr
    out = invoke("demo", "--plot", tmp_path / "nodir" / "tv.png")
    assert out.exit_code == 2 and "does not exist; create it first" in out.stderr
