"""One measurement per fresh interpreter, for benchmarks whose numbers a previous measurement in
the same process would skew (peak memory is per process; vLLM takes over thread settings).
Shared by learner_memory.py and engines.py: the parent calls `run_point`, the script's own
`--child JSON` entry calls `child_main`."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable


def run_point(script: str, point: dict, timeout_s: float = 3600) -> dict:
    """Run `script --child POINT` and return `point` updated with what it printed (its last line,
    JSON), or with `error` (its last stderr lines) when it failed; `wall_s` either way."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, script, "--child", json.dumps(point)], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        return {**point, "error": " | ".join(proc.stderr.strip().splitlines()[-3:]),
                "wall_s": time.perf_counter() - started}
    return {**point, **json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": time.perf_counter() - started}


def child_main(child_json: str, measure: Callable[[dict], dict]) -> int:
    print(json.dumps(measure(json.loads(child_json))))
    return 0


def machine(device: str) -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
           "platform": platform.platform()}
    if device != "cpu" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out
