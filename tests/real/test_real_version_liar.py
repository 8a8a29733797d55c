"""The version test on SmolLM2-135M-Instruct with a bf16 wire: workers sampling with the HF engine
computing in bf16, as GPU workers do, from versions three real training steps of the learner's
fp32 masters apart. A worker that samples with version 0 and claims version 1, 2 or 3 at step 3
(S = 2: each of its groups is staler than S) has every group held out and is quarantined; honest
workers, one at the current version and one S versions behind, have none held out.

The steps use lr 5e-4, not the addition config's 1e-5: one step at 1e-5 moves few weights past
the bf16 wire's rounding, so the versions a worker could hold are nearly one version, and a
"lie" of a version changes nothing it samples."""

from __future__ import annotations

import pytest
import torch

from echo2.config.audit import AuditConfig
from echo2.config.run import GRPOConfig
from echo2.config.worker import WorkerConfig
from echo2.coordinator.parts.audit import AuditLedger
from echo2.learner.audit import Auditor
from echo2.learner.precision import CPU_FP32
from echo2.learner.step import train_step
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import model_payload, payload_tensors
from echo2.policy.evidence import VersionEvidence
from echo2.protocol.learner_api import AuditReport
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.rollout.engine import GenRequest
from echo2.rollout.engine_factory import make_engine

pytestmark = pytest.mark.real_model
GRPO = GRPOConfig(prompts_per_step=4, lr=5e-4)
STEPS, S, GROUPS = 3, 2, 4


def _groups(engine, tokenizer, *, version: int, worker_id: str, seed: int, count: int = GROUPS) -> list[TrainGroup]:
    """`count` groups of 8 completions of addition prompts drawn by `engine` with the seeded
    sampler, claiming `version`."""
    prompts = []
    for i in range(count):
        text = f"What is {(seed + i) % 10} + {(3 * i + seed) % 10}?\nAnswer with the number only."
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        prompts.append(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    out = engine.generate([GenRequest(p, 8, 1.0, 12, seed=seed + i) for i, p in enumerate(prompts)])
    return [TrainGroup(lease_id=f"{worker_id}-{seed}-{i}", prompt_index=i, prompt_ids=p, version=version,
                       worker_id=worker_id, rewards=[float(k % 2) for k in range(8)], sampling_seed=seed + i,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in comps])
            for i, (p, comps) in enumerate(zip(prompts, out, strict=True))]


@pytest.fixture(scope="module")
def versions(smollm2):
    """The learner's fp32 masters after STEPS real steps, each version's bf16 payload, and a bf16
    HF engine (the worker)."""
    source = str(smollm2.hf_dir)
    model, tokenizer = load_model(source), load_tokenizer(source)
    engine = make_engine(WorkerConfig(engine="hf", device="cpu", dtype="bfloat16"), source)
    optimizer = torch.optim.AdamW(model.parameters(), lr=GRPO.lr)
    payloads = [model_payload(model, torch.bfloat16)]
    for step in range(STEPS):
        engine.load_state_dict(payload_tensors(payloads[-1]))
        train_step(model, optimizer, _groups(engine, tokenizer, version=step, worker_id="trainer", seed=100 * step),
                   step=step, cfg=GRPO, temperature=1.0, pad_id=tokenizer.pad_token_id)
        payloads.append(model_payload(model, torch.bfloat16))
    return model, tokenizer, engine, payloads


def test_a_smollm2_worker_lying_by_1_2_or_3_versions_trains_nothing_and_is_quarantined(versions):
    model, tokenizer, engine, payloads = versions
    ledger = AuditLedger(2, evidence=VersionEvidence(3, 0.9, 1e-3), proven_groups=32)
    sampled: dict[str, list[TrainGroup]] = {}
    for worker_id, holds, claims, seed in (("honest", 3, 3, 1), ("stale", 1, 1, 2), ("lie1", 0, 1, 3),
                                           ("lie2", 0, 2, 4), ("lie3", 0, 3, 5)):
        engine.load_state_dict(payload_tensors(payloads[holds]))
        sampled[worker_id] = _groups(engine, tokenizer, version=claims, worker_id=worker_id, seed=1000 * seed)
    auditor = Auditor(AuditConfig(), max_staleness=S, secret=b"s", exact_wire=False)  # bf16 wire, fp32 masters
    for version, payload in enumerate(payloads):
        auditor.published(version, payload)
    trained: dict[str, int] = {}
    for index in range(GROUPS):  # one group of each worker a step, with the mode the ledger gives it
        batch = [groups[index].model_copy(update={"audit": ledger.audit_mode(w)}) for w, groups in sampled.items()
                 if w not in ledger.quarantined]
        verdicts = auditor.check_before_step(model, batch, step=STEPS, grpo=GRPO, temperature=1.0,
                                             pad_id=tokenizer.pad_token_id, precision=CPU_FP32)
        checked = {v.lease_id: v for v in verdicts}
        # unproven or held: checked whatever the draw says (a cleared worker's are checked by chance)
        assert {g.lease_id for g in batch if g.audit != "by_chance"} <= set(checked)
        ledger.record(AuditReport(step=STEPS, groups=verdicts))
        for group in batch:
            verdict = checked.get(group.lease_id)
            passed = verdict is None or not (verdict.failed or verdict.held_out)
            trained[group.worker_id] = trained.get(group.worker_id, 0) + passed
    assert trained["honest"] == GROUPS and trained["stale"] == GROUPS, trained  # none held out
    assert not any(trained.get(w, 0) for w in ("lie1", "lie2", "lie3")), trained  # each group staler than S
    assert sorted(ledger.quarantined) == ["lie1", "lie2", "lie3"], {w: s.version_evidence_nats
                                                                    for w, s in ledger.workers.items()}
