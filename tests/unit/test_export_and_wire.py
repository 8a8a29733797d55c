"""What leaves the learner: published versions in a wire dtype, laid out as safetensors tensor by
tensor, load into worker models of any dtype; checkpoints export as Hugging Face model
directories that `from_pretrained` loads and that complete prompts as the learner's model does."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load as st_load
from tests.unit.learner_fakes import FakeIO, addition_batch, learner_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from echo2.cli import main
from echo2.config.run_dir import write_resolved
from echo2.learner.train import Learner
from echo2.models.generation import greedy_completions
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import model_payload, payload_tensors, plan_layout, unique_tensors
from echo2.rollout.engine import GenRequest
from echo2.rollout.hf_engine import HFEngine


def _trained(tiny_model_dir) -> torch.nn.Module:
    model = load_model(str(tiny_model_dir))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_payload_is_safetensors_and_ties_travel_once(tiny_model_dir):
    model = _trained(tiny_model_dir)
    for dtype in (torch.float32, torch.bfloat16):
        payload = model_payload(model, dtype)
        loaded = st_load(bytes(payload))  # the library's own reader accepts our layout
        own = model.state_dict()
        assert "lm_head.weight" not in loaded  # tied to the embeddings: sent once
        assert set(loaded) == set(own) - {"lm_head.weight"}
        for name, tensor in loaded.items():
            assert tensor.dtype == dtype
            assert torch.equal(tensor, own[name].to(dtype)), name
        assert payload_tensors(payload).keys() == loaded.keys()
    def data_bytes(dtype):
        layout = plan_layout(unique_tensors(model), dtype)
        assert len(model_payload(model, dtype)) == layout.total_bytes
        return layout.total_bytes - len(layout.header)

    assert data_bytes(torch.bfloat16) * 2 == data_bytes(torch.float32)


def test_mixed_dtypes_are_aligned_and_read_in_place():
    tensors = {"odd_bf16": torch.arange(3, dtype=torch.bfloat16), "i64": torch.arange(5),
               "flag": torch.tensor([True, False, True]), "f32": torch.rand(2, 3), "empty": torch.zeros(0, 4)}
    layout = plan_layout(tensors)
    buffer = bytearray(layout.total_bytes)
    from echo2.models.weights import write_payload

    write_payload(layout, memoryview(buffer))
    for entry in layout.entries:
        assert entry.start % entry.dtype.itemsize == 0, entry.name
    back = payload_tensors(memoryview(buffer))
    for name, tensor in tensors.items():
        assert torch.equal(back[name], tensor), name
    assert back["i64"].data_ptr() - back["f32"].data_ptr() != 0
    start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    assert start <= back["i64"].data_ptr() < start + len(buffer)  # a view, not a copy
    assert st_load(bytes(buffer)).keys() == tensors.keys()


def test_payload_with_inconsistent_header_is_refused(tiny_model_dir):
    import json
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 8]}}).encode()
    bad = struct.pack("<Q", len(header)) + header + bytes(8)
    with pytest.raises(ValueError, match="do not fit shape"):
        payload_tensors(bad)


@pytest.mark.parametrize("engine_dtype", ["float32", "bfloat16"])
def test_bf16_wire_version_loads_into_a_worker_of_either_dtype(tiny_model_dir, engine_dtype):
    source = _trained(tiny_model_dir)
    engine = HFEngine.from_pretrained(str(tiny_model_dir), "cpu", engine_dtype)
    target = getattr(torch, engine_dtype)
    assert next(engine.model.parameters()).dtype == target
    payload = memoryview(model_payload(source, torch.bfloat16)).toreadonly()  # as the broadcast hands it over
    engine.load_state_dict(payload_tensors(payload))
    for name, tensor in source.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], tensor.to(torch.bfloat16).to(target)), name
    groups = engine.generate([GenRequest(engine.tokenizer.encode("1+2=", add_special_tokens=False), 2, 1.0, 4)])
    assert len(groups[0]) == 2 and all(c.token_ids for c in groups[0])


def test_exported_checkpoint_loads_with_from_pretrained_and_completes_alike(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = learner_config(tmp_path / "run", tiny_model_dir)
    write_resolved(cfg)
    learner = Learner(cfg, "", learner_token="", io=FakeIO([addition_batch(tokenizer, s) for s in (1, 2)]))
    learner.train()
    out = tmp_path / "exported"
    assert main(["export", "--run-dir", str(cfg.run_path), "--out", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    loaded_tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(3)]
    assert greedy_completions(model, loaded_tokenizer, prompts, 4) == greedy_completions(
        learner.model, learner.tokenizer, prompts, 4)
    for name, tensor in learner.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    # an earlier step, in bf16; a missing step names the ones there are; a used --out is refused
    assert main(["export", "--run-dir", str(cfg.run_path), "--step", "1", "--dtype", "bfloat16",
                 "--out", str(tmp_path / "step1")]) == 0
    assert next(AutoModelForCausalLM.from_pretrained(tmp_path / "step1").parameters()).dtype == torch.bfloat16
    assert main(["export", "--run-dir", str(cfg.run_path), "--step", "7", "--out", str(tmp_path / "x")]) == 2
    assert main(["export", "--run-dir", str(cfg.run_path), "--out", str(out)]) == 2


def test_a_lora_run_exports_merged_weights_and_its_adapter(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    lora = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    # a high learning rate so two steps move the adapters far enough to change completions
    cfg = learner_config(tmp_path / "run", tiny_model_dir, grpo={"lora": lora, "lr": 0.05})
    write_resolved(cfg)
    learner = Learner(cfg, "", learner_token="", io=FakeIO([addition_batch(tokenizer, s) for s in (1, 2)]))
    learner.train()
    out = tmp_path / "exported"
    assert main(["export", "--run-dir", str(cfg.run_path), "--out", str(out)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out)  # loads without peft: plain weights
    assert not any(".lora_" in name for name in merged.state_dict())
    ids = torch.tensor([tokenizer.encode("12+34=")])
    with torch.no_grad():
        want = learner.model.eval()(input_ids=ids).logits
        base = load_model(str(tiny_model_dir))(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)
        assert not torch.allclose(base, want, atol=1e-3)  # the adapters did change the model
        from peft import PeftModel

        adapted = PeftModel.from_pretrained(load_model(str(tiny_model_dir)), str(out / "adapter"))
        assert torch.allclose(adapted(input_ids=ids).logits, want, atol=1e-5)
