"""vLLM workers on a LoRA run (grpo.lora, `make test-vllm`): the engine reserves one adapter slot,
each adapter version replaces the adapter in it, and completions and behaviour log-probs are
the ones the learner's model (base + the same unmerged adapters) gives."""

from __future__ import annotations

import time

import pytest
import torch
from tests.vllm_tier.conftest import report

from echo2.config.run import LoraConfig
from echo2.config.worker import VLLMConfig
from echo2.learner.logprobs import collate, token_logprobs
from echo2.models.generation import greedy_completions
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.lora import adapter_payload, add_lora, lora_parameters
from echo2.models.weights import payload_tensors
from echo2.rollout.engine import GenRequest

pytestmark = pytest.mark.vllm

LORA = LoraConfig(r=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


@pytest.fixture(scope="module")
def engine(model_dir):
    from echo2.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(model_dir), "cpu", VLLMConfig(seed=0, max_model_len=96), LORA)
    yield engine
    engine.close()


def _greedy(engine, token_prompts, max_new: int) -> list[list[int]]:
    """Greedy completions under the adapter the engine's generations name."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new)
    outputs = engine._call(lambda: engine.llm.generate([{"prompt_token_ids": p} for p in token_prompts], params,
                                                       use_tqdm=False, lora_request=engine.adapter))
    return [list(o.outputs[0].token_ids) for o in outputs]


def _new_adapter(model, seed: int, wire: torch.dtype) -> dict:
    """Random adapters (B nonzero, so they change the model), rounded to what the wire carries;
    returns the version's tensors as a worker receives them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_((torch.randn(p.shape, generator=generator) * 0.3).to(wire).to(p.dtype))
    return payload_tensors(memoryview(adapter_payload(model, wire)).toreadonly())


def test_adapter_versions_give_the_learners_completions_and_logprobs(engine, model_dir):
    tokenizer = load_tokenizer(str(model_dir))
    model = add_lora(load_model(str(model_dir)), LORA).eval()
    texts = [f"{a}+{b}=" for a in range(5) for b in range(4)]
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    base = _greedy(engine, prompts, 6)
    previous, swaps = base, []
    for version, wire in ((1, torch.float32), (2, torch.bfloat16)):
        tensors = _new_adapter(model, seed=version, wire=wire)
        started = time.perf_counter()
        engine.load_adapter(tensors, LORA)
        swaps.append(time.perf_counter() - started)
        after = _greedy(engine, prompts, 6)
        decoded = [tokenizer.decode(ids, skip_special_tokens=True) for ids in after]
        assert decoded == greedy_completions(model, tokenizer, texts, 6), f"version {version}"
        assert after != previous  # the adapter in the slot was replaced, and cached prompt KV with it
        previous = after

    # sampled tokens' behaviour log-probs are the learner's under base + adapter
    groups = engine.generate([GenRequest(p, n=4, temperature=1.0, max_new_tokens=8) for p in prompts])
    rows = [(p, c) for p, g in zip(prompts, groups, strict=True) for c in g]
    batch = collate([p for p, _ in rows], [c.token_ids for _, c in rows], list(range(len(rows))),
                    tokenizer.pad_token_id)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch, 1.0, chunk_tokens=64)
        without = {name: torch.zeros_like(p) for name, p in lora_parameters(model).items() if ".lora_B." in name}
        model.load_state_dict(without, strict=False)
        base_logprobs, _ = token_logprobs(model, batch, 1.0, chunk_tokens=64)
    behaviour = torch.tensor([x for _, c in rows for x in c.logprobs])
    mean_abs = float((learner.double() - behaviour.double()).abs().mean())
    base_gap = float((base_logprobs.double() - behaviour.double()).abs().mean())
    report(test="lora", tokens=len(behaviour), mean_abs_diff=mean_abs, base_model_diff=base_gap, swap_s=swaps)
    assert mean_abs < 1e-3
    assert base_gap > 100 * mean_abs  # the adapter really is in the computation


def test_an_adapter_with_other_settings_is_refused(engine):
    with pytest.raises(ValueError, match="adapter settings changed"):
        engine.load_adapter({}, LoraConfig(r=8, alpha=8.0, target_modules=LORA.target_modules))
