"""Bad input at the command line: each case exits 2 with one line naming what is wrong, before
anything starts or is written (no store path made, the store and the current folder unchanged).

The commands run in this process (typer's runner): every case here is refused by the command's
checks, before its Prefect server, cluster or flow would start (the server is started first).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fairpipe.flows.cli._runner
from fairpipe.flows.cli import app

runner = CliRunner()
MAX = "9223372036854775807"  # the largest id and seed


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Files that are wrong in one way each, beside a good CSV (ids 100000..100019, groups g)."""
    d = tmp_path_factory.mktemp("bad-input")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 3))
    lines = ["id,g,a,b,c"] + [f"{100000 + i},{i % 2},{r[0]},{r[1]},{r[2]}" for i, r in enumerate(X)]

    def csv(name: str, rows: list[str]) -> None:
        (d / name).write_text("\n".join(rows) + "\n")

    csv("good.csv", lines)
    np.save(d / "good.npy", X)
    extra, short, floats, half = list(lines), list(lines), list(lines), list(lines)
    extra[18] += ",7"  # line 19
    short[18] = short[18].rsplit(",", 1)[0]
    floats[5] = floats[5].replace("100004", "100300.0", 1)  # line 6: the id 100300, as a float
    half[5] = half[5].replace("100004", "100300.5", 1)
    csv("extra.csv", extra)
    csv("short.csv", short)
    csv("float_id.csv", floats)
    csv("half_id.csv", half)
    body = (d / "good.csv").read_bytes()
    (d / "latin1.csv").write_bytes(body.replace(b"\n100005,1,", b"\n100005,\xe9,"))  # line 7
    (d / "not.parquet").write_text("not parquet\n")
    np.save(d / "complex.npy", X + 1j)
    nan = X.copy()
    nan[5, 1] = np.nan
    np.save(d / "nan.npy", nan)
    np.save(d / "ids_2d.npy", np.arange(20).reshape(2, 10))
    np.save(d / "ids_uint.npy", np.array([3, 2**63], dtype=np.uint64))
    np.save(d / "points_ids_2d.npy", np.arange(40).reshape(20, 2))
    np.save(d / "points_ids_big.npy", np.append(np.arange(19, dtype=np.uint64), np.uint64(2**63)))
    (d / "ids_2_64.txt").write_text(f"5\n{2**64}\n")
    (d / "ids_neg.csv").write_text("id\n5\n-3\n")
    (d / "nan_share.json").write_text('{"0": NaN, "1": 1.0}')  # Python's json reads NaN
    np.save(d / "d64.npy", rng.normal(size=(20, 64)))  # the digits store's dimension
    np.save(d / "ids_0.npy", np.arange(20))  # ids the digits store holds
    (d / "many_ids.txt").write_text("\n".join(map(str, range(1_000_001))) + "\n")
    (d / "folder").mkdir()
    (d / "folder" / "notes.txt").write_text("not a store\n")
    return d


# (command line, the one line's pattern). {d}: the data folder; {new}: a path that is no store
# (and must not become one); {store}: a store that must not change.
CASES = [
    # ingest: the source
    ("ingest {d}/extra.csv --store {new}", r"Line 19 of extra.csv has 6 field\(s\); its header has 5\."),
    ("ingest {d}/short.csv --store {new}", r"Line 19 of short.csv has 4 field\(s\); its header has 5\."),
    ("ingest {d}/latin1.csv --store {new} --group-column g", r"latin1.csv is not UTF-8 text: line 7 holds the byte 0xe9"),
    ("ingest {d}/not.parquet --store {new}", r"not.parquet is not a readable Parquet file \(Parquet magic bytes"),
    ("ingest {d}/complex.npy --store {new}", r"complex.npy must hold real numbers. Got values of type complex128\."),
    ("ingest {d}/nan.npy --store {new}", r"Row 6 of nan.npy holds a NaN value in column 2; points must be finite"),
    ("ingest {d}/good.npy --store {new} --ids-file {d}/points_ids_2d.npy", r"Ids file .*points_ids_2d.npy must hold one value per row \(one dimension\). Got shape \(20, 2\)\."),
    ("ingest {d}/good.npy --store {new} --ids-file {d}/points_ids_big.npy", r"Id 9223372036854775808 in row 20 of points_ids_big.npy is too large; ids are integers from 0 to " + MAX),
    ("ingest {d}/good.npy --store {new} --ids-file {d}/ids_uint.npy", r"Ids file .*ids_uint.npy holds 2 entries; the points file holds 20 rows\."),
    ("ingest {d}/half_id.csv --store {new} --id-column id", r"Id 100300.5 in column 'id' on line 6 of half_id.csv is not an integer; ids are integers from 0 to " + MAX),
    ("ingest {d}/good.csv --store {new} --ids-file {d}/ids_uint.npy", r"--ids-file does not apply to good.csv, a table \(ids and groups are its columns: --id-column, --group-column\)\."),
    ("ingest {d}/good.npy --store {new} --id-column id", r"--id-column does not apply to good.npy, a .npy matrix"),
    ("ingest digits --store {new} --group-column g", r"--group-column does not apply to digits, a built-in data set\."),
    # ingest: options
    ("ingest {d}/good.npy --store {new} --workers 0", r"The --workers option of fairpipe ingest must be an integer from 1 to 64. Got 0 instead\."),
    ("ingest {d}/good.npy --store {new} --workers -2", r"--workers .* Got -2 instead\."),
    ("ingest {d}/good.npy --store {new} --lock-timeout -5", r"The --lock-timeout option of fairpipe ingest must be a number >= 0 \(or inf: no limit\). Got -5.0 instead\."),
    ("ingest {d}/good.npy --store {new} --lock-timeout nan", r"--lock-timeout .* Got nan instead\."),
    ("ingest {d}/good.npy --store {new} --seed -1", r"The --seed option of fairpipe ingest must be an integer from 0 to " + MAX + r". Got -1 instead\."),
    ("ingest {d}/good.npy --store {new} --seed 9223372036854775808", r"--seed .* Got 9223372036854775808 instead\."),
    ("ingest {d}/good.npy --store", r"The --store option of fairpipe ingest must name a folder or a URL. Got an empty string\."),
    ("ingest {d}/good.npy --store {new} --n-hashes 0", r"The --n-hashes option of fairpipe ingest must be a positive integer. Got 0 instead\."),
    ("ingest {d}/good.npy --store {new} --n-tables -1", r"--n-tables .* Got -1 instead\."),
    ("ingest {d}/good.npy --store {new} --bucket-width nan", r"The --bucket-width option of fairpipe ingest must be a positive float. Got nan instead\."),
    ("ingest {d}/good.npy --store {new} --bucket-width inf", r"--bucket-width .* Got inf instead\."),
    ("ingest {d}/good.npy --store {new} --chunk-rows 0", r"--chunk-rows .* Got 0 instead\."),
    ("ingest {d}/good.npy --store {new} --chunk-rows 1000000000000", r"The --chunk-rows option of fairpipe ingest must be an integer from 1 to 1048576"),
    ("ingest gaussian --store {new} --gaussian-n 0", r"The --gaussian-n option of fairpipe ingest must be a positive integer"),
    ("ingest {d}/good.npy --store {new} --n-tables 100000000", r"The --n-tables option of fairpipe ingest must be an integer from 1 to 65535"),
    ("ingest {d}/good.npy --store {new} --n-hashes 100000000", r"needs 300000000 projection values; at most 134217728 \(1 GiB\) are supported. \(options --n-hashes, --n-tables\)"),
    # ingest: the parameters chosen for a recall at a radius (good.npy: 20 standard normal rows)
    ("ingest {d}/good.npy --store {new} --recall 1.5", r"The --recall option of fairpipe ingest must be in \(0, 1\). Got 1.5 instead\."),
    ("ingest {d}/good.npy --store {new} --recall 0", r"--recall .* Got 0.0 instead\."),
    ("ingest {d}/good.npy --store {new} --recall 1", r"--recall .* Got 1.0 instead\."),
    ("ingest {d}/good.npy --store {new} --radius 0", r"The --radius option of fairpipe ingest must be a positive float. Got 0.0 instead\."),
    ("ingest {d}/good.npy --store {new} --n-hashes 4 --n-tables 5 --bucket-width 2 --recall 0.9", r"--recall does not apply where --n-hashes, --n-tables and --bucket-width are all given: they fix the recall"),
    ("ingest {d}/good.npy --store {new} --n-hashes 15 --bucket-width 1 --radius 1 --recall 0.99", r"A recall of 0.99 \(--recall\) at radius 1 needs L = 14532126 tables with --n-hashes 15 and --bucket-width 1; at most 200 are chosen \(the index keeps an entry per row and table\)\. Lower --recall, or give --n-tables\."),
    ("ingest {d}/good.npy --store {new} --n-tables 1 --recall 0.99", r"A recall of 0.99 \(--recall\) at radius 0.659712 is out of reach with --n-tables 1: the best --n-hashes and --bucket-width give 0.9501"),
    ("ingest {d}/good.npy --store {new} --radius 0.001", r"No two of the 20 sampled rows are within --radius 0.001 of each other \(the closest pair is 0.42134 apart\): every query's ball would be empty\. The suggested radius \(the median distance to the nearest sampled row\) is 0.659712\."),
    ("ingest {d}/good.npy --store {new} --max-radius 0", r"The --max-radius option of fairpipe ingest must be a positive float. Got 0.0 instead\."),
    ("ingest {d}/good.npy --store {new} --max-radius 0.1", r"--max-radius 0.1 is below the suggested radius 0.659712: the index answers every radius up to --max-radius, from --radius\. Give --max-radius at least 0.659712, or a smaller --radius\."),
    ("ingest {d}/good.npy --store {new} --radius 1 --max-radius 0.5", r"--max-radius 0.5 is below --radius 1: "),
    ("ingest {d}/good.npy --store {new} --n-tables 5 --max-radius 3", r"--max-radius applies where the ingest chooses --n-tables and --bucket-width for each scale of the index"),
    # sample
    ("sample --store {store} --query-row 1 --n-samples 100000000000", r"The --n-samples option of fairpipe sample must be an integer from 1 to 100000000. Got 100000000000 instead\."),
    ("sample --store {store} --query-row 1 --n-samples 0", r"--n-samples .* Got 0 instead\."),
    ("sample --store {store} --query-row 1 --seed -4", r"The --seed option of fairpipe sample must be an integer from 0 to " + MAX + r". Got -4 instead\."),
    ("sample --store {store} --query-row -1", r"The --query-row option of fairpipe sample must be a non-negative integer. Got -1 instead\."),
    ("sample --store {store} --query-row 1 --radius -1", r"--radius .* must be a positive float. Got -1.0 instead\."),
    ("sample --store {store} --query-row 1 --c nan", r"--c .* Got nan instead\."),
    ("sample --store {store} --query-id 99999999999999999999", r"Id 99999999999999999999 given to --query-id is too large; ids are integers from 0 to " + MAX),
    ("sample --store {store} --query-id -3", r"Id -3 given to --query-id is negative"),
    # forget and request-deletion: one rule for ids
    ("forget --store {store} --ids 99999999999999999999", r"Id 99999999999999999999 in --ids is too large; ids are integers from 0 to " + MAX + r"\."),
    ("forget --store {store} --ids 9223372036854775808", r"Id 9223372036854775808 in --ids is too large"),
    ("forget --store {store} --ids 12345678901234567890123", r"Id 12345678901234567890123 in --ids is too large"),
    ("forget --store {store} --ids-file {d}/ids_2_64.txt", r"Id 18446744073709551616 on line 2 of ids_2_64.txt is too large"),
    ("forget --store {store} --ids-file {d}/ids_2d.npy", r"Ids in ids_2d.npy must be a list \(one dimension\). Got an array of shape \(2, 10\)\."),
    ("forget --store {store} --ids-file {d}/ids_uint.npy", r"Id 9223372036854775808 in row 2 of ids_uint.npy is too large"),
    ("forget --store {store} --ids-file {d}/ids_neg.csv", r"Id -3 on line 3 of ids_neg.csv is negative"),
    ("forget --store {store} --ids 1.5", r"Id 1.5 in --ids is not an integer"),
    ("forget --store {store} --ids 1e5", r"Id 1e5 in --ids is written with an exponent"),
    ("forget --store {store} --ids 3 --max-batch 0", r"The --max-batch option of fairpipe forget must be a positive integer. Got 0 instead\."),
    ("forget --store {store} --ids 3,-1", r"Id -1 in --ids is negative"),
    ("request-deletion --store {store} --ids -1", r"Id -1 in --ids is negative; ids are integers from 0 to " + MAX + r"\."),
    ("request-deletion --store {store} --ids 99999999999999999999", r"Id 99999999999999999999 in --ids is too large"),
    ("request-deletion --store {store} --ids-file {d}/ids_2d.npy", r"Ids in ids_2d.npy must be a list"),
    ("request-deletion --store {store}", r"Give exactly one of --ids or --ids-file\."),
    ("backfill --store {store} --ids-file {d}/ids_2_64.txt --batch-size 0", r"The --batch-size option of fairpipe backfill must be an integer from 1 to 1000000\. Got 0"),
    ("backfill --store {store} --ids-file {d}/ids_2_64.txt --batch-size 1000001", r"The --batch-size option of fairpipe backfill must be an integer from 1 to 1000000\. Got 1000001"),
    # configure
    ("configure --store {store} --erasure-retention 99999999999999999999d", r"erasure_retention must be at most 36500d \(100 years\); got '99999999999999999999d'\."),
    ("configure --store {store}", r"Give --erasure-retention, --max-radius or both\."),
    ("configure --store {store} --max-radius -1", r"The --max-radius option of fairpipe configure must be a positive float\. Got -1.0 instead\."),
    ("configure --store {store} --max-radius inf", r"--max-radius .* Got inf instead\."),
    ("configure --store {store} --erasure-retention -1d", r"erasure_retention must be a duration >= 0"),
    ("configure --store {store} --erasure-retention 0 --lock-timeout nan", r"--lock-timeout .* Got nan instead\."),
    # fit
    ("fit --store {store} --n-clusters 3 --fanout 1", r"The --fanout option of fairpipe fit must be an integer >= 2. Got 1 instead\."),
    ("fit --store {store} --n-clusters 0", r"The --n-clusters option of fairpipe fit must be a positive integer. Got 0 instead\."),
    ("fit --store {store} --n-clusters 3 --height 0", r"--height .* Got 0 instead\."),
    ("fit --store {store} --n-clusters 3 --height 100", r"'fanout' \*\* 'height' = 8 \*\* 100 leaves; at most 16777216 .* \(options --fanout, --height\)"),
    ("fit --store {store} --n-clusters 3 --max-iter -1", r"--max-iter .* Got -1 instead\."),
    ("fit --store {store} --n-clusters 3 --n-init 0", r"--n-init .* Got 0 instead\."),
    ("fit --store {store} --n-clusters 3 --n-init 1000000000000", r"The --n-init option of fairpipe fit must be an integer from 1 to 1000"),
    ("fit --store {store} --n-clusters 3 --epsilon nan", r"--epsilon .* Got nan instead\."),
    ("fit --store {store} --n-clusters 3 --balance 1", r"The --balance option of fairpipe fit must be in \(0, 1\). Got 1.0 instead\."),
    ("fit --store {store} --n-clusters 3 --seed -1", r"--seed .* Got -1 instead\."),
    ("fit --store {store} --n-clusters 3 --workers 100000", r"--workers .* from 1 to 64. Got 100000 instead\."),
    # checked against the store before anything starts (flows/checks.py)
    ("forget --store {new} --ids 3", r"There is no fairpipe store at .*new-store\. Run 'fairpipe ingest SOURCE"),
    ("forget --store {store} --ids 5000000,5000001", r"None of the 2 ids to forget is in the store .* \(first: 5000000\)\."),
    ("fit --store {new} --n-clusters 3", r"There is no fairpipe store at"),
    ("fit --store {store} --n-clusters 3 --model kmeans", r"The --model option of fairpipe fit must be one of 'dc', 'q', 'auto'\. Got 'kmeans' instead\."),
    ("fit --store {store} --n-clusters 100000", r"n_clusters = 100000 is larger than the 1797 live points of the store"),
    ("summarize --store {store} --k 3", r"No fairness bounds: give --lower and --upper \(fractions of k\) or --bounds FILE\.json\."),
    ("summarize --store {store} --k 100000 --lower 0", r"k = 100000 is larger than the 1797 elements of the store"),
    ("summarize --store {store} --k 3 --lower 0 --utility median", r"The --utility option of fairpipe summarize must be one of 'exemplar', 'facility'"),
    ("summarize --store {new} --k 3 --lower 0", r"There is no fairpipe store at"),
    ("backfill --store {new} --ids-file {d}/ids_neg.csv", r"There is no fairpipe store at"),
    ("backfill --store {store} --ids-file {d}/missing.txt", r"The ids file .*missing.txt does not exist\."),
    # what --store names, and an append against the store, before anything starts
    ("ingest {d}/good.npy --store {d}/folder", r"folder is not a fairpipe store \(the folder holds notes.txt\)\. Give an empty or new folder"),
    ("ingest {d}/good.npy --store {d}/good.csv", r"good.csv is not a fairpipe store \(it is a file\)\."),
    ("ingest {d}/good.npy --store {store}", r"good.npy holds 3-dimensional points; the store .* holds 64-dimensional points\."),
    ("ingest digits --store {store} --seed 5", r"--seed 5 contradicts the store .*, built with --seed 3\. An append keeps the store's settings"),
    ("ingest {d}/d64.npy --store {store} --ids-file {d}/ids_0.npy", r"Id 0 of d64.npy is already in the store .*; ids must be unique\."),
    ("ingest mnist:{d}/nothing --store {new}", r"Data file '.*nothing' does not exist\."),
    ("forget --store {store} --ids 3 --reason " + "r" * 10_001, r"A deletion request's reason holds at most 10,000 characters; got 10,001\.$"),
    ("forget --store {store} --ids-file {d}/many_ids.txt", r"A deletion request holds at most 1,000,000 ids; got 1,000,001\. File a larger backlog with 'fairpipe backfill'"),
    ("rerank {d}/good.csv --out {new}.txt", r"--out must end in .csv or .parquet\. Got '.*new-store.txt'\."),
    # summarize, predict, rerank, audit, demo
    ("summarize --store {store} --k 3 --lower 0.1 --fanout 1", r"The --fanout option of fairpipe summarize must be an integer >= 2"),
    ("summarize --store {store} --k 3 --lower 0 --height 50", r"8 \*\* 50 leaves; at most 16777216"),
    ("summarize --store {store} --k 3 --lower nan", r"The --lower option of fairpipe summarize must be a fraction from 0 to 1. Got nan instead\."),
    ("summarize --store {store} --k 3 --upper 2", r"--upper .* Got 2.0 instead\."),
    ("summarize --store {store} --k 3 --lower 0 --eval-size 0", r"--eval-size .* Got 0 instead\."),
    ("summarize --store {store} --k 3 --lower 0 --eval-size 1000000000000", r"--eval-size .* from 1 to 65536\. Got 1000000000000"),
    ("predict --store {store} --query-row -2", r"--query-row .* Got -2 instead\."),
    ("rerank {d}/good.csv --out {new}.csv --k 0", r"The --k option of fairpipe rerank must be a positive integer"),
    ("rerank {d}/good.csv --out {new}.csv --smoothing nan", r"--smoothing .* Got nan instead\."),
    ("rerank {d}/good.csv --out {new}.csv --desired {d}/nan_share.json", r"nan_share.json must hold a JSON object .*; group '0' has the share nan, not a number >= 0\."),
    ("audit --protected sex --n-seeds 0", r"The --n-seeds option of fairpipe audit must be a positive integer"),
    ("audit --protected sex --seed -1", r"--seed .* Got -1 instead\."),
    ("demo --store {new} --n-queries 0", r"The --n-queries option of fairpipe demo must be an integer from 1 to 1000. Got 0"),
    ("demo --store {new} --n-queries 100000000", r"--n-queries .* Got 100000000 instead\."),
]  # fmt: skip


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: its size and modification time."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            st = (Path(root) / name).stat()
            out[str(Path(root, name).relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize(("line", "message"), CASES, ids=[c[0][:60] for c in CASES])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(
    line, message, data, digits_store, tmp_path, monkeypatch
):
    store = digits_store[0]
    new = tmp_path / "new-store"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a bug would leave a report
    args = [a.format(d=data, new=new, store=store) for a in line.split()]
    if args[-1] == "--store":
        args.append("")
    started = []  # a command that runs a flow starts its Prefect server after its checks
    monkeypatch.setattr(
        fairpipe.flows.cli._runner, "launch_early", lambda: started.append("server")
    )
    before = listing(store)
    out = runner.invoke(app, args, catch_exceptions=False)
    assert (out.exit_code, out.stdout) == (2, ""), out.stderr
    (one,) = out.stderr.splitlines()
    assert one.startswith("error: ") and re.search(message, one), one
    assert "np." not in one  # plain values, never numpy reprs
    assert not new.exists() and not Path(f"{new}.csv").exists()
    assert list(cwd.iterdir()) == []
    assert listing(store) == before
    assert not (tmp_path / "cache").exists()
    assert started == []


BUSY_CASES = [
    "fit --store {store} --n-clusters 3",
    "summarize --store {store} --k 3 --lower 0",
    "forget --store {store} --ids 3",
    "backfill --store {store} --ids-file {ids}",
    "ingest digits --store {store}",
    "configure --store {store} --max-radius 1000",
]


@pytest.mark.parametrize("line", BUSY_CASES, ids=[c.split()[0] for c in BUSY_CASES])
def test_a_busy_store_is_refused_before_anything_starts(line, digits_store, tmp_path, monkeypatch):
    """Another writer holds the store's lock, and the command waits for none (--lock-timeout 0,
    the default): exit 3 at once, naming the holder; nothing started or filed."""
    import fcntl

    store = digits_store[0]
    (tmp_path / "ids.txt").write_text("3\n")
    args = line.format(store=store, ids=tmp_path / "ids.txt").split()
    started = []
    monkeypatch.setattr(
        fairpipe.flows.cli._runner, "launch_early", lambda: started.append("server")
    )
    before = listing(store)
    fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        out = runner.invoke(app, args, catch_exceptions=False)
    finally:
        os.close(fd)
    assert (out.exit_code, out.stdout) == (3, ""), out.stderr
    (one,) = out.stderr.splitlines()
    assert one.startswith(f"error: Store {store} is being written by another process"), one
    assert started == [] and listing(store) == before
