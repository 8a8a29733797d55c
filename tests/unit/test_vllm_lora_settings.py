"""How a vLLM engine reserves adapter room for grpo.lora (no vLLM needed: the arguments alone)."""

from __future__ import annotations

import pytest

from echo2.config.run import LoraConfig
from echo2.rollout.vllm_engine import _lora_settings


def test_the_smallest_vllm_rank_that_fits_is_reserved_with_one_slot():
    assert _lora_settings(None) == {}
    assert _lora_settings(LoraConfig(r=4)) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1,
                                               "max_cpu_loras": 1}
    assert _lora_settings(LoraConfig(r=16))["max_lora_rank"] == 16
    assert _lora_settings(LoraConfig(r=300))["max_lora_rank"] == 320
    with pytest.raises(ValueError, match=r"grpo.lora.r=600: vLLM serves adapters up to rank 512"):
        _lora_settings(LoraConfig(r=600))
