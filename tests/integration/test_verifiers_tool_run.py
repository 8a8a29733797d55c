"""`echo2 run` on the calculator tool environment (verifiers, multi-turn with a tool) with the
tiny model and real processes; the checks are test_verifiers_run.py's."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers.v1")

from tests.integration.test_verifiers_run import run_and_check  # noqa: E402

# a minute-long whole run: the system tier (make test-system); tests/unit/test_verifiers_play.py covers
# the tool episode itself in make test
pytestmark = [pytest.mark.integration, pytest.mark.system]


def test_the_verifiers_calculator_environment_trains_through_echo2_run(tmp_path):
    summary = run_and_check(tmp_path, "calculator")
    assert summary["rewards_rest_on_workers"] is None  # replayed: the coordinator ran the tools


def test_a_worker_trusted_calculator_trains_on_its_workers_tool_answers(tmp_path):
    """task.trust = "worker-trusted": `echo2 run` hands its own worker the trusted-worker token,
    every episode is replayed with the tool answers the worker recorded (none refused), and the
    summary names the worker the rewards rest on."""
    summary = run_and_check(tmp_path, "calculator", trust="worker-trusted")
    assert summary["rewards_rest_on_workers"] == ["w0"]
