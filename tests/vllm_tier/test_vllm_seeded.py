"""The vLLM engine draws with the seeded sampler (`make test-vllm`): every token is the one the
learner's audit, recomputing the logits with Hugging Face transformers, says the lease's seed
picks; the log-probs returned are log_softmax(logits / T) at those tokens; the seed fixes the
completions; a request's first_sample and first_position are the sampler's indices."""

from __future__ import annotations

import pytest
import torch
from tests.vllm_tier.conftest import report

from echo2.config.worker import VLLMConfig
from echo2.learner.logprobs import collate, token_logprobs
from echo2.learner.sampler_audit import group_shortfalls
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.sampler import choose
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.rollout.engine import GenRequest

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(model_dir):
    from echo2.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(model_dir), "cpu", VLLMConfig(seed=0, max_model_len=96))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(str(model_dir)).eval()  # the weights the engine loaded: nothing here changes them


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(str(model_dir))


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(f"{a}+{b}=", add_special_tokens=False) for a in range(4) for b in range(3)]


def _groups(engine, prompts, seed0: int, temperature: float, n: int = 4, max_new: int = 8) -> list[TrainGroup]:
    """One group per prompt, each under its own seed (a lease's)."""
    done = engine.generate([GenRequest(p, n, temperature, max_new, seed=seed0 + i) for i, p in enumerate(prompts)])
    return [TrainGroup(lease_id=f"L{seed0 + i}", prompt_index=i, prompt_ids=p, version=0, worker_id="w0",
                       rewards=[0.0] * n, sampling_seed=seed0 + i,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in group])
            for i, (p, group) in enumerate(zip(prompts, done, strict=True))]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_every_token_is_the_samplers_choice_with_its_behaviour_logprob(engine, model, tokenizer, temperature):
    pad = tokenizer.pad_token_id
    groups = _groups(engine, _prompts(tokenizer), 100, temperature)
    assert [len(g.completions) for g in groups] == [4] * len(groups)
    shortfalls = torch.cat([group_shortfalls(model, None, g, temperature=temperature, pad_id=pad) for g in groups])
    assert len(shortfalls) == sum(len(c.token_ids) for g in groups for c in g.completions)
    # under another seed the same tokens fall short by the Gumbel gap: the check above is not vacuous
    other = [group_shortfalls(model, None, g.model_copy(update={"sampling_seed": g.sampling_seed + 7}),
                              temperature=temperature, pad_id=pad) for g in groups]
    rows = [(g.prompt_ids, c.token_ids) for g in groups for c in g.completions]
    batch = collate([p for p, _ in rows], [c for _, c in rows], list(range(len(rows))), pad)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch, temperature, chunk_tokens=64)
    behaviour = torch.tensor([x for g in groups for c in g.completions for x in c.logprobs])
    diff = (learner.double() - behaviour.double()).abs()
    report(test="seeded", temperature=temperature, tokens=len(shortfalls), max_shortfall=float(shortfalls.max()),
           other_seed_groups_flagged=sum(float(s.max()) > 0.5 for s in other), max_abs_logprob_diff=float(diff.max()))
    assert float(shortfalls.max()) < 0.05  # fp32 on both sides: only a near-tie could fall short at all
    assert sum(float(s.max()) > 0.5 for s in other) >= len(groups) - 1
    assert float(diff.max()) < 1e-4  # log_softmax(logits / T) at the token, not vLLM's raw log-probs


def _tokens(groups: list[TrainGroup]) -> list[list[tuple[int, ...]]]:
    return [[tuple(c.token_ids) for c in g.completions] for g in groups]


def test_the_seed_fixes_the_completions(engine, tokenizer):
    prompts = _prompts(tokenizer)[:4]
    first, again, other = (_tokens(_groups(engine, prompts, seed, 1.0)) for seed in (500, 500, 600))
    assert first == again
    assert all(a != b for a, b in zip(first, other, strict=True))
    # the samples of a group are distinct draws, not one draw repeated
    assert all(len(set(g)) > 1 for g in first)


def test_requests_without_a_seed_draw_under_fresh_ones(engine, tokenizer):
    """A multi-turn episode's turns carry no lease seed: each call draws new completions."""
    prompt = _prompts(tokenizer)[0]
    [first], [second] = (engine.generate([GenRequest(prompt, 4, 1.0, 8)]) for _ in range(2))
    assert [c.token_ids for c in first] != [c.token_ids for c in second]


def test_a_request_continues_the_samplers_indices_where_it_says(engine, model, tokenizer):
    """A later turn of an episode is one completion at sample `first_sample`, its first token at
    position `first_position`: the tokens are the sampler's choices at those indices."""
    prompt = _prompts(tokenizer)[5]
    [[done]] = engine.generate([GenRequest(prompt, 1, 0.7, 6, seed=42, first_sample=3, first_position=7)])
    with torch.no_grad():
        logits = model(torch.tensor([prompt + done.token_ids])).logits[0, len(prompt) - 1: -1].float()
    k = len(done.token_ids)
    expected = choose(logits, 0.7, 42, samples_N=torch.full((k,), 3), positions_N=torch.arange(7, 7 + k))
    assert done.token_ids == expected.tolist()
    # the fourth completion of a group is the one request asking for sample 3 alone
    [group] = engine.generate([GenRequest(prompt, 4, 0.7, 6, seed=42)])
    [[alone]] = engine.generate([GenRequest(prompt, 1, 0.7, 6, seed=42, first_sample=3)])
    assert group[3].token_ids == alone.token_ids and group[0].token_ids != alone.token_ids
    assert alone.token_ids != done.token_ids  # first_position moved the noise


def test_a_temperature_of_zero_is_refused_before_it_reaches_the_engine(engine, tokenizer):
    with pytest.raises(ValueError, match="temperature > 0"):
        engine.generate([GenRequest(_prompts(tokenizer)[0], 2, 0.0, 4, seed=1)])
