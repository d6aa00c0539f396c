"""A command aimed at a store that is not there says so and leaves the filesystem as it found it:
no folder of the path is made, by any command."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from fairpipe.flows.cli import app

runner = CliRunner()

COMMANDS = [
    ("info",),
    ("status",),
    ("receipts",),
    ("request-deletion", "--ids", "1"),
    ("fit", "--n-clusters", "3", "--workers", "1"),
    ("summarize", "--k", "3", "--workers", "1"),
    ("forget", "--ids", "1", "--workers", "1"),
    ("forget", "--workers", "1"),
    ("configure", "--erasure-retention", "1d"),
    ("sample", "--query-row", "0"),
    ("predict", "--query-row", "0"),
    ("backfill", "--ids-file", "IDS", "--workers", "1"),
    ("show", "--ids", "1"),
    ("history",),
    ("predict", "--query-id", "1"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_command_on_a_missing_store_makes_no_folder(prefect_server, tmp_path, command):
    (tmp_path / "ids.txt").write_text("1\n2\n")
    args = [str(tmp_path / "ids.txt") if a == "IDS" else a for a in command]
    missing = tmp_path / "a" / "b" / "c"
    out = runner.invoke(app, [*args, "--store", str(missing)])
    assert out.exit_code == 2, out.output
    assert f"There is no fairpipe store at {missing}" in out.stderr
    assert sorted(os.listdir(tmp_path)) == ["ids.txt"]


@pytest.mark.parametrize("command", COMMANDS[:5], ids=lambda c: " ".join(c[:2]))
def test_a_command_on_a_folder_that_is_not_a_store_writes_nothing_into_it(
    prefect_server, tmp_path, command
):
    (tmp_path / "ids.txt").write_text("1\n2\n")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a store")
    out = runner.invoke(app, [*command, "--store", str(folder)])
    assert out.exit_code == 2, out.output
    assert "is not a fairpipe store" in out.stderr or "no fairpipe store" in out.stderr
    assert os.listdir(folder) == ["notes.txt"]
