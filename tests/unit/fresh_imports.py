"""Import each named echo2 module on its own, in a fresh echo2 import state: run as a script by
tests/unit/test_module_imports.py, module names on stdin (one a line), one JSON line per module
on stdout: {"module", "outcome": "ok" | "failed" | "skipped", "detail", "seconds"}.

The script first imports the heavy third-party libraries echo2 builds on (HEAVY_DEPS), and no
echo2 module, then forks one child per echo2 module: the child imports its module first thing
and exits. Every child so starts with no echo2 module loaded, which is what a circular import
depends on (which module of a cycle is imported first), and none pays for torch again.
Run it only as a script: it must stay free of echo2 imports itself.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

HEAVY_DEPS = (
    "torch", "torch.distributed.checkpoint.state_dict", "torch.distributed.fsdp", "torch.distributed.tensor",
    "torch.utils._sympy.functions", "numpy", "scipy.optimize", "scipy.special", "scipy.stats",
    "pydantic.main", "pydantic.fields", "pydantic.functional_validators", "pydantic.type_adapter", "aiohttp.web",
    "cryptography.x509", "cryptography.hazmat.primitives.asymmetric.ed25519", "safetensors.torch",
    "zstandard", "rich.console", "rich.progress", "rich.table", "prometheus_client", "simpy", "tomllib",
)
"""What nearly every child would import again: loaded once, before the forks (all installed
with echo2; transformers, datasets and the like load lazily inside echo2's functions)."""
SLOW_DEPS = ("transformers", "verifiers.v1")
"""Loaded once too where installed (the dev extra has both): the HF engine and the verifiers
environments import them at module level, and each such child took 4 to 12 s to load them again."""
OPTIONAL_DEPS = {"vllm": "the vllm extra", "wandb": "the wandb extra"}
"""Third-party packages echo2 may lack: a module whose import stops at a ModuleNotFoundError of
one of these is skipped, not failed (any other missing module is a failure)."""
CHILD_TIMEOUT_S = 120.0
OK, FAILED, SKIPPED = 0, 1, 3


def _child(module: str, report: Path) -> None:
    """In the forked child: import `module`, write what went wrong to `report`, exit."""
    with open(report, "w") as out:
        os.dup2(out.fileno(), 1)  # a module that prints at import must not garble the JSON lines
        os.dup2(out.fileno(), 2)
        code = OK
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            code = SKIPPED if missing in OPTIONAL_DEPS else FAILED
            out.write(f"needs {missing} ({OPTIONAL_DEPS[missing]})" if code == SKIPPED else traceback.format_exc())
        except BaseException:  # SystemExit and the like are failures of the module too
            code = FAILED
            out.write(traceback.format_exc())
        out.flush()
    os._exit(code)


def _outcome(status: int, report: Path) -> tuple[str, str]:
    code = os.waitstatus_to_exitcode(status)
    detail = report.read_text() if report.exists() else ""
    if code == OK:
        return "ok", ""
    if code == SKIPPED:
        return "skipped", detail
    return "failed", detail or f"the child exited with {code}"


def run(modules: list[str], workdir: Path, parallel: int) -> None:
    pending, running = list(reversed(modules)), {}
    while pending or running:
        while pending and len(running) < parallel:
            module = pending.pop()
            report = workdir / f"{module}.txt"
            pid = os.fork()
            if pid == 0:
                _child(module, report)
            running[pid] = (module, report, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            _kill_overdue(running)
            time.sleep(0.002)
            continue
        module, report, started = running.pop(pid)
        outcome, detail = _outcome(status, report)
        line = {"module": module, "outcome": outcome, "detail": detail, "seconds": time.monotonic() - started}
        print(json.dumps(line), flush=True)


def _kill_overdue(running: dict[int, tuple[str, Path, float]]) -> None:
    for pid, (_, report, started) in running.items():
        if time.monotonic() - started > CHILD_TIMEOUT_S and not report.with_suffix(".killed").exists():
            report.with_suffix(".killed").touch()
            with open(report, "a") as out:
                out.write(f"\nstill importing after {CHILD_TIMEOUT_S:.0f} s: killed (a hang at import)")
            os.kill(pid, 9)


def main() -> int:
    modules = [line.strip() for line in sys.stdin if line.strip()]
    for dep in HEAVY_DEPS:
        importlib.import_module(dep)
    for dep in SLOW_DEPS:
        try:
            importlib.import_module(dep)
        except ImportError:
            pass  # not installed: the children whose module needs it report that themselves
    # pydantic looks up its plugins (installed packages' entry points) at the first model class
    # it builds, then caches them: once here, not in every child
    importlib.import_module("pydantic").create_model("WarmUp", value=(int, 0))
    loaded = sorted(name for name in sys.modules if name == "echo2" or name.startswith("echo2."))
    if loaded:  # then the children would not start fresh
        print(json.dumps({"module": "-", "outcome": "failed", "detail": f"preloaded echo2 modules: {loaded}",
                          "seconds": 0.0}))
        return 1
    with tempfile.TemporaryDirectory(prefix="echo2-fresh-imports-") as workdir:
        run(modules, Path(workdir), parallel=max(1, os.cpu_count() or 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
