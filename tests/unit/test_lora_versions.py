"""LoRA (grpo.lora): the learner trains only the adapters, each version carries them alone, and
an HF engine holding the base model applies them to compute exactly the learner's function."""

from __future__ import annotations

import pytest
import torch
from tests.unit.learner_fakes import FakeIO, addition_batch, learner_config

from echo2.config.run import LoraConfig
from echo2.learner.train import Learner
from echo2.models.loading import load_tokenizer
from echo2.models.lora import add_lora
from echo2.models.weights import model_payload, payload_tensors
from echo2.rollout.hf_engine import HFEngine

LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def test_versions_carry_only_the_adapters_and_an_engine_applies_them(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = learner_config(tmp_path / "run", tiny_model_dir, grpo={"lora": LORA})
    io = FakeIO([addition_batch(tokenizer, seed) for seed in (1, 2)])
    learner = Learner(cfg, "", learner_token="", io=io)
    base = {k: v.clone() for k, v in learner.model.state_dict().items() if ".lora_" not in k}
    learner.train()

    assert [v for v, _ in io.published] == [0, 1, 2]
    full_bytes = len(model_payload(learner.model))
    for _, payload in io.published:
        names = payload_tensors(payload)
        assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
        assert len(payload) < full_bytes / 10
    trained = learner.model.state_dict()
    assert all(torch.equal(trained[k], v) for k, v in base.items())  # the base stays frozen
    assert not torch.equal(payload_tensors(io.published[0][1])["model.layers.0.self_attn.q_proj.lora_B.weight"],
                           payload_tensors(io.published[2][1])["model.layers.0.self_attn.q_proj.lora_B.weight"])

    engine = HFEngine.from_pretrained(str(tiny_model_dir), "cpu", "float32")
    engine.load_adapter(payload_tensors(io.published[-1][1]), LoraConfig(**LORA))
    ids = torch.tensor([tokenizer.encode("12+34=")])
    with torch.no_grad():
        assert torch.equal(engine.model(input_ids=ids).logits, learner.model.eval()(input_ids=ids).logits)
    with pytest.raises(ValueError, match="adapter settings changed"):
        engine.load_adapter(payload_tensors(io.published[-1][1]), LoraConfig(**{**LORA, "r": 8}))


def test_adapters_that_do_not_fit_are_refused(tiny_model_dir):
    engine = HFEngine.from_pretrained(str(tiny_model_dir), "cpu", "float32")
    with pytest.raises(ValueError, match="does not match this model's LoRA layout"):
        engine.load_adapter({"model.layers.0.mlp.up_proj.lora_A.weight": torch.zeros(4, 4)}, LoraConfig(**LORA))
    with pytest.raises(ValueError, match="names no module of this model"):
        add_lora(torch.nn.Sequential(torch.nn.Linear(2, 2)), LoraConfig(target_modules=("q_proj",)))
