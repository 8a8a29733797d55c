"""The dependency rule: control-plane packages import without torch, so the coordinator, the
planner and the CLI start fast and run on machines without it."""

from __future__ import annotations

import subprocess
import sys

TORCH_FREE = [
    "echo2.config", "echo2.protocol.messages", "echo2.protocol.http", "echo2.protocol.manifest",
    "echo2.coordinator.state", "echo2.coordinator.http.server", "echo2.coordinator.main",
    "echo2.coordinator.scoring.replay", "echo2.tasks",
    "echo2.envs.task", "echo2.envs.play",
    "echo2.planner", "echo2.policy", "echo2.report.summary", "echo2.report.render", "echo2.launch.local", "echo2.cli",
]


def test_control_plane_imports_without_torch():
    code = "; ".join(
        ["import sys, importlib", f"[importlib.import_module(m) for m in {TORCH_FREE!r}]",
         "from echo2.cli import build_parser", "build_parser()",
         "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]"]
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


WIRE_TYPES = ["echo2.protocol.messages", "echo2.protocol.manifest", "echo2.protocol.broadcast",
              "echo2.protocol.links"]  # the seams are typing only
RUNTIME = ["aiohttp", "cryptography", "torch"]


def test_message_types_import_without_the_broadcast_runtime():
    """The wire messages are data: reading or validating one needs neither the HTTP stack nor the
    signature library (a tool that only parses metrics or messages stays light)."""
    code = "; ".join(
        ["import sys, importlib", f"[importlib.import_module(m) for m in {WIRE_TYPES!r}]",
         f"loaded = [m for m in {RUNTIME!r} if m in sys.modules]", "assert not loaded, loaded"]
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
