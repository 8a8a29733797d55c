"""Import hygiene (no torch for the coordinator) and the netns lab's environment probe."""

from __future__ import annotations

import subprocess
import sys


def test_broadcast_imports_without_torch() -> None:
    code = ("import sys, echo2.broadcast, echo2.config.broadcast, echo2.broadcast.lab.experiment; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False"


def test_netns_lab_says_why_it_cannot_run_without_root(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from echo2.broadcast.lab import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.netns_unavailable_reason() == "network namespaces need root (running as uid 1000)"
