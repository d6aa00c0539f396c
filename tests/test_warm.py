"""fairpipe.warm compiles every kernel the estimators call (make test runs it first)."""

from __future__ import annotations

import json
import subprocess
import sys

# In a process of its own: the kernels this one has compiled do not count.
UNCOMPILED = """
import importlib, json, pkgutil, sys
import numba.extending
import fairpipe
from fairpipe.warm import warm_kernels
for m in pkgutil.walk_packages(fairpipe.__path__, "fairpipe."):
    if not m.name.startswith(("fairpipe.storage", "fairpipe.flows")):
        importlib.import_module(m.name)
warm_kernels()
kernels = {f"{mod.__name__}.{name}": v for mod in list(sys.modules.values())
           if getattr(mod, "__name__", "").startswith("fairpipe")
           for name, v in vars(mod).items()
           if numba.extending.is_jitted(v) and v.__module__ == mod.__name__}
# A kernel called only by other kernels is compiled into them (and, loaded from numba's cache
# with them, shows no signature of its own).
inner = {name for v in kernels.values() for name in v.py_func.__code__.co_names}
print(json.dumps([k for k, v in kernels.items()
                  if k.rsplit(".", 1)[1] not in inner and not v.signatures]))
"""


def test_warm_kernels_runs_every_kernel_the_estimators_call():
    out = subprocess.run([sys.executable, "-c", UNCOMPILED], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    missing = json.loads(out.stdout.strip().splitlines()[-1])
    assert missing == [], f"fairpipe.warm.warm_kernels does not run {missing}: add a call"
