"""Child processes of the launcher: started with their output in a log file, watched, and stopped
by PID (SIGTERM, then SIGKILL after a grace period). Only our own children are ever signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from echo2.coordinator.parts.credentials import SECRET_VARIABLES

# time a child gets to flush metrics and close sockets after SIGTERM before SIGKILL
STOP_GRACE_S = 10.0


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 25) -> str:
        if not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def echo2_command(args: list[str], ranks: int = 1) -> list[str]:
    """`python -m echo2 ARGS`; with ranks > 1 under torchrun on this machine (`--standalone`
    picks a free rendezvous port itself, so runs side by side never race for one)."""
    if ranks == 1:
        return [sys.executable, "-m", "echo2", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "echo2", *args]


def start_child(name: str, args: list[str], log_dir: Path, *, env: dict[str, str], ranks: int = 1) -> Child:
    """`ranks` > 1: torchrun, which stops its ranks when it gets SIGTERM (they exit at once)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            echo2_command(args, ranks),
            stdout=log,
            stderr=subprocess.STDOUT,
            # a role's secrets come only from `env`: none leak to a child from the launcher's own
            env={**{k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}, **env},
            # own process group: a terminal Ctrl-C reaches only the launcher, which then stops
            # each child itself in a controlled order
            start_new_session=True,
        )
    return Child(name, process, log_path)


def stop_children(children: list[Child], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every live child, wait up to grace_s, SIGKILL the rest, reap all."""
    live = [c for c in children if c.exit_code() is None]
    for child in live:
        _signal(child, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in live:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(child, signal.SIGKILL)
            child.process.wait(timeout=grace_s)


def _signal(child: Child, sig: int) -> None:
    try:
        os.kill(child.pid, sig)
    except ProcessLookupError:
        pass  # already gone
