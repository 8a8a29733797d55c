"""benchmarks/env_learning.py: a run past its bound is stopped; the report gathers the saved runs
of the paths it is asked for, and never puts runs measured at different commits into one result."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import env_learning  # noqa: E402


def saved_run(folder: Path, path: str, seed: int, commit: str, before: float, after: float) -> None:
    def accuracy(value: float) -> dict:
        return env_learning.interval(value, 200)

    run = {"path": path, "seed": seed, "accuracy_before": accuracy(before), "accuracy_after": accuracy(after),
           "seconds_to_target": None, "tool_call_rate": {"before": 0.0, "after": 0.25},
           "tokens_per_episode": {"before": 18.0, "after": 12.0}, "provenance": {"commit": commit * 40}}
    (folder / f"{path}_s{seed}.json").write_text(json.dumps(run))


def test_report_refuses_runs_from_two_commits_and_reports_one_path(tmp_path, monkeypatch):
    monkeypatch.setattr(env_learning, "RESULTS", tmp_path)
    saved_run(tmp_path, "tool", 0, "a", 0.26, 0.79)
    saved_run(tmp_path, "tool", 1, "b", 0.25, 0.30)
    saved_run(tmp_path, "native", 0, "c", 0.44, 1.0)
    with pytest.raises(SystemExit, match="from commits aaaaaaa, bbbbbbb, whose measured code differs"):
        env_learning.report(["tool"])  # neither is a commit here: nothing says they measured the same code
    monkeypatch.setattr(env_learning, "same_measured_code", lambda first, second: True)
    assert len(env_learning.report(["tool"])["tool"]) == 2  # commits apart only outside MEASURES
    monkeypatch.undo()
    monkeypatch.setattr(env_learning, "RESULTS", tmp_path)
    saved_run(tmp_path, "tool", 1, "a", 0.25, 0.30)
    result = env_learning.report(["tool"])
    assert [r["seed"] for r in result["tool"]] == [0, 1]
    assert {r["path"] for r in result["runs"]} == {"tool"} and result["addition_pairs"] == []
    first, second = result["tool"]
    assert first["gain"] == 0.53 and first["goal_met"] and first["ci95"][0] > 0
    assert second["gain"] == 0.05 and not second["goal_met"]  # its interval holds zero
    assert first["tool_call_rate"] == {"before": 0.0, "after": 0.25}


def test_a_run_past_its_bound_is_stopped_not_left_running(tmp_path, monkeypatch):
    """SIGTERM (echo2 run stops its children on it), then SIGKILL after the grace period."""
    import os
    import time

    monkeypatch.setattr(env_learning, "RUN_TIMEOUT_S", 3.0)
    monkeypatch.setattr(env_learning, "STOP_GRACE_S", 2.0)
    pid_file = tmp_path / "pid"
    stubborn = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    started = time.monotonic()
    with open(tmp_path / "log", "wb") as log, pytest.raises(SystemExit, match="tool seed 0: no end after 3.0 s"):
        env_learning.run_stopping_on_timeout([sys.executable, "-c", stubborn], log, "tool seed 0")
    assert time.monotonic() - started < 30
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # gone, and reaped
    with open(tmp_path / "log", "wb") as log:
        assert env_learning.run_stopping_on_timeout([sys.executable, "-c", "pass"], log, "quick") == 0
