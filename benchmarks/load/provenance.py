"""Where a load result came from: the code (git commit, dirty or not), when, on what machine
(cores, load average), with which Python and libraries, and the exact command."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


RESULTS = "benchmarks/results"
"""What the benchmarks write, not code: a result saved by the first part of a benchmark run must
not make the tree the next part measures count as dirty (its runs would never join the first's)."""


def dirty(root: Path) -> bool:
    """Whether a tracked file other than the benchmarks' results differs from the commit."""
    return bool(_git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS}"))


def provenance(root: Path, argv: list[str]) -> dict:
    return {
        "git_commit": _git(root, "rev-parse", "HEAD"),
        "git_branch": _git(root, "rev-parse", "--abbrev-ref", "HEAD"),
        "git_dirty": dirty(root),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("torch", "transformers", "aiohttp", "pydantic", "echo2")},
        "load_average_start": list(os.getloadavg()),
        "command": shlex.join([sys.executable, str(Path(sys.argv[0])), *argv]),
    }


def same_code(earlier: dict | None, now: dict) -> bool:
    """Whether a result written earlier (its provenance `earlier`) measured the code `now` does:
    the same commit, neither tree dirty. Only then may a benchmark add its new runs to it."""
    return (bool(earlier) and earlier.get("git_commit") == now["git_commit"]
            and not earlier.get("git_dirty", True) and not now["git_dirty"])
