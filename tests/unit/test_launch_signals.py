"""A role the launcher starts stops on SIGTERM within the grace period: the mask the launcher
holds around each fork must not reach the child (it once did, and every role was SIGKILLed
without writing its final metrics)."""

from __future__ import annotations

import signal
import time

from echo2.launch.children import stop_children
from echo2.launch.local import _spawn


def test_a_spawned_role_stops_on_sigterm_not_sigkill(tmp_path):
    children: list = []
    # `echo2 worker` with nothing to reach: it would retry for minutes; SIGTERM must end it
    child = _spawn(children, "worker-0", ["worker", "--coordinator", "http://127.0.0.1:9"], logs=tmp_path,
                   env={})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "SigBlk" not in _status(child.pid):
            time.sleep(0.05)
        time.sleep(1.0)  # past the interpreter start, into the CLI
        blocked = int(_field(_status(child.pid), "SigBlk"), 16)
        assert not blocked & (1 << (signal.SIGTERM - 1)), "SIGTERM is blocked in the child"
        started = time.monotonic()
        stop_children(children, grace_s=20.0)
        assert child.process.returncode != -signal.SIGKILL
        assert time.monotonic() - started < 20.0
    finally:
        if child.process.poll() is None:
            child.process.kill()
            child.process.wait(timeout=10)


def _status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _field(status: str, name: str) -> str:
    return next(line.split()[1] for line in status.splitlines() if line.startswith(name + ":"))
