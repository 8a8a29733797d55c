"""Every echo2 module imports on its own, first thing in a fresh echo2 import state: what
`python -c "from echo2.tasks.answers import equivalent"` does on a fresh install, where a
circular import fails with "partially initialized module" when the cycle is entered from the
wrong end (an order other tests, having imported something else first, never see).

One subprocess (tests/unit/fresh_imports.py) loads the heavy third-party libraries once and
forks a child per module, so the ~190 modules take seconds, not one torch import each. It does
catch cycles: run on the tree before the import layers (config/run.py importing the task
schemas from echo2.tasks.registry, envs and tasks importing each other), 14 modules fail,
echo2.tasks.answers and echo2.tasks.base among them ("cannot import name 'Problem' from
partially initialized module 'echo2.tasks.base'"), while the rest of the suite passed there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest
from tools.import_graph import module_names

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
NOT_IMPORTED = {"echo2.__main__": "runs the CLI and exits (python -m echo2)"}
MODULES = sorted(set(module_names(SRC)) - set(NOT_IMPORTED))
BUDGET_S = 120.0
"""The whole run, ~190 forks on 2 cores, takes 13 s (30 s beside the rest of the suite on a
loaded machine); a subprocess per module, each importing torch again, would take minutes."""


@cache
def fresh_imports() -> dict[str, dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tests.unit.fresh_imports"], input="\n".join(MODULES), cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    elapsed_s = time.monotonic() - started
    outcomes = {line["module"]: line for line in map(json.loads, result.stdout.splitlines())}
    assert result.returncode == 0, result.stderr + result.stdout
    assert elapsed_s < BUDGET_S, f"importing every module alone took {elapsed_s:.0f} s"
    return outcomes


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module):
    outcome = fresh_imports().get(module)
    assert outcome is not None, f"{module}: no outcome reported"
    if outcome["outcome"] == "skipped":
        pytest.skip(f"{module} {outcome['detail']}")
    assert outcome["outcome"] == "ok", f"importing {module} first, in a fresh interpreter, fails:\n{outcome['detail']}"
