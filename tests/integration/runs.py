"""Helpers for tests that start real echo2 processes: a TOML writer for small configs, child
processes stopped by PID whatever happens, and waiting on metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import prepare_into_cache

from echo2.report.metrics import read_metrics

TOKEN = "test-token-0123456789"  # the join token small_run_config puts in the config
LEARNER_TOKEN = "test-learner-token-0123456789"
OPERATOR_TOKEN = "test-operator-token-0123456789"


def _is_table_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def to_toml(data: dict, prefix: str = "") -> str:
    """Enough TOML for our configs: scalars, scalar lists, tables and arrays of tables. None (TOML
    has no null) is every optional field's default and is left out."""
    scalars = [f"{k} = {json.dumps(v)}" for k, v in data.items()
               if not isinstance(v, dict) and not _is_table_list(v) and v != [] and v is not None]
    out = "\n".join(scalars) + "\n"
    for key, value in data.items():
        if isinstance(value, dict):
            out += f"\n[{prefix}{key}]\n" + to_toml(value, f"{prefix}{key}.")
        elif _is_table_list(value):
            out += "".join(f"\n[[{prefix}{key}]]\n" + to_toml(v, f"{prefix}{key}.") for v in value)
    return out


def write_config(path: Path, cfg) -> Path:
    """The run's TOML at `path`, its base model ready in the session's warm-start cache."""
    data = cfg.model_dump()
    path.write_text(to_toml(data))
    prepare_into_cache(path, cfg)
    return path


@contextmanager
def processes():
    """Yields a `start(args, log, without=())` function (`without`: variables left out of the
    child's environment); every process it started is killed on exit."""
    started: list[subprocess.Popen] = []

    def start(args: list[str], log: Path, without: tuple[str, ...] = ()) -> subprocess.Popen:
        handle = open(log, "ab")
        env = {**os.environ, "ECHO2_AUTH_TOKEN": TOKEN, "ECHO2_LEARNER_TOKEN": LEARNER_TOKEN,
               "ECHO2_OPERATOR_TOKEN": OPERATOR_TOKEN}
        proc = subprocess.Popen([sys.executable, "-m", "echo2", *args], stdout=handle, stderr=subprocess.STDOUT,
                                env={k: v for k, v in env.items() if k not in without}, start_new_session=True)
        handle.close()
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.2, alive: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"process exited with {alive.returncode} while waiting for {what}")
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def records(run_dir: Path, kind: str | None = None) -> list[dict]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [r for r in rows if kind is None or r["kind"] == kind]


def coordinator_url(run_dir: Path) -> str | None:
    """The URL a run's coordinator wrote once it listens (None before)."""
    path = run_dir / "coordinator.json"
    return json.loads(path.read_text())["url"] if path.is_file() else None


def last_step(run_dir: Path) -> int:
    steps = [r["step"] for r in records(run_dir, "train_step")]
    return max(steps, default=-1)
