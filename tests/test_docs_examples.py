"""Every shell example of README.md and the command pages docs/reference/commands-*.md runs as
written.

The convention (stated in docs/guide/first-hour.md): a ```console block is a session, each
line starting with ``$ `` a command (a line ending in ``\\`` continues it; ``#`` starts a
comment) and the lines after it what it prints; a ```sh block holds commands only; a ```text
block (a synopsis, or output alone) does not run. The blocks of one page (or of the command
pages, one page after another) run in order, in one folder that starts empty (later examples
use the stores that earlier ones made), beside ``../shared/data`` as the repository is: the
data sets the examples read are there, the rest they make themselves or come built in
(``digits``, ``gaussian``).

A command runs as written: ``fairpipe`` commands in this process (typer's runner: the program's
own code, without a Python start and imports per command), anything else in a shell with the
virtual environment's ``bin`` first on the PATH. A command whose printed output starts with
``error:`` must fail with that message (numbers aside: ids, counts, commits and times vary);
every other command must exit 0. Output other than errors is not compared: it holds commit ids,
timings and samples.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[1]
# The command pages, in the order their examples run: one after another, in one folder (later
# pages use the stores and files that earlier ones made).
COMMAND_PAGES = (
    "docs/reference/commands-shared.md",
    "docs/reference/commands-data.md",
    "docs/reference/commands-models.md",
    "docs/reference/commands-forgetting.md",
    "docs/reference/commands-inspect.md",
    "docs/reference/commands-tools.md",
    "docs/reference/commands-errors.md",
)
# What the test runs, each in its own folder: a page, or the command pages as one.
PAGES = {"README.md": ("README.md",), "docs/reference": COMMAND_PAGES}
DOCS = tuple(PAGES)
RUN_FENCES = {"console", "sh", "bash"}

# The examples that do not run here, each with its reason (the command as the page writes it).
NOT_RUN = {
    "make demo": "makes a virtual environment and installs the stack; it runs `fairpipe demo`, "
    "which tests/flows/test_demo.py runs on fewer queries",
    "make test": "runs this whole suite (and ruff and mypy) again",
    "fairpipe demo --store /tmp/fpdocs/demo --plot /tmp/fpdocs/demo.png": "takes about 50 s on "
    "2 cores; tests/flows/test_demo.py runs the demo on fewer queries",
    "fairpipe audit --dataset adult --protected age --out audit_adult": "takes about 60 s on 2 "
    "cores; tests/flows/test_audit_flow.py runs the audit flow",
    "fairpipe audit --dataset german --protected sex --train-iter 1000 --n-seeds 600 --retrain "
    "--out audit_german": "takes about 70 s on 2 cores; tests/flows/test_audit_flow.py retrains",
    "fairpipe audit --dataset german --protected sex --model audit_adult/model.pkl": "needs the "
    "model the Adult audit above writes; tests/audit/test_adf.py checks the message",
    "fairpipe verify --store people": "needs a damaged chunk; tests/storage/test_integrity.py "
    "damages one and checks verify's report",
    "fairpipe sample --store people --query-row 2048": "needs a damaged chunk; "
    "tests/storage/test_integrity.py checks every command's line and exit 4",
    "fairpipe verify --store damaged": "needs a manifest that lost a chunk reference; "
    "tests/storage/test_manifests.py makes one and checks verify's report",
    "fairpipe sample --store damaged --query-row 5": "needs a manifest that lost a chunk "
    "reference; tests/test_hostile_cases.py checks every reader's line and exit 4",
    "fairpipe verify --store old --add-checksums": "needs a store written before chunks carried "
    "checksums; tests/storage/test_integrity.py makes one and adds them",
    "fairpipe fit --store people --n-clusters 5": "needs another process writing the store; "
    "tests/cli/test_errors.py holds its lock and checks the message",
    "fairpipe forget --store /mnt/ro/people --ids 7": "needs a read-only mount; "
    "tests/cli/test_filesystems.py mounts one",
    "fairpipe ingest big.csv --store /mnt/small/people": "needs a full filesystem; "
    "tests/cli/test_filesystems.py fills one",
}
# Shell syntax that a command run in this process cannot have.
SHELL = re.compile(r"[|&;<>`$()*?]")
# How the printed error and the page's are compared: numbers (ids, counts, pids, times) and
# commit ids vary from run to run.
NUMBER = re.compile(r"[0-9A-Z]{20}|\d+(\.\d+)?")


@dataclass
class Example:
    doc: str
    line: int
    command: str
    output: list[str] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        """The error the page shows this command print, if any."""
        return next((line for line in self.output if line.startswith("error: ")), None)


def examples(doc: str) -> list[Example]:
    """The commands of the ```console and ```sh blocks of the page, or of the pages ``doc`` names
    in ``PAGES`` one after another, in order, with their output."""
    return [example for page in PAGES.get(doc, (doc,)) for example in page_examples(page)]


def page_examples(doc: str) -> list[Example]:
    """The commands of the page's ```console and ```sh blocks, in order, with their output."""
    found: list[Example] = []
    fence: str | None = None
    indent = 0
    lines = (REPO / doc).read_text().splitlines()
    continued = False
    block_start = 0  # the number of examples found before this block
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip() if fence is None else None
            indent = len(raw) - len(raw.lstrip())
            continued, block_start = False, len(found)
            continue
        if fence not in RUN_FENCES:
            continue
        line = raw[indent:]
        if continued:
            found[-1].command += " " + line.strip()
        elif fence == "console" and line.startswith("$ "):
            found.append(Example(doc, number, line[2:].strip()))
        elif fence != "console" and stripped:
            found.append(Example(doc, number, stripped))
        elif fence == "console" and len(found) > block_start:
            found[-1].output.append(line)
        continued = bool(found) and found[-1].command.endswith("\\")
        if continued:
            found[-1].command = found[-1].command[:-1].rstrip()
    return found


def shown(command: str) -> str:
    """The command without its comment, as NOT_RUN names it."""
    return " ".join(shlex.split(command, comments=True))


def run(example: Example, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """(exit code, stdout and stderr) of the example's command."""
    argv = shlex.split(example.command, comments=True)
    if argv[0] == "fairpipe" and not SHELL.search(example.command.split("#")[0]):
        from fairpipe.flows.cli import app

        result = CliRunner().invoke(app, argv[1:], catch_exceptions=True)
        return result.exit_code, result.stdout + result.stderr
    done = subprocess.run(
        example.command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr


def normalised(message: str) -> str:
    return " ".join(NUMBER.sub("#", message).split())


def page_folder(folder: Path) -> tuple[Path, dict[str, str]]:
    """The empty folder a page's examples run in (``folder/work``, beside a ``shared`` link to
    the data sets, as the repository sits), and the environment of the commands run in a shell:
    the virtual environment's ``bin`` first on the PATH, the repository importable."""
    (folder / "shared").symlink_to(SHARED_DATA.parent, target_is_directory=True)
    cwd = folder / "work"
    cwd.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return cwd, env


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_every_shell_example_runs_as_written(doc, prefect_server, tmp_path, monkeypatch):
    if not SHARED_DATA.is_dir():
        pytest.fail(f"{SHARED_DATA} is missing: the examples read the real data sets from there")
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    cwd, env = page_folder(tmp_path)
    monkeypatch.chdir(cwd)
    problems, ran, timings = [], 0, []
    for example in examples(doc):
        where = f"{doc}:{example.line}: $ {example.command}"
        if shown(example.command) in NOT_RUN:
            continue
        start = time.perf_counter()
        code, printed = run(example, cwd, env)
        timings.append((time.perf_counter() - start, where))
        ran += 1
        got = next((line for line in printed.splitlines() if line.startswith("error: ")), None)
        if example.error is None and code != 0:
            problems.append(f"{where}\n  exit {code}: {printed.strip()[-600:]}")
        elif example.error is not None and (
            code not in (2, 3, 4) or got is None or normalised(got) != normalised(example.error)
        ):
            problems.append(f"{where}\n  exit {code}, printed: {got or printed.strip()[-600:]}"
                            f"\n  the page shows:  {example.error}")  # fmt: skip
    slowest = sorted(timings, reverse=True)[:5]
    print("\n".join(f"{seconds:6.1f} s  {where}" for seconds, where in slowest))
    assert not problems, "\n".join(problems)
    assert ran >= 5


def test_the_pages_have_runnable_examples_and_the_skipped_ones_exist():
    """The parser finds the examples (a fence renamed by mistake would silently run none), and
    every command NOT_RUN names is still on a page."""
    commands = {shown(e.command) for doc in DOCS for e in examples(doc)}
    assert set(NOT_RUN) <= commands, set(NOT_RUN) - commands
    assert len(examples("README.md")) >= 6 and len(examples("docs/reference")) >= 40


def rewrite(doc: str, folder: Path) -> int:
    """Run the page's examples (or those of the pages ``doc`` names in ``PAGES``) as the test does
    (in ``folder``, empty, beside ``shared``) and write what each prints under it, in place of
    what the page shows. The examples NOT_RUN keep their output. Returns the number of examples
    rewritten.

    ``python -m tests.test_docs_examples docs/reference`` (with ``fairpipe server start``
    running, or a Prefect server per command)."""
    cwd, env = page_folder(folder)
    os.chdir(cwd)
    pages = {page: (REPO / page).read_text().splitlines() for page in PAGES.get(doc, (doc,))}
    replaced: dict[str, list[tuple[int, int, list[str]]]] = {page: [] for page in pages}
    for example in examples(doc):
        if shown(example.command) in NOT_RUN:
            continue
        code, printed = run(example, cwd, env)
        if not example.output:
            continue  # an example shown without output keeps none
        lines = pages[example.doc]
        first = example.line  # the line after the command (its continuations included)
        while lines[first - 1].rstrip().endswith("\\"):
            first += 1
        indent = " " * (len(lines[example.line - 1]) - len(lines[example.line - 1].lstrip()))
        new = [indent + line.rstrip() for line in printed.rstrip("\n").splitlines()]
        replaced[example.doc].append((first, first + len(example.output), new))
        print(f"{example.doc}:{example.line}: exit {code}: {example.command}", file=sys.stderr)
    for page, lines in pages.items():
        for start, stop, new in reversed(replaced[page]):
            lines[start:stop] = new
        (REPO / page).write_text("\n".join(lines) + "\n")
    return sum(map(len, replaced.values()))


if __name__ == "__main__":
    import tempfile

    for page in sys.argv[1:] or DOCS:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"{page}: {rewrite(page, Path(tmp))} outputs rewritten", file=sys.stderr)
