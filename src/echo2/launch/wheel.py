"""The exact echo2 the coordinator runs, as a wheel for the machines it starts workers on: built
once per content of the source tree (a version number alone would not tell two commits apart)
and kept in the run's cache dir."""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

from echo2.launch.ssh_host import Release

BUILD_TIMEOUT_S = 300.0


def source_root() -> Path | None:
    """The source tree this echo2 runs from (an editable install), or None (an installed wheel)."""
    root = Path(__file__).resolve().parents[3]  # src/echo2/launch/wheel.py
    return root if (root / "pyproject.toml").is_file() and (root / "src" / "echo2").is_dir() else None


def source_digest(root: Path) -> str:
    """A hash of what the wheel is made of: the package's files and the project's metadata."""
    digest = hashlib.sha256()
    files = [root / "pyproject.toml", *sorted(p for p in (root / "src" / "echo2").rglob("*")
                                              if p.is_file() and "__pycache__" not in p.parts)]
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def coordinator_release(cache_dir: Path) -> Release:
    """This echo2 as a wheel (built here, or reused from `cache_dir`)."""
    root = source_root()
    if root is None:
        raise RuntimeError("echo2 runs from an installed wheel, not a source tree: the ssh provider ships the "
                           "coordinator's own source; install echo2 from a checkout (pip install -e .)")
    version = importlib.metadata.version("echo2")
    key = source_digest(root)
    out = Path(cache_dir) / "wheels" / key
    found = sorted(out.glob("echo2-*.whl")) if out.is_dir() else []
    if not found:
        out.mkdir(parents=True, exist_ok=True)
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                                "-w", str(out), str(root)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        found = sorted(out.glob("echo2-*.whl"))
        if built.returncode != 0 or not found:
            raise RuntimeError(f"building echo2's wheel failed: {built.stderr.strip()[-500:]}")
    return Release(wheel=found[0], version=f"{version}-{key}")
