"""The seeded sampler (models/sampler.py) and its audit (learner/sampler_audit.py): the noise is
a pure function of (seed, sample, position, token) any device recomputes, a draw is an exact
sample of softmax(logits / T), the HF engine draws with it and the learner recomputes its choice
exactly, a worker that chooses its tokens (with their true log-probs) fails the audit, and the
coordinator hands every lease a seed it keeps with the group (multi-turn episodes:
test_episode_sampler.py and test_episode_submissions.py)."""

from __future__ import annotations

import pytest
import torch
from tests.unit.coordinator_helpers import FakeClock, lease, make_state, publish, register, submission

from echo2.config.audit import AuditConfig
from echo2.coordinator.records.errors import RequestError
from echo2.learner.audit import Auditor
from echo2.learner.sampler_audit import group_shortfalls, violations
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.sampler import choose, gumbel_noise, mix32
from echo2.protocol.messages import RegisterRequest, RolloutCompletion, TrainGroup
from echo2.rollout.engine import GenRequest
from echo2.rollout.hf_engine import HFEngine


def _lowbias32(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_the_mixer_is_lowbias32_without_overflow_and_the_noise_is_keyed():
    values = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
    assert mix32(torch.tensor(values)).tolist() == [_lowbias32(v) for v in values]
    rows, positions = torch.tensor([0, 1, 0]), torch.tensor([0, 0, 1])
    noise = gumbel_noise(7, rows, positions, 50)
    assert torch.equal(noise, gumbel_noise(7, rows, positions, 50))  # a pure function
    assert not torch.equal(noise, gumbel_noise(8, rows, positions, 50))  # the seed matters
    assert len({tuple(r.tolist()) for r in noise}) == 3  # so do the sample and the position


def test_a_seeded_draw_is_a_sample_of_the_softmax():
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0])
    n = 100_000
    drawn = choose(logits.expand(n, 4), 0.7, 11, samples_N=torch.zeros(n, dtype=torch.long),
                   positions_N=torch.arange(n))
    freq = torch.bincount(drawn, minlength=4).double() / n
    expected = torch.softmax(logits.double() / 0.7, dim=0)
    assert torch.all((freq - expected).abs() < 4 * torch.sqrt(expected * (1 - expected) / n)), (freq, expected)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)))


def _groups(engine, seed: int, prompts: list[list[int]], temperature=1.0, n=4, max_new=6) -> list[TrainGroup]:
    requests = [GenRequest(p, n, temperature, max_new, seed=seed + i) for i, p in enumerate(prompts)]
    return [TrainGroup(lease_id=f"L{i}", prompt_index=i, prompt_ids=p, version=0, worker_id="w0",
                       rewards=[0.0] * n, sampling_seed=seed + i,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in group])
            for i, (p, group) in enumerate(zip(prompts, engine.generate(requests), strict=True))]


def _prompts(engine) -> list[list[int]]:
    tok = engine.tokenizer
    return [tok.encode(f"{a}+{b}=", add_special_tokens=False) for a, b in ((1, 2), (3, 4), (5, 55))]


def test_the_hf_engine_draws_with_the_seed_and_the_learner_recomputes_its_choice(engine):
    pad = engine.tokenizer.pad_token_id
    first, again = _groups(engine, 100, _prompts(engine)), _groups(engine, 100, _prompts(engine))
    assert [g.completions for g in first] == [g.completions for g in again]  # the seed fixes every token
    other = _groups(engine, 200, _prompts(engine))
    assert [g.completions for g in first] != [g.completions for g in other]
    for group in first:
        shortfalls = group_shortfalls(engine.model, None, group, temperature=1.0, pad_id=pad)
        assert len(shortfalls) == sum(len(c.token_ids) for c in group.completions)
        assert float(shortfalls.max()) < 1e-4  # the same weights: the learner picks every token it drew


def test_a_request_continues_the_samplers_indices_where_it_says(engine):
    """A later turn of an episode is one completion at sample `first_sample`, its first token at
    position `first_position`: the tokens are the sampler's choices at those indices."""
    prompt = _prompts(engine)[0]
    [[done]] = engine.generate([GenRequest(prompt, 1, 1.0, 5, seed=42, first_sample=3, first_position=7)])
    ids = torch.tensor([prompt + done.token_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(prompt) - 1: -1].float()
    k = len(done.token_ids)
    expected = choose(logits, 1.0, 42, samples_N=torch.full((k,), 3), positions_N=torch.arange(7, 7 + k))
    assert done.token_ids == expected.tolist()
    # the fourth completion of a group is the one request asking for sample 3 alone
    [group] = engine.generate([GenRequest(prompt, 4, 1.0, 5, seed=42)])
    [[alone]] = engine.generate([GenRequest(prompt, 1, 1.0, 5, seed=42, first_sample=3)])
    assert group[3].token_ids == alone.token_ids and group[0].token_ids != alone.token_ids


def _chosen_tokens(engine, group: TrainGroup, pad_id: int) -> TrainGroup:
    """What a token-choosing worker returns: its own tokens (greedy here, the likeliest), with
    their true log-probs under the version, so the log-prob audit cannot tell."""
    done = engine.greedy([group.prompt_ids] * len(group.completions), len(group.completions[0].token_ids))
    completions = []
    for ids in done:
        with torch.no_grad():
            logits = engine.model(torch.tensor([group.prompt_ids + ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        completions.append(RolloutCompletion(token_ids=ids, logprobs=[
            float(logp[len(group.prompt_ids) + j - 1, t]) for j, t in enumerate(ids)]))
    return group.model_copy(update={"completions": completions, "lease_id": "chosen-" + group.lease_id})


def test_a_worker_that_chooses_its_tokens_fails_and_an_honest_one_passes(engine):
    pad = engine.tokenizer.pad_token_id
    honest = _groups(engine, 300, _prompts(engine))
    chosen = [_chosen_tokens(engine, g, pad) for g in honest]
    auditor = Auditor(AuditConfig(recompute_fraction=1.0), max_staleness=1, secret=b"s", exact_wire=True)
    from echo2.config.run import GRPOConfig
    from echo2.learner.precision import CPU_FP32

    verdicts = auditor.check_before_step(engine.model, honest + chosen, step=0, grpo=GRPOConfig(), temperature=1.0,
                                         pad_id=pad, precision=CPU_FP32)
    failed = {v.lease_id for v in verdicts if v.failed}
    assert auditor.sampler_checked and all(auditor.sampler_checked[g.lease_id] == 0 for g in honest)
    flagged = [violations(group_shortfalls(engine.model, None, g, temperature=1.0, pad_id=pad), 0.05) for g in chosen]
    assert sum(v > 0 for v in flagged) >= 2, flagged  # greedy tokens are often, not always, the sampler's
    assert len(failed) == sum(v > 0 for v in flagged)


def test_the_coordinator_seeds_each_lease_and_keeps_the_seed_with_the_group(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), groups_per_step=1)
    publish(state, 0)
    register(state, "w0")
    task = lease(state, "w0", 0).tasks[0]
    assert task.sampling_seed is not None and 0 <= task.sampling_seed < 2**32
    assert task.sampling_seed == state.leases_book.seed_of(task.lease_id)
    state.intake.submit(submission(state, "w0", task.lease_id, 0))
    assert state.learner_desk.take_batch(0)[0].sampling_seed == task.sampling_seed


def test_a_free_sampling_worker_is_refused_unless_the_run_allows_it(tmp_path, tiny_model_dir):
    state = make_state(tmp_path / "strict", tiny_model_dir, FakeClock())
    with pytest.raises(RequestError, match="sampler 'free'.*engine = 'hf'.*require_seeded_sampler = false"):
        state.worker_desk.register(RegisterRequest(worker_id="v0", engine="vllm", sampler="free"))
    lenient = make_state(tmp_path / "lenient", tiny_model_dir, FakeClock(), groups_per_step=1,
                         require_seeded_sampler=False)
    publish(lenient, 0)
    lenient.worker_desk.register(RegisterRequest(worker_id="v0", engine="vllm", sampler="free"))
    task = lease(lenient, "v0", 0).tasks[0]
    lenient.intake.submit(submission(lenient, "v0", task.lease_id, 0))
    assert lenient.learner_desk.take_batch(0)[0].sampling_seed is None  # audited by log-probs only


def test_groups_checked_together_get_the_shortfalls_of_a_plain_forward_under_the_claimed_weights(engine):
    """The batched check (prompts shared, head on the predicting states, chunked) against a plain
    full forward of each completion under another version's weights, prompts of several
    lengths, in every layout the learner picks."""
    from echo2.learner.sampler_audit import groups_shortfalls
    from echo2.models.sampler import shortfall

    pad = engine.tokenizer.pad_token_id
    groups = _groups(engine, 500, _prompts(engine), temperature=0.8)
    torch.manual_seed(0)
    # tied weights appear once, as in a published version (functional_call ties them again)
    other = {k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
    expected = []
    for group in groups:
        values = []
        for sample, c in enumerate(group.completions):
            ids = torch.tensor([group.prompt_ids + c.token_ids])
            with torch.no_grad():
                logits = torch.func.functional_call(engine.model, other, (ids,)).logits[0]
            predicting = logits[len(group.prompt_ids) - 1: -1].float()
            k = len(c.token_ids)
            values.append(shortfall(predicting, torch.tensor(c.token_ids), 0.8, group.sampling_seed,
                                    samples_N=torch.full((k,), sample), positions_N=torch.arange(k)))
        expected.append(torch.cat(values))
    assert any(float(e.max()) > 0.5 for e in expected)  # other weights: some tokens are no longer the choice
    for share_prompts, chunk_tokens in ((True, 5), (False, 1024)):
        got = groups_shortfalls(engine.model, other, groups, temperature=0.8, pad_id=pad, share_prompts=share_prompts,
                                budget_tokens=40, chunk_tokens=chunk_tokens)
        assert [len(g) for g in got] == [len(e) for e in expected]
        assert all(torch.allclose(g, e, atol=1e-4) for g, e in zip(got, expected, strict=True))
