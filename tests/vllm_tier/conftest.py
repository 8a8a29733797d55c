"""Shared by the vLLM tier: the tiny model its engines load, and where measured numbers go."""

from __future__ import annotations

import json
import os

import pytest

from echo2.config.run import ModelConfig
from echo2.models.tiny import save_tiny

# vLLM's CPU attention needs head_dim 32 or more: 64 wide, 2 heads
VLLM_TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
REPORT = os.environ.get("ECHO2_VLLM_REPORT")  # where to write the measured numbers (optional)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The tiny model, saved once for the tier (no test changes it)."""
    out = tmp_path_factory.mktemp("vllm_tiny")
    save_tiny(VLLM_TINY, out, seed=0)
    return out


def report(**values) -> None:
    """One line of measured numbers (`make test-vllm` prints them after the tier)."""
    if REPORT:
        with open(REPORT, "a") as handle:
            handle.write(json.dumps(values) + "\n")
