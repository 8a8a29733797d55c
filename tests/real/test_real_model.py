"""A real pretrained model end to end (SmolLM2-135M-Instruct, Llama architecture, BPE tokenizer,
chat template): the GGUF import generates what transformers' own GGUF load generates, `echo2
eval` reads the file, shared-prompt passes give the unshared gradients, and short `echo2 run`s
at S = 0 and S = 2 (two workers, bf16 wire, deltas) load every version on both workers, pass
every audit, record evaluation leases and export what the learner trained."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from tests.integration.runs import processes, records, write_config

from echo2.config.run import load_run_config
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.sources import gguf_location

pytestmark = pytest.mark.real_model
CONFIG = "configs/smollm2_addition.toml"
PROMPTS = ["What is 3 + 4?\nAnswer with the number only.", "Name a colour.", "What is 12 + 30?"]


def _chat(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def _greedy(model, tokenizer, max_new_tokens: int = 12) -> list[list[int]]:
    out = []
    for text in PROMPTS:
        ids = torch.tensor([_chat(tokenizer, text)])
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out


def test_the_gguf_import_generates_what_transformers_own_gguf_load_generates(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from echo2.config.run import ModelConfig

    directory, name = gguf_location(ModelConfig(source=str(smollm2.gguf)))
    theirs = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=name, dtype=torch.float32)
    their_tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=name)
    ours, our_tokenizer = load_model(str(smollm2.hf_dir)), load_tokenizer(str(smollm2.hf_dir))
    assert type(ours).__name__ == "LlamaForCausalLM"
    assert 134_000_000 < sum(p.numel() for p in ours.parameters()) < 135_000_000
    assert our_tokenizer.chat_template and our_tokenizer.chat_template == their_tokenizer.chat_template
    assert _chat(our_tokenizer, PROMPTS[0]) == _chat(their_tokenizer, PROMPTS[0])
    completions = _greedy(ours, our_tokenizer)
    assert completions == _greedy(theirs, their_tokenizer)
    assert "7" in our_tokenizer.decode(completions[0])


def test_echo2_eval_reads_the_gguf_file(smollm2):
    out = subprocess.run([sys.executable, "-m", "echo2", "eval", "--checkpoint", str(smollm2.gguf), "--config", CONFIG,
                          "--limit", "60", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["problems"] == 60 and 0.25 <= result["pass_at_k"]["1"] <= 0.75  # 0.465 on all 200


def test_shared_prompt_passes_give_the_unshared_gradients_on_smollm2(smollm2):
    from echo2.learner.batching import flatten
    from echo2.learner.logprobs import token_logprobs
    from echo2.learner.passes import build_pass, plan_passes
    from echo2.protocol.messages import RolloutCompletion, TrainGroup

    model, tokenizer = load_model(str(smollm2.hf_dir)), load_tokenizer(str(smollm2.hf_dir))
    gen = torch.Generator().manual_seed(0)
    groups = [TrainGroup(lease_id=f"g{i}", prompt_index=i, prompt_ids=_chat(tokenizer, text), version=0, worker_id="w",
                         rewards=[0.0] * 3, completions=[RolloutCompletion(
                             token_ids=torch.randint(100, 40_000, (n,), generator=gen).tolist(), logprobs=[-1.0] * n)
                             for n in (3, 7, 5)]) for i, text in enumerate(PROMPTS[:2])]
    samples = flatten(groups)
    grads = {}
    for layout in ("padded", "shared"):
        model.zero_grad(set_to_none=True)
        for indices in plan_passes(samples, 0, layout):
            logp, _ = token_logprobs(model, build_pass(samples, indices, tokenizer.pad_token_id, layout), 1.0, 256)
            logp.sum().backward()
        grads[layout] = torch.cat([p.grad.flatten() for p in model.parameters()])
    relative = (grads["shared"] - grads["padded"]).norm() / grads["padded"].norm()
    assert relative < 1e-5, relative  # fp32 round-off (RMSNorm computes in fp32 either way)


def _short_run(tmp_path, staleness: int):
    cfg = load_run_config(CONFIG, [f"run_dir={tmp_path / f's{staleness}'}", "train.steps=5",
                                   f"train.max_staleness={staleness}", "train.eval_every=5", "train.checkpoint_every=5",
                                   "grpo.prompts_per_step=4", "sampling.group_size=4", "task.eval_size=40",
                                   "evaluation.problems_per_lease=20", "report.plots=false",
                                   "report.tensorboard=false"])
    config = write_config(tmp_path / f"s{staleness}.toml", cfg)
    with processes() as start:
        proc = start(["run", "--config", str(config)], tmp_path / f"s{staleness}.log")
        assert proc.wait(timeout=420) == 0, (tmp_path / f"s{staleness}.log").read_text()[-3000:]
    return cfg


@pytest.mark.parametrize("staleness", [0, 2])
def test_a_short_run_loads_every_version_passes_every_audit_and_evaluates_on_workers(tmp_path, smollm2, staleness):
    cfg = _short_run(tmp_path, staleness)
    run = cfg.run_path
    loaded = {(r["worker_id"], r["version"]) for r in records(run, "weights_loaded")}
    for worker in ("w0", "w1"):
        assert {v for w, v in loaded if w == worker} >= set(range(1, 6)), (worker, sorted(loaded))
    audits = records(run, "audit")
    assert sum(a["groups_audited"] for a in audits) > 0 and sum(a["groups_failed"] for a in audits) == 0
    assert not records(run, "worker_quarantined") and not records(run, "step_skipped")
    published = [r for r in records(run, "version_published") if r["role"] == "learner"]
    assert {r["wire_dtype"] for r in published} == {"bfloat16"} and any(r["form"] == "delta" for r in published)
    evals = {r["step"]: r for r in records(run, "eval") if r["role"] == "coordinator"}
    assert set(evals) == {0, 5} and all(e["problems"] == 40 for e in evals.values())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["accuracy_before"] == evals[0]["accuracy"]
    assert summary["max_staleness_trained"] <= staleness and summary["learner_tokens_per_s"]["layout"] == "shared"
    if staleness == 2:
        _export_gives_the_learners_completions(tmp_path, cfg)


def _export_gives_the_learners_completions(tmp_path, cfg) -> None:
    from echo2.learner.eval_run import load_for_eval

    checkpoint = cfg.run_path / "checkpoints" / "step_0000005"
    out = subprocess.run([sys.executable, "-m", "echo2", "export", "--run-dir", str(cfg.run_path), "--step", "5",
                          "--out", str(tmp_path / "exported")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    exported, tokenizer = load_model(str(tmp_path / "exported")), load_tokenizer(str(tmp_path / "exported"))
    learner, _ = load_for_eval(cfg.base_model_path, checkpoint, "cpu")
    base = load_model(cfg.base_model_path)
    assert _greedy(exported, tokenizer) == _greedy(learner, tokenizer)
    moved = max((a - b).abs().max().item() for a, b in zip(exported.parameters(), base.parameters(), strict=True))
    assert moved > 0  # five steps of training are in it
