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
    run_and_check(tmp_path, "calculator")
