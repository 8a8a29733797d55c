"""The learner's side of the rollout audit, on real samples from the HF engine: honest groups
pass (at the learner's version and recomputed under an older one), fabricated log-probs and
tokens from another version fail, and a failed group is never trained."""

from __future__ import annotations

import torch
from tests.unit.learner_fakes import FakeIO, learner_config

from echo2.config.audit import AuditConfig
from echo2.config.run import GRPOConfig
from echo2.learner.audit import Auditor, VersionCache, chosen, recompute_mean_abs_diff
from echo2.learner.precision import CPU_FP32
from echo2.learner.step import train_step
from echo2.learner.train import Learner
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import model_payload, payload_tensors
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.rollout.engine import GenRequest
from echo2.rollout.hf_engine import HFEngine

GRPO = GRPOConfig(prompts_per_step=2, lr=1e-2)
TOLERANCE = AuditConfig().max_mean_abs_logprob_diff


def sample_groups(engine: HFEngine, tokenizer, version: int, worker_id: str, seed: int, groups: int = 2):
    """What an honest worker holding `version` returns: sampled tokens and their log-probs."""
    torch.manual_seed(seed)
    prompts = [tokenizer.encode(f"{seed % 10}+{i}=", add_special_tokens=False) for i in range(groups)]
    out = engine.generate([GenRequest(p, 4, 1.0, 6) for p in prompts])
    return [TrainGroup(lease_id=f"{worker_id}-{seed}-{i}", prompt_index=seed * 10 + i, prompt_ids=p, version=version,
                       worker_id=worker_id, rewards=[float(k % 2) for k in range(4)],
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in comps])
            for i, (p, comps) in enumerate(zip(prompts, out, strict=True))]


def shifted(group: TrainGroup, by: float, suffix: str = "x") -> TrainGroup:
    """The same tokens with every behaviour log-prob moved by `by` nats (a fabrication)."""
    comps = [RolloutCompletion(token_ids=c.token_ids, logprobs=[min(0.0, x + by) for x in c.logprobs])
             for c in group.completions]
    return group.model_copy(update={"completions": comps, "lease_id": group.lease_id + suffix})


def perturbed_state(model, scale: float = 0.05, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: p.detach() + scale * torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def test_honest_groups_pass_at_the_current_version_and_fabrications_fail(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    honest = sample_groups(engine, tokenizer, version=0, worker_id="honest", seed=3)
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    liar = [shifted(honest[0], -0.5)]
    stats = train_step(model, opt, honest + liar, step=0, cfg=GRPO, temperature=1.0,
                       pad_id=tokenizer.pad_token_id, audit_tolerance=TOLERANCE)
    assert stats["skipped"] and stats["skip_kind"] == "audit" and "['honest']" in stats["skip_reason"]
    assert max(stats["group_abs_diff"][:2]) < 1e-4  # the engine's own numerics: honest noise
    assert abs(stats["group_abs_diff"][2] - 0.5) < 0.05  # what the fabrication moved
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # nothing trained

    stats = train_step(model, opt, honest, step=0, cfg=GRPO, temperature=1.0, pad_id=tokenizer.pad_token_id,
                       audit_tolerance=TOLERANCE)
    assert not stats["skipped"]
    # a group of an older version is not judged by the current weights here (check_before_step does)
    stats = train_step(model, opt, liar, step=1, cfg=GRPO, temperature=1.0, pad_id=tokenizer.pad_token_id,
                       audit_tolerance=TOLERANCE)
    assert stats["skip_kind"] != "audit"


def test_stale_groups_are_recomputed_under_the_version_they_claim(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    v0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    v1 = perturbed_state(model)
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    honest_v0 = sample_groups(engine, tokenizer, version=0, worker_id="honest", seed=5)
    engine.load_state_dict(v1)
    # sampled from version 1 but claiming version 0 (to pass the staleness bound, say)
    wrong_version = [g.model_copy(update={"version": 0, "worker_id": "liar"})
                     for g in sample_groups(engine, tokenizer, version=1, worker_id="liar", seed=6)]

    auditor = Auditor(AuditConfig(recompute_fraction=1.0), max_staleness=2, secret=b"s")
    # the current version, the S older ones a batch may hold and the older_versions its tokens are weighed against
    assert auditor.cache.capacity == 2 + 1 + 3
    auditor.published(0, model_payload(model, torch.float32))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(v1[n])
    auditor.published(1, model_payload(model, torch.float32))
    verdicts = auditor.check_before_step(model, honest_v0 + wrong_version, step=1, grpo=GRPO, temperature=1.0,
                                   pad_id=tokenizer.pad_token_id, precision=CPU_FP32)
    by_worker = {v.worker_id: [] for v in verdicts}
    for v in verdicts:
        by_worker[v.worker_id].append(v)
    assert all(v.recomputed and not v.failed and v.mean_abs_logprob_diff < 1e-4 for v in by_worker["honest"])
    assert all(v.failed for v in by_worker["liar"])
    # the model's own weights are untouched by the recomputation
    assert all(torch.equal(p, v1[n]) for n, p in model.named_parameters())
    # and under the current weights the honest old groups would look wrong: recomputing matters
    current = recompute_mean_abs_diff(model, dict(model.named_parameters()), honest_v0, grpo=GRPO,
                                      temperature=1.0, pad_id=tokenizer.pad_token_id)
    assert min(current) > max(v.mean_abs_logprob_diff for v in by_worker["honest"]) * 100
    assert all(torch.equal(v0[n], t) for n, t in auditor.cache.get(0).items() if n in v0)


def test_with_a_bf16_wire_current_groups_are_checked_against_the_wire_version_not_the_masters(tiny_model_dir):
    """A worker sent a bf16 version samples from the bf16-rounded weights: the learner's fp32
    masters would charge it the rounding, the published version does not."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    with torch.no_grad():  # weights with low mantissa bits set, as training leaves them
        for p in model.parameters():
            p.mul_(1.0 + 1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    wire = model_payload(model, torch.bfloat16)
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    engine.load_state_dict(payload_tensors(wire))  # what the worker received, cast to its own dtype
    honest = sample_groups(engine, tokenizer, version=3, worker_id="honest", seed=7, groups=3)
    liar = [shifted(honest[0], -0.5)]

    auditor = Auditor(AuditConfig(recompute_fraction=1.0), max_staleness=0, secret=b"s", exact_wire=False)
    assert auditor.tolerance is None  # the step's fp32 log-probs say nothing of a bf16 version
    assert auditor.check_current(honest, 3, [1.0] * 3) == []
    auditor.published(3, wire)
    verdicts = auditor.check_before_step(model, honest + liar, step=3, grpo=GRPO, temperature=1.0,
                                         pad_id=tokenizer.pad_token_id, precision=CPU_FP32)
    assert [v.failed for v in verdicts] == [False, False, False, True] and all(v.recomputed for v in verdicts)
    wire_diff = max(v.mean_abs_logprob_diff for v in verdicts[:3])
    masters = recompute_mean_abs_diff(model, dict(model.named_parameters()), honest, grpo=GRPO,
                                      temperature=1.0, pad_id=tokenizer.pad_token_id)
    assert wire_diff < 1e-4 and min(masters) > 10 * wire_diff
    exact = Auditor(AuditConfig(recompute_fraction=1.0), max_staleness=0, secret=b"s", exact_wire=True)
    exact.published(3, wire)
    assert exact.check_before_step(model, honest, step=3, grpo=GRPO, temperature=1.0, pad_id=0,
                                   precision=CPU_FP32) == []  # the step itself checks them


def test_which_stale_groups_are_recomputed_is_keyed_and_near_the_configured_share():
    ids = [f"L{i:016x}" for i in range(4000)]
    picked = [chosen(b"k" * 32, g, 0.25) for g in ids]
    assert 0.22 < sum(picked) / len(ids) < 0.28
    assert picked == [chosen(b"k" * 32, g, 0.25) for g in ids]  # a resumed learner picks the same
    assert picked != [chosen(b"j" * 32, g, 0.25) for g in ids]  # a worker without the key cannot tell
    assert all(chosen(b"k", g, 1.0) for g in ids[:10]) and not any(chosen(b"k", g, 0.0) for g in ids[:10])


def test_the_version_cache_keeps_the_newest_versions_in_the_wire_dtype(tiny_model_dir):
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    cache = VersionCache(2)
    for version in range(4):
        cache.add(version, model_payload(model, torch.bfloat16))
    assert list(cache.payloads) == [2, 3] and cache.get(1) is None
    assert all(t.dtype == torch.bfloat16 for t in cache.get(3).values())
    empty = VersionCache(0)
    empty.add(0, model_payload(model, torch.float32))
    assert empty.get(0) is None


def test_the_learner_skips_a_step_over_a_failed_audit_and_hands_back_the_honest_groups(tmp_path, tiny_model_dir):
    cfg = learner_config(tmp_path / "run", tiny_model_dir, audit={"enabled": True}, train={"steps": 1})
    tokenizer = load_tokenizer(str(tiny_model_dir))
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    honest = sample_groups(engine, tokenizer, version=0, worker_id="honest", seed=7)
    poisoned = [honest[0], shifted(honest[1], -2.0)]
    io = FakeIO([poisoned, honest])
    Learner(cfg, "http://unused", io=io).train()

    assert [v for v, _ in io.published] == [0, 1]  # step 0 trained once, on the honest batch
    assert len(io.rejected) == 1 and "rollout audit" in io.rejected[0][1]
    assert io.requeued[0] == (honest[0].lease_id,)  # the honest group goes back, the fabricated one not
    first_step, first = io.audits[0]
    assert first_step == 0 and [v.failed for v in first] == [False, True]
    assert all(not v.failed for v in io.audits[1][1])


def test_the_learner_redoes_a_step_without_a_group_held_out(tmp_path, tiny_model_dir):
    cfg = learner_config(tmp_path / "run", tiny_model_dir, audit={"enabled": True}, train={"steps": 1})
    tokenizer = load_tokenizer(str(tiny_model_dir))
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    honest = sample_groups(engine, tokenizer, version=0, worker_id="honest", seed=7)
    leaning = honest[1].model_copy(update={"audit": "hold_out", "worker_id": "leaning"})
    io = FakeIO([[honest[0], leaning], honest])
    Learner(cfg, "http://unused", io=io).train()

    assert [v for v, _ in io.published] == [0, 1]  # step 0 trained once, without the held-out group
    assert len(io.rejected) == 1 and "1 group(s) held out" in io.rejected[0][1] and "leaning" in io.rejected[0][1]
    assert io.requeued[0] == (honest[0].lease_id,)
    (step, held), = io.audits[:1]
    assert step == 0 and [(v.lease_id, v.held_out, v.failed) for v in held] == [(leaning.lease_id, True, False)]
