"""What a command checks against its store before Prefect or Dask start, and whether its work is
small enough for threads (flows/checks.py). The bad inputs themselves, through the command
line: tests/cli/test_bad_input.py."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

from fairpipe.flows import checks


def test_small_work_runs_on_threads_and_nothing_here_imports_prefect(digits_store, tmp_path):
    store = str(tmp_path / "people")
    shutil.copytree(digits_store[0], store)
    # The shared store may hold requests other tests filed: this copy starts with none.
    shutil.rmtree(Path(store) / "queue", ignore_errors=True)
    checks.check_fit(store, 3, "dc")
    assert checks.small_store(store) and store not in checks._checked  # asked once
    checks.check_forget(store, [1, 2])
    assert checks.small_forget(store, np.array([1, 2]))
    assert checks.small_forget(store, None)  # a drain of an empty queue
    assert not checks.small_forget(store, np.arange(checks.SMALL_IDS + 1))
    from fairpipe.storage.queue import file_request

    file_request(store, np.array([5]))
    assert not checks.small_forget(store, np.array([1]))  # another request to drain with it


def test_the_checks_import_neither_prefect_nor_dask(digits_store):
    import subprocess

    code = (
        "import sys; from fairpipe.flows import checks; s = sys.argv[1]; checks.check_fit(s, 3, 'dc'); "
        "checks.check_summarize(s, 5, 0.0, None, None); checks.check_forget(s, [1]); "
        "checks.small_forget(s, [1]); "
        "print(sorted(m for m in ('prefect', 'distributed', 'dask') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(digits_store[0])], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stderr
