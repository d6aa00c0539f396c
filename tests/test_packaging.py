"""The wheel users install: one top-level package, ``fairpipe``, holding the folders storage/ and
flows/ as ``fairpipe.storage`` and ``fairpipe.flows`` (names of our own: ``storage`` and ``flows``
belong to other projects on the package index), and the command working from it alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_only_fairpipe_and_its_command_runs_from_it(tmp_path):
    # Built from a copy (the links fairpipe/storage and fairpipe/flows kept as links): setuptools
    # builds in the source folder, and would leave its build/ in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("fairpipe", "storage", "flows"):
        shutil.copytree(REPO / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "wheel"),
         str(source)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheel").glob("fairpipe-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"fairpipe"}
    for module in ("fairpipe/storage/reader.py", "fairpipe/flows/cli/__init__.py"):
        assert module in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fairpipe = fairpipe.flows.cli:main" in (tmp_path / "site" / entry).read_text()
    # The unpacked wheel ahead of the checkout's editable install: the command and the
    # packages load from it, and no top-level storage or flows exists.
    probe = (
        "import importlib.util, fairpipe.flows.cli, fairpipe.storage;"
        "print(fairpipe.storage.__file__);"
        "print([importlib.util.find_spec(m) for m in ('storage', 'flows')])"
    )
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, env=env, check=True).stdout.split("\n")  # fmt: skip
    assert got[0].startswith(str(tmp_path / "site" / "fairpipe" / "storage"))
    assert got[1] == "[None, None]"
    help_ = subprocess.run([sys.executable, "-m", "fairpipe.flows.cli", "--help"],
                           capture_output=True, text=True, cwd=tmp_path, env=env)  # fmt: skip
    assert help_.returncode == 0, help_.stderr
    assert "ingest" in help_.stdout
