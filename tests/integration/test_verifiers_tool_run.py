"""`echo2 run` on the calculator tool environment (verifiers, multi-turn with a tool) with the
tiny model and real processes; the checks are test_verifiers_run.py's."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers.v1")

from tests.integration.test_verifiers_run import run_and_check  # noqa: E402

pytestmark = pytest.mark.integration


def test_the_verifiers_calculator_environment_trains_through_echo2_run(tmp_path):
    run_and_check(tmp_path, "calculator")
