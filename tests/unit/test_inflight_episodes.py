"""In-flight weight updates in multi-turn episodes: a version staged while a lease's episodes are
being played is swapped in before the next turn, so later actions are sampled (and their
behaviour log-probs computed) by the newer version; each transcript token carries the version
that sampled it (an environment's answer, the version of the action before it), the coordinator's
check accepts the runs, and the learner's audit recomputes each action under its own version."""

from __future__ import annotations

import pytest
import torch
from tests.unit.test_env_training import poker_config
from tests.unit.test_episode_sampler import SAMPLING, leased, true_logprobs
from tests.unit.test_rollout_audit import perturbed_state

from echo2.config.audit import AuditConfig
from echo2.config.run import GRPOConfig, WarmStartConfig
from echo2.learner.audit import Auditor
from echo2.learner.batching import loss_mask
from echo2.learner.precision import CPU_FP32
from echo2.learner.warmstart import warm_start
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import model_payload
from echo2.protocol import token_versions
from echo2.protocol.messages import TrainGroup
from echo2.rollout.engine import InFlight
from echo2.rollout.episodes import EpisodePlayer, sample_groups
from echo2.rollout.hf_engine import HFEngine
from echo2.tasks import make_task


class Swapper:
    """Version 1 is staged from the start; `pending` is asked at segment boundaries and between
    turns, and the first time it is asked the swap loads version 1 into the engine."""

    def __init__(self, engine: HFEngine, v1: dict[str, torch.Tensor]) -> None:
        self.engine, self.v1, self.swaps = engine, v1, 0

    def inflight(self) -> InFlight:
        # segments longer than an action (SAMPLING.max_new_tokens = 2): only the turns swap
        return InFlight(segment_tokens=8, version=0, pending=lambda: self.swaps == 0, swap=self._swap)

    def _swap(self) -> int:
        self.engine.load_state_dict(self.v1)
        self.swaps += 1
        return 1


@pytest.fixture(scope="module")
def played(tiny_model_dir):
    """Leduc episodes (two betting rounds: several actions each) played with version 1 staged."""
    cfg = poker_config("unused", tiny_model_dir, game="leduc")
    task = make_task(cfg.task, cfg.seed)
    model, tokenizer = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    torch.manual_seed(0)
    warm_start(model, tokenizer, task, WarmStartConfig(steps=30, batch_size=8, lr=1e-2), seed=0,
               max_action_tokens=SAMPLING.max_new_tokens)
    v0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    v1 = perturbed_state(model, scale=0.2)
    engine = HFEngine(model, tokenizer)
    player = EpisodePlayer(engine, task, str(tiny_model_dir))
    tasks = leased(task, player.codec, [101, 202, 303])
    swapper = Swapper(engine, v1)
    groups = sample_groups(engine, player, tasks, swapper.inflight())
    assert swapper.swaps == 1
    engine.load_state_dict(v0)  # the same leases played by a worker that never swaps
    unswapped = sample_groups(engine, player, tasks)
    return tasks, groups, (v0, v1), tokenizer.pad_token_id, str(tiny_model_dir), unswapped


def model_under(model_dir: str, state: dict[str, torch.Tensor]):
    model = load_model(model_dir, torch.device("cpu"))
    model.load_state_dict(state, strict=False)
    return model


def test_later_turns_are_sampled_by_the_version_swapped_in_between_turns(played):
    tasks, groups, states, _, model_dir, _ = played
    models = [model_under(model_dir, s) for s in states]
    multi_turn = 0
    for task, group in zip(tasks, groups, strict=True):
        for c in group:
            per_token = token_versions.expand(c.token_versions, len(c.token_ids), 0)
            first_action = c.segments[0]
            # the first action and the environment's answer after it: version 0; the rest: 1
            assert per_token == [0 if i < sum(c.segments[:2]) else 1 for i in range(len(c.token_ids))]
            assert token_versions.problem(c.token_versions, tokens=len(c.token_ids), version=0, newest=1,
                                          field="token_versions") is None
            mask = loss_mask(c)
            logps = [true_logprobs(m, task.prompt_ids, c.token_ids, mask) for m in models]
            for i, (behaviour, on) in enumerate(zip(c.logprobs, mask, strict=True)):
                if on:
                    assert behaviour == pytest.approx(logps[per_token[i]][i], abs=1e-4)
            if len(c.segments) >= 3:
                multi_turn += 1
                later = [i for i in range(sum(c.segments[:2]), len(c.token_ids)) if mask[i]]
                assert later and first_action >= 1
                # the versions differ where it counts: version 0 would have given other log-probs
                assert max(abs(logps[0][i] - logps[1][i]) for i in later) > 1e-3
    assert multi_turn >= 3, "too few episodes reach a second action to swap before it"


def test_the_audit_recomputes_each_turn_under_its_version(played):
    tasks, groups, (v0, v1), pad, model_dir, unswapped = played
    auditor = Auditor(AuditConfig(recompute_fraction=1.0), max_staleness=2, secret=b"s")
    for version, state in enumerate((v0, v1)):
        auditor.published(version, model_payload(model_under(model_dir, state)))
    batch = [TrainGroup(lease_id=t.lease_id, prompt_index=i, prompt_ids=t.prompt_ids, version=0, worker_id="w0",
                        rewards=[float(j % 2) for j in range(len(g))], sampling_seed=t.sampling_seed, completions=g)
             for i, (t, g) in enumerate(zip(tasks, groups, strict=True))]
    # a worker that played every turn with version 0 but labels its later turns version 1
    liar = [b.model_copy(update={"lease_id": f"liar{b.lease_id}", "completions": [
        c.model_copy(update={"token_versions": [(0, sum(c.segments[:2])), (1, len(c.token_ids) - sum(c.segments[:2]))]})
        if len(c.segments) >= 3 else c for c in g]}) for b, g in zip(batch, unswapped, strict=True)]
    verdicts = {v.lease_id: v for v in auditor.check_before_step(
        model_under(model_dir, v1), batch + liar, step=1, grpo=GRPOConfig(), temperature=1.0, pad_id=pad,
        precision=CPU_FP32)}
    for group in batch:
        verdict = verdicts[group.lease_id]
        assert verdict.recomputed and not verdict.failed and verdict.sampler_violations == 0
    lied = [g for g in liar if any(c.token_versions for c in g.completions)]
    assert lied and all(verdicts[g.lease_id].failed for g in lied), [verdicts[g.lease_id] for g in lied]
