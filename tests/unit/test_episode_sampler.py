"""The seeded sampler in multi-turn episodes: a worker's HF engine draws every action of episode
j with the lease's seed as sample j, each token at its index in the transcript; the learner's
sampler audit recomputes the model's tokens only (the environment's answers are not sampled)
and passes honest episodes, while an episode with one action token chosen by the worker (and
its true log-prob reported) fails it."""

from __future__ import annotations

import pytest
import torch
from tests.unit.test_env_training import poker_config

from echo2.config.audit import AuditConfig
from echo2.config.run import GRPOConfig, WarmStartConfig
from echo2.envs.transcript import Codec
from echo2.learner.audit import Auditor
from echo2.learner.batching import loss_mask
from echo2.learner.precision import CPU_FP32
from echo2.learner.sampler_audit import group_shortfalls, violations
from echo2.learner.warmstart import warm_start
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.sampler import shortfall
from echo2.models.weights import model_payload
from echo2.protocol.messages import RolloutCompletion, SamplingParams, Task, TrainGroup
from echo2.rollout.episodes import EpisodePlayer
from echo2.rollout.hf_engine import HFEngine
from echo2.tasks import make_task

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=2, group_size=4)
# below the default (1.0): the tampering here swaps one token for the likeliest other one, the
# smallest lie there is, whose Gumbel gap passes 0.5 often and 1.0 less often
MARGIN = 0.5


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    """A tiny model warm-started to play legal Leduc moves (an untrained one ends nearly every
    hand with an illegal first action: no later turn to check; Leduc's two rounds give later
    turns), the HF engine around it and the worker's episode player."""
    cfg = poker_config("unused", tiny_model_dir, game="leduc")
    task = make_task(cfg.task, cfg.seed)
    model, tokenizer = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    torch.manual_seed(0)
    warm_start(model, tokenizer, task, WarmStartConfig(steps=30, batch_size=8, lr=1e-2), seed=0,
               max_action_tokens=SAMPLING.max_new_tokens)
    engine = HFEngine(model, tokenizer)
    return task, engine, EpisodePlayer(engine, task, str(tiny_model_dir))


def leased(task, codec: Codec, sampling_seeds: list[int]) -> list[Task]:
    """What the coordinator hands a worker: one lease per seed, each with its episode seed."""
    out = []
    for index, seed in enumerate(sampling_seeds):
        episode_seed = task.train_seed(index)
        prompt = task.episode(codec, episode_seed, SAMPLING.max_new_tokens).prompt_ids
        out.append(Task(lease_id=f"L{index}", prompt_ids=prompt, sampling=SAMPLING, episode_seed=episode_seed,
                        sampling_seed=seed))
    return out


def played(player: EpisodePlayer, tasks: list[Task]) -> list[TrainGroup]:
    return [TrainGroup(lease_id=t.lease_id, prompt_index=i, prompt_ids=t.prompt_ids, version=0, worker_id="w0",
                       rewards=[e.reward for e in group], sampling_seed=t.sampling_seed,
                       completions=[RolloutCompletion(token_ids=e.token_ids, logprobs=e.logprobs, segments=e.segments)
                                    for e in group])
            for i, (t, group) in enumerate(zip(tasks, player.play(tasks), strict=True))]


@pytest.fixture(scope="module")
def honest(setup):
    task, _, player = setup
    return played(player, leased(task, player.codec, [101, 202, 303]))


def model_tokens(group: TrainGroup) -> int:
    return sum(int(sum(loss_mask(c))) for c in group.completions)


def test_honest_episodes_pass_the_sampler_audit_on_the_models_tokens(setup, honest):
    task, engine, player = setup
    pad = engine.tokenizer.pad_token_id
    later_turns = [c for g in honest for c in g.completions if len(c.segments) >= 3]
    assert len(later_turns) >= 3, "too few episodes reach a second action to check its positions"
    for group in honest:
        shortfalls = group_shortfalls(engine.model, None, group, temperature=1.0, pad_id=pad)
        assert len(shortfalls) == model_tokens(group) < sum(len(c.token_ids) for c in group.completions)
        assert float(shortfalls.max()) < 1e-4  # every action token is the sampler's choice
    # the seeds fix every action: the same leases play the same transcripts, other seeds others
    assert played(player, leased(task, player.codec, [101, 202, 303])) == honest
    other = played(player, leased(task, player.codec, [909, 808, 707]))
    assert [g.completions for g in other] != [g.completions for g in honest]


def test_the_environments_tokens_are_not_the_samplers_and_are_left_out(setup, honest):
    """Checked as if they were sampled, the template and observation tokens between actions
    would fail honest episodes: the loss mask is what the check follows."""
    _, engine, _ = setup
    pad = engine.tokenizer.pad_token_id
    flagged = 0
    for group in honest:
        unmasked = group.model_copy(update={"completions": [c.model_copy(update={"segments": []})
                                                            for c in group.completions]})
        flagged += violations(group_shortfalls(engine.model, None, unmasked, temperature=1.0, pad_id=pad), MARGIN)
    assert flagged > 0


def true_logprobs(model, prompt: list[int], token_ids: list[int], mask: list[float]) -> list[float]:
    """log pi(token | prefix) of each of the model's tokens at T = 1, 0.0 for the environment's."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + token_ids])).logits[0].float(), -1)
    return [float(logp[len(prompt) + j - 1, t]) if m else 0.0
            for j, (t, m) in enumerate(zip(token_ids, mask, strict=True))]


def chosen_action(model, group: TrainGroup) -> tuple[TrainGroup, int, float]:
    """What a worker that chooses one action returns: in its longest episode, the first token of
    the last action (after the environment's answers) swapped for the likeliest other token (an
    attacker's pick), every log-prob the model's own, so the log-prob audit cannot tell. Also
    the swapped token's index among the group's model tokens (its place in the shortfalls) and
    its shortfall computed directly: sample k of the lease's seed, at its index in the transcript."""
    k = max(range(len(group.completions)), key=lambda i: len(group.completions[i].segments))
    completion = group.completions[k]
    assert len(completion.segments) >= 3  # a later turn: its positions follow the environment's tokens
    ids, mask = list(completion.token_ids), loss_mask(completion)
    at = len(ids) - completion.segments[-1]
    with torch.no_grad():
        logits = model(torch.tensor([group.prompt_ids + ids])).logits[0, len(group.prompt_ids) + at - 1].float()
    ids[at] = int(logits.masked_fill(torch.arange(len(logits)) == ids[at], -float("inf")).argmax())
    gap = float(shortfall(logits[None], torch.tensor([ids[at]]), 1.0, group.sampling_seed,
                          samples_N=torch.tensor([k]), positions_N=torch.tensor([at])))
    changed = completion.model_copy(update={"token_ids": ids,
                                            "logprobs": true_logprobs(model, group.prompt_ids, ids, mask)})
    completions = [*group.completions[:k], changed, *group.completions[k + 1:]]
    index = sum(int(sum(loss_mask(c))) for c in completions[:k]) + int(sum(mask[:at]))
    return group.model_copy(update={"lease_id": "chosen-" + group.lease_id, "completions": completions}), index, gap


def test_an_episode_with_one_chosen_action_token_fails_the_audit(setup, honest):
    _, engine, _ = setup
    pad, model = engine.tokenizer.pad_token_id, engine.model
    chosen, expected = [], []
    for group in honest:
        tampered, index, gap = chosen_action(model, group)
        shortfalls = group_shortfalls(model, None, tampered, temperature=1.0, pad_id=pad)
        assert float(shortfalls[:index].max()) < 1e-4  # before it, the sampler's own tokens
        assert gap > 1e-3 and abs(float(shortfalls[index]) - gap) < 1e-4  # the swap, where the worker drew it
        chosen.append(tampered)
        expected.append(bool((shortfalls > MARGIN).any()))
    auditor = Auditor(AuditConfig(recompute_fraction=1.0, sampler_margin=MARGIN), max_staleness=1, secret=b"s",
                      exact_wire=True)
    auditor.published(0, model_payload(model))
    # a step after the groups' version: both checks recompute them under the published version
    verdicts = {v.lease_id: v for v in auditor.check_before_step(
        model, [*honest, *chosen], step=1, grpo=GRPOConfig(), temperature=1.0, pad_id=pad, precision=CPU_FP32)}
    tolerance = AuditConfig().max_mean_abs_logprob_diff
    assert all(verdicts[g.lease_id].sampler_violations == 0 and not verdicts[g.lease_id].failed for g in honest)
    assert all(verdicts[g.lease_id].mean_abs_logprob_diff < tolerance for g in chosen)  # the model's log-probs
    # one swapped token fails its group when its Gumbel gap passes the margin: often, not always
    failed = [verdicts[g.lease_id].failed for g in chosen]
    assert failed == expected and sum(failed) >= 2, failed
