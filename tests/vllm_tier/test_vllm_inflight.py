"""In-flight weight updates with the vLLM engine (`make test-vllm`): a generation that straddles
two versions returns each token under the version that drew it (the seeded sampler's choice and
behaviour log-prob under that version's weights, as the audit recomputes them), and a segmented
generation with nothing to swap is the one a single request gives."""

from __future__ import annotations

import pytest
import torch
from tests.unit.test_rollout_audit import perturbed_state
from tests.vllm_tier.conftest import report

from echo2.config.worker import VLLMConfig
from echo2.learner.sampler_audit import groups_shortfalls
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import model_payload, payload_tensors
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.protocol.token_versions import expand
from echo2.rollout.engine import GenRequest, InFlight

pytestmark = pytest.mark.vllm

TEMPERATURE = 0.9
SEGMENT = 3
MAX_NEW = 8


@pytest.fixture(scope="module")
def engine(model_dir):
    from echo2.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(model_dir), "cpu", VLLMConfig(seed=0, max_model_len=96))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def versions(model_dir):
    model = load_model(str(model_dir)).eval()
    return model, {n: p.detach().clone() for n, p in model.named_parameters()}, perturbed_state(model, scale=0.2)


def _load(engine, model, state) -> None:
    model.load_state_dict(state, strict=False)
    engine.load_state_dict(payload_tensors(memoryview(model_payload(model, torch.float32)).toreadonly()))


def _prompts(model_dir) -> list[list[int]]:
    tokenizer = load_tokenizer(str(model_dir))
    return [tokenizer.encode(text, add_special_tokens=False) for text in ("3+4=", "12+9=", "7+7=")]


def _group(prompt, completions, seed) -> TrainGroup:
    return TrainGroup(lease_id=f"L{seed}", prompt_index=0, prompt_ids=prompt, version=0, worker_id="w",
                      rewards=[0.0] * len(completions), sampling_seed=seed,
                      completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs,
                                                     token_versions=c.token_versions) for c in completions])


def test_a_straddling_generation_draws_each_token_under_its_version(engine, versions, model_dir):
    model, v0, v1 = versions
    _load(engine, model, v0)
    swaps = []

    def swap() -> int:  # as the follower does: the engine loads the staged version
        _load(engine, model, v1)
        swaps.append(1)
        return 1

    inflight = InFlight(segment_tokens=SEGMENT, version=0, pending=lambda: not swaps, swap=swap)
    prompts = _prompts(model_dir)
    out = engine.generate([GenRequest(p, 4, TEMPERATURE, MAX_NEW, seed=20 + i) for i, p in enumerate(prompts)],
                          inflight)
    assert len(swaps) == 1
    groups = [_group(p, g, 20 + i) for i, (p, g) in enumerate(zip(prompts, out, strict=True))]
    straddling = 0
    for group in groups:
        for c in group.completions:
            per_token = expand(c.token_versions, len(c.token_ids), 0)
            assert per_token == [0 if i < SEGMENT else 1 for i in range(len(c.token_ids))]
            straddling += len(c.token_ids) > SEGMENT
    assert straddling >= 6  # an untrained model rarely stops within 3 tokens
    worst = {}
    for version, state in enumerate((v0, v1)):
        shortfalls = groups_shortfalls(model, state, groups, temperature=TEMPERATURE, pad_id=0, version=version)
        worst[version] = float(torch.cat(shortfalls).max())
        # the other version's weights do not explain these tokens: the check above is not vacuous
        other = groups_shortfalls(model, (v1, v0)[version], groups, temperature=TEMPERATURE, pad_id=0,
                                  version=version)
        assert sum(float(s.max()) > 0.5 for s in other) >= len(groups) - 1
    report(test="inflight", straddling=straddling, max_shortfall_v0=worst[0], max_shortfall_v1=worst[1])
    assert max(worst.values()) < 0.05
    _check_logprobs(model, v0, v1, groups)
    _load(engine, model, v0)


def _check_logprobs(model, v0, v1, groups: list[TrainGroup]) -> None:
    """Each token's behaviour log-prob is log_softmax(logits / T) under the version that drew it."""
    for group in groups:
        for c in group.completions:
            per_token = expand(c.token_versions, len(c.token_ids), 0)
            for version, state in enumerate((v0, v1)):
                model.load_state_dict(state, strict=False)
                with torch.no_grad():
                    logits = model(torch.tensor([group.prompt_ids + c.token_ids])).logits[0].float() / TEMPERATURE
                start = len(group.prompt_ids) - 1
                logp = torch.log_softmax(logits[start: start + len(c.token_ids)], -1)
                for i, token in enumerate(c.token_ids):
                    if per_token[i] == version:
                        assert c.logprobs[i] == pytest.approx(float(logp[i, token]), abs=1e-3)
    model.load_state_dict(v0, strict=False)


def test_segments_with_nothing_to_swap_are_one_generation(engine, versions, model_dir):
    model, v0, _ = versions
    _load(engine, model, v0)
    requests = [GenRequest(p, 3, TEMPERATURE, MAX_NEW, seed=40 + i) for i, p in enumerate(_prompts(model_dir))]
    never = InFlight(segment_tokens=SEGMENT, version=0, pending=lambda: False,
                     swap=lambda: pytest.fail("nothing was pending"))
    whole, segmented = engine.generate(requests), engine.generate(requests, never)
    for a, b in zip(whole, segmented, strict=True):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        assert all(c.token_versions == [] for c in b)
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_slowdown_paces_each_segment(engine, versions, model_dir, monkeypatch):
    """EMULATION (worker.slowdown): the engine idles (slowdown - 1) x each segment's time before
    it asks whether a version waits, so versions arrive mid-generation as on slower hardware."""
    import echo2.rollout.vllm_engine as vllm_engine

    model, v0, _ = versions
    _load(engine, model, v0)
    events, real_idle_s = [], vllm_engine.slowdown_idle_s

    def idle_s(slowdown, clock, wall_s, cpu_s):
        events.append(("idle", slowdown, wall_s, real_idle_s(slowdown, clock, wall_s, cpu_s)))
        return events[-1][3]

    monkeypatch.setattr(vllm_engine, "slowdown_idle_s", idle_s)
    engine.slowdown = 3.0
    try:
        inflight = InFlight(segment_tokens=SEGMENT, version=0, pending=lambda: events.append(("pending",)) or False,
                            swap=lambda: pytest.fail("nothing was pending"))
        requests = [GenRequest(p, 2, TEMPERATURE, MAX_NEW, seed=60 + i) for i, p in enumerate(_prompts(model_dir))]
        engine.generate(requests, inflight)
    finally:
        engine.slowdown = 1.0
    kinds = [e[0] for e in events]
    assert kinds[0] == "idle" and kinds.count("idle") >= 2 and "pending" in kinds
    # every question about a pending version comes after the segment's idle, and the idle is twice
    # the segment's time (slowdown 3 on the wall clock)
    assert all(kinds[i - 1] == "idle" for i, k in enumerate(kinds) if k == "pending")
    assert all(e[3] == pytest.approx(2.0 * e[2]) and e[3] > 0 for e in events if e[0] == "idle")
