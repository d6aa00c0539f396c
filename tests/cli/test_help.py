"""Every command's ``--help``: rendered whole (no option text lost to markup), a default or
[required] for every option, choices listed, one or two examples that parse as written, and
the commands in workflow order.

Every example parses (its flags and values). The examples on the digits store run as written on
the session's digits store (the read-only ones) or a copy of it (the ones that write), with
rerank's and backfill's, which make their own data: about 5 s. Those of ingest, demo, audit and
server start a cluster, a Prefect server or a search of tens of seconds each; they are parsed
only (tests/flows/test_demo.py and tests/cli/test_server.py run those commands)."""

import re
import shlex

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from fairpipe.flows.cli import WORKFLOW_ORDER, app

runner = CliRunner()
WIDE = {"terminal_width": 500, "max_content_width": 500}  # no line is wrapped


def _commands(group=None, path=()):
    group = group or get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = dict(_commands())
IDS = [" ".join(path) for path in COMMANDS]


def _help(path) -> str:
    out = runner.invoke(app, [*path, "--help"], **WIDE)
    assert out.exit_code == 0, out.output
    return out.stdout


def _flat(text: str) -> str:
    return " ".join(text.split())


def examples(help_text: str) -> list[str]:
    """The example command lines of a help text (the lines starting with 'fairpipe ')."""
    return [line.strip() for line in help_text.splitlines() if line.strip().startswith("fairpipe ")]


@pytest.mark.parametrize("path", COMMANDS, ids=IDS)
def test_help_shows_every_option_whole_with_its_default_and_an_example(path):
    text = _help(path)
    flat = _flat(text)
    for param in COMMANDS[path].params:
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        if param.help:  # every character of the option's text is shown (none read as markup)
            assert _flat(param.help) in flat, (path, param.name)
        if param.param_type_name == "option":
            (line,) = [ln for ln in text.splitlines()
                       if ln.strip().startswith(param.opts[0] + " ") or ln.strip() == param.opts[0]]  # fmt: skip
            rest = text[text.index(line) :].split("\n  -", 1)[0]
            assert "[default: " in rest or "[required]" in rest, (path, param.opts[0])
            assert "<str>" not in line or param.metavar is None, line
    assert examples(text), f"fairpipe {' '.join(path)} --help shows no example"


@pytest.mark.parametrize("path", COMMANDS, ids=IDS)
def test_every_example_parses_as_written(path):
    for line in examples(_help(path)):
        words = shlex.split(line)[1:]
        assert words[: len(path)] == list(path), line
        command = COMMANDS[path]
        command.make_context(" ".join(path), words[len(path) :])  # raises on a bad option


def test_the_choices_shown_are_the_librarys():
    from fairpipe.datasets import SCALE_CHOICES
    from fairpipe.flows import cli
    from fairpipe.neighbors import MODES, SAMPLERS
    from fairpipe.ranking import ALGORITHMS
    from fairpipe.settings import BASELINES, TRAINABLE
    from fairpipe.summary import RULES, UTILITIES

    shown = {
        ("sample", "--sampler"): SAMPLERS, ("sample", "--mode"): MODES,
        ("summarize", "--utility"): UTILITIES, ("summarize", "--rule"): RULES,
        ("rerank", "--algorithm"): ALGORITHMS, ("fit", "--model"): ("dc", "q", "auto"),
        ("audit", "--baseline"): BASELINES, ("audit", "--train"): TRAINABLE,
        ("ingest", "--scale"): SCALE_CHOICES,
    }  # fmt: skip
    for (command, flag), values in shown.items():
        assert f"{flag} [{'|'.join(values)}]" in _help((command,)), (command, flag)
    assert cli is not None


def test_summarize_help_keeps_the_brackets_of_its_bounds_file():
    assert '{"group": [lower, upper], ...}' in _help(("summarize",))


def test_commands_are_listed_in_workflow_order():
    text = _help(())
    listed = re.findall(r"^  ([a-z-]+)  ", text.split("Commands:")[1], flags=re.M)
    assert listed == [name for name in WORKFLOW_ORDER if name in listed]
    assert listed[:3] == ["demo", "ingest", "info"] and set(listed) == set(
        get_command(app).commands
    )


READ_ONLY = ("info", "sample", "status", "receipts", "verify")


@pytest.mark.parametrize("name", READ_ONLY)
def test_the_read_only_examples_run_on_the_digits_store(digits_store, name):
    path, _ = digits_store
    for line in examples(_help((name,))):
        words = [str(path) if w == "digits.store" else w for w in shlex.split(line)[1:]]
        out = runner.invoke(app, words)
        assert out.exit_code == 0, (line, out.output)


WRITES = (
    "fit",
    "predict",
    "summarize",
    "request-deletion",
    "configure",
    "forget",
    "backfill",
    "rerank",
)


def _example_block(help_text: str) -> list[str]:
    """The lines of a help text's examples: its commands, and the shell lines making their data
    (a redirection into a file)."""
    block = help_text.split("Example", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in block.splitlines()[1:]]
    return [line for line in lines if line.startswith("fairpipe ") or " > " in line]


def test_the_examples_that_write_run_on_a_copy_of_the_digits_store(
    digits_store, tmp_path, monkeypatch
):
    """fit, predict (which needs fit's model), summarize, request-deletion, configure, forget,
    backfill and rerank, in that order, on a copy of the digits store (small work runs on
    threads); a line making an example's data (seq, printf) runs in the shell."""
    import shutil
    import subprocess

    shutil.copytree(digits_store[0], tmp_path / "digits.store")
    monkeypatch.chdir(tmp_path)
    for name in WRITES:
        for line in _example_block(_help((name,))):
            if not line.startswith("fairpipe "):
                subprocess.run(line, shell=True, check=True, cwd=tmp_path)
                continue
            out = runner.invoke(app, [*shlex.split(line)[1:], "--json"])
            assert out.exit_code == 0, (line, out.output)
