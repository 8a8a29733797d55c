"""The processes a load run starts, and their end: each pinned to its cores (os.sched_setaffinity
in the child before exec, so whatever it starts, the coordinator's scoring processes included,
inherits the pinning) with RLIMIT_NOFILE raised to the hard limit, in its own session (Ctrl-C
reaches the harness only, which stops them in order), its output in a log file. Stopped by PID
only: SIGTERM, a grace period, then SIGKILL; the coordinator's scoring processes, found by
their parent PID before it stops, are killed by PID too if any outlived it."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from load.stats import children_of

# a coordinator binds within seconds even on a loaded box; a minute means it is broken
START_TIMEOUT_S = 60.0
# the coordinator answers its held long polls at once on SIGTERM, then writes its final record
STOP_GRACE_S = 15.0


@dataclass
class Started:
    name: str
    proc: subprocess.Popen
    log_path: Path
    helpers: list[tuple[int, int | None]] = field(default_factory=list)
    """PIDs of processes it started (recorded before it is stopped), killed if they outlive it."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


OPEN_FILES_WANTED = 65_536
"""Open files each process may hold: 10,000 workers keep two connections each to the coordinator
(the news line and their requests). Raised as far as root may (the hard limit otherwise)."""


def raise_open_files_limit() -> int:
    """RLIMIT_NOFILE up to OPEN_FILES_WANTED where the process may raise its hard limit (root),
    else the soft limit up to the hard one; returns the limit now in force."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, OPEN_FILES_WANTED), max(hard, OPEN_FILES_WANTED)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _pinned(cores: set[int], nice: int):
    def setup() -> None:  # runs in the child between fork and exec
        os.sched_setaffinity(0, cores)
        if nice:
            os.nice(nice)
        raise_open_files_limit()

    return setup


def start(name: str, argv: list[str], *, cores: set[int], log_path: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None, nice: int = 0) -> Started:
    """`argv` started pinned to `cores`, `nice` steps below the default priority, its output
    in `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, cwd=cwd, preexec_fn=_pinned(cores, nice),
                                start_new_session=True)
    return Started(name, proc, log_path)


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]


def wait_for_coordinator(run_dir: Path, coordinator: Started, timeout_s: float = START_TIMEOUT_S) -> str:
    """The URL the coordinator wrote once bound, after its /healthz answers."""
    deadline = time.monotonic() + timeout_s
    path = run_dir / "coordinator.json"
    while time.monotonic() < deadline:
        if coordinator.proc.poll() is not None:
            raise RuntimeError(f"the coordinator exited ({coordinator.proc.returncode}):\n{coordinator.log_tail()}")
        try:
            url = json.loads(path.read_text())["url"]
            with urllib.request.urlopen(url + "/healthz", timeout=5) as reply:  # noqa: S310  loopback
                if reply.status == 200:
                    return url
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the coordinator did not answer within {timeout_s:.0f} s:\n{coordinator.log_tail()}")


def note_helpers(started: Started) -> None:
    """Remember the processes `started` runs now (the coordinator's scoring pool), each as
    (pid, start time): a pid reused by another process later is never taken for it."""
    known = set(started.helpers)
    started.helpers = list(known | {(pid, _start_ticks(pid)) for pid in children_of(started.pid)})


def stop(started: Started, grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM by PID, wait up to `grace_s`, then SIGKILL; then the helpers it left, by PID.
    Returns its exit status (None if it could not be reaped)."""
    if started.proc.poll() is None:
        note_helpers(started)
        _signal(started.pid, signal.SIGTERM)
        try:
            started.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal(started.pid, signal.SIGKILL)
            try:
                started.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                return None
    for pid, ticks in started.helpers:
        if ticks is not None and _start_ticks(pid) == ticks:  # the same process, outliving its parent's stop
            _signal(pid, signal.SIGKILL)
    return started.proc.returncode


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with its pid, names it uniquely."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[19])


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_all(processes: list[Started], grace_s: float = STOP_GRACE_S) -> dict[str, int | None]:
    """Stop each, in the order given (clients, then the learner, then the coordinator); a
    second Ctrl-C or SIGTERM meanwhile waits until every one is stopped."""
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return {p.name: stop(p, grace_s) for p in processes}
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
