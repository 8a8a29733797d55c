"""In-flight weight updates with the HF engine: a generation that straddles two versions returns
tokens whose versions and behaviour log-probs are what each version gives for that prefix (and,
seeded, what the sampler picks under it); the learner trains a mixed-version group token by
token, masking what is older than S; and the audit recomputes each segment under its own version,
so a worker that labels old-version tokens as new is caught."""

from __future__ import annotations

import pytest
import torch
from tests.unit.test_rollout_audit import perturbed_state

from echo2.config.audit import AuditConfig
from echo2.config.run import GRPOConfig
from echo2.learner.audit import Auditor
from echo2.learner.precision import CPU_FP32
from echo2.learner.step import train_step
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.sampler import choose
from echo2.models.weights import model_payload
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.protocol.token_versions import expand
from echo2.rollout.engine import GenRequest, InFlight
from echo2.rollout.hf_engine import HFEngine

TEMPERATURE = 0.9
SEGMENT = 3
MAX_NEW = 8


class Swapper:
    """An InFlight whose one newer version (`v1`) is staged from the start: the first boundary
    swaps it in."""

    def __init__(self, engine: HFEngine, v1: dict[str, torch.Tensor]) -> None:
        self.engine, self.v1, self.swapped = engine, v1, 0

    def inflight(self) -> InFlight:
        return InFlight(segment_tokens=SEGMENT, version=0, pending=lambda: not self.swapped, swap=self._swap)

    def _swap(self) -> int:
        self.engine.load_state_dict(self.v1)
        self.swapped += 1
        return 1


@pytest.fixture(scope="module")
def versions(tiny_model_dir):
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    v0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    return v0, perturbed_state(model, scale=0.2)


def straddled(tiny_model_dir, versions, seed: int | None = 11) -> tuple[list[list], list[list[int]]]:
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in ("3+4=", "12+9=")]
    swapper = Swapper(engine, versions[1])
    torch.manual_seed(0)
    out = engine.generate([GenRequest(p, 4, TEMPERATURE, MAX_NEW, seed=seed) for p in prompts], swapper.inflight())
    assert swapper.swapped == 1
    return out, prompts


def logprobs_under(tiny_model_dir, state, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float() / TEMPERATURE
    return torch.log_softmax(logits, -1)[len(prompt) - 1: len(prompt) - 1 + len(tokens)]


@pytest.mark.parametrize("seed", [11, None])
def test_a_straddling_generation_carries_each_versions_tokens_and_logprobs(tiny_model_dir, versions, seed):
    groups, prompts = straddled(tiny_model_dir, versions, seed)
    straddling = 0
    for prompt, group in zip(prompts, groups, strict=True):
        for sample, c in enumerate(group):
            per_token = expand(c.token_versions, len(c.token_ids), 0)
            assert per_token == [0 if i < SEGMENT else 1 for i in range(len(c.token_ids))]
            straddling += len(c.token_ids) > SEGMENT
            for version, state in enumerate(versions):
                logp = logprobs_under(tiny_model_dir, state, prompt, c.token_ids)
                for i, (token, behaviour) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
                    if per_token[i] == version:
                        assert behaviour == pytest.approx(float(logp[i, token]), abs=1e-4)
                if seed is not None:  # the seeded sampler's own choice under the version that drew it
                    picked = choose(logp * TEMPERATURE, TEMPERATURE, seed,
                                    samples_N=torch.full((len(c.token_ids),), sample),
                                    positions_N=torch.arange(len(c.token_ids)))
                    assert all(int(picked[i]) == t for i, t in enumerate(c.token_ids) if per_token[i] == version)
    assert straddling >= 4  # most rows ran past the boundary (an untrained model rarely stops early)


def group_of(c_list, prompt, token_versions=None, version=0, lease_id="g") -> TrainGroup:
    completions = [RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs,
                                     token_versions=c.token_versions if token_versions is None else token_versions(c))
                   for c in c_list]
    return TrainGroup(lease_id=lease_id, prompt_index=0, prompt_ids=prompt, version=version, worker_id="w",
                      rewards=[float(i % 2) for i in range(len(completions))], completions=completions,
                      sampling_seed=11)


def reference_loss(model, groups: list[TrainGroup], step: int, S: int, cfg: GRPOConfig) -> torch.Tensor:
    """`tis` written out token by token: tokens older than S left out of the terms and the count."""
    terms = []
    for group in groups:
        rewards = torch.tensor(group.rewards)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for c, adv in zip(group.completions, advantages, strict=True):
            row = torch.tensor([group.prompt_ids + c.token_ids])
            logp = torch.log_softmax(model(input_ids=row).logits[0].float() / TEMPERATURE, dim=-1)
            start = len(group.prompt_ids)
            token_versions = expand(c.token_versions, len(c.token_ids), group.version)
            for j, (token, behav, v) in enumerate(zip(c.token_ids, c.logprobs, token_versions, strict=True)):
                if step - v > S:
                    continue
                lp = logp[start + j - 1, token]
                weight = torch.exp(lp.detach() - behav).clamp(max=cfg.tis_cap)
                terms.append(-weight * torch.exp(lp - lp.detach()) * adv)
    return torch.stack(terms).sum() / len(terms)


def test_the_loss_on_a_mixed_version_group_equals_the_token_by_token_reference(tiny_model_dir, versions):
    groups, prompts = straddled(tiny_model_dir, versions)
    batch = [group_of(g, p, lease_id=f"g{i}") for i, (g, p) in enumerate(zip(groups, prompts, strict=True))]
    cfg = GRPOConfig(loss="tis", micro_batch_tokens=40)
    torch.manual_seed(0)
    reference = load_model(str(tiny_model_dir))
    loss = reference_loss(reference, batch, step=2, S=1, cfg=cfg)  # version 0's tokens are 2 steps old
    loss.backward()
    model = load_model(str(tiny_model_dir))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    grads = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.clone()))
             for n, p in model.named_parameters()]
    stats = train_step(model, optimizer, batch, step=2, cfg=cfg, temperature=TEMPERATURE, pad_id=0, max_staleness=1)
    for hook in hooks:
        hook.remove()
    old = sum(min(SEGMENT, len(c.token_ids)) for g in groups for c in g)
    assert (stats["tokens_masked_stale"] == old
            and stats["tokens"] == sum(len(c.token_ids) for g in groups for c in g) - old)
    assert stats["token_staleness_hist"] == {"1": stats["tokens"]} and stats["staleness_hist"] == {"2": 2}
    assert stats["groups_straddling"] == 2
    assert stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-6)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
    # at step 1 nothing is masked: every token trains
    stats = train_step(load_model(str(tiny_model_dir)), optimizer, batch, step=1, cfg=cfg, temperature=TEMPERATURE,
                       pad_id=0, max_staleness=1)
    assert stats["tokens_masked_stale"] == 0 and stats["token_staleness_hist"] == {"0": stats["tokens"] - old, "1": old}


def test_the_audit_checks_each_segment_under_its_version_and_catches_old_tokens_labelled_new(tiny_model_dir,
                                                                                                 versions):
    v0, v1 = versions
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    auditor = Auditor(AuditConfig(recompute_fraction=1.0), max_staleness=2, secret=b"s")
    auditor.published(0, model_payload(model, torch.float32))
    model.load_state_dict(v1, strict=False)
    auditor.published(1, model_payload(model, torch.float32))
    groups, prompts = straddled(tiny_model_dir, versions)
    honest = [group_of(g, p, lease_id=f"honest{i}") for i, (g, p) in enumerate(zip(groups, prompts, strict=True))]
    # a worker that never swapped (every token from version 0) but labels the later tokens version 1
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    old = engine.generate([GenRequest(p, 4, TEMPERATURE, MAX_NEW, seed=11) for p in prompts])
    relabel = lambda c: [(0, SEGMENT), (1, len(c.token_ids) - SEGMENT)] if len(c.token_ids) > SEGMENT else []  # noqa: E731
    liar = [group_of(g, p, token_versions=relabel, lease_id=f"liar{i}")
            for i, (g, p) in enumerate(zip(old, prompts, strict=True))]
    verdicts = auditor.check_before_step(model, honest + liar, step=1, grpo=GRPOConfig(), temperature=TEMPERATURE,
                                         pad_id=0, precision=CPU_FP32)
    by_lease = {v.lease_id: v for v in verdicts}
    for g in honest:
        v = by_lease[g.lease_id]
        assert v.recomputed and not v.failed and v.mean_abs_logprob_diff < 1e-4 and v.sampler_violations == 0
    for g in liar:
        assert by_lease[g.lease_id].failed and by_lease[g.lease_id].sampler_violations > 0


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_the_emulated_slowdown_paces_each_decode_step_and_changes_no_token(tiny_model_dir, clock):
    """worker.slowdown on the HF engine idles after every decode step (so a version can arrive
    mid-generation, as on slower hardware): the same seeded tokens, several times the time, by
    either clock (worker.slowdown_clock)."""
    import time

    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    engine.slowdown_clock = clock
    tokenizer = load_tokenizer(str(tiny_model_dir))
    requests = [GenRequest(tokenizer.encode("3+4=", add_special_tokens=False), 4, TEMPERATURE, MAX_NEW, seed=5)]
    engine.generate(requests)  # warm
    timed = {}
    for slowdown in (1.0, 4.0):
        engine.slowdown = slowdown
        runs = []
        for _ in range(3):  # the fastest of three: a loaded machine (make test on 2 cores) stalls single runs
            started = time.perf_counter()
            runs.append((engine.generate(requests), time.perf_counter() - started))
        timed[slowdown] = (runs[0][0], min(t for _, t in runs))
    assert [c.token_ids for c in timed[1.0][0][0]] == [c.token_ids for c in timed[4.0][0][0]]
    assert timed[4.0][1] > 2.0 * timed[1.0][1]


def test_with_two_settings_in_one_call_only_the_last_swaps_so_every_row_starts_at_the_calls_version(
        tiny_model_dir, versions):
    """A multi-turn turn may hold actions of different budgets (one generate call per setting):
    a swap in the first setting would start the second's rows under a version their empty
    token_versions could not say, so only the last setting swaps."""
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    prompt = tokenizer.encode("3+4=", add_special_tokens=False)
    swapper = Swapper(engine, versions[1])
    short, long = engine.generate([GenRequest(prompt, 2, TEMPERATURE, MAX_NEW - 2, seed=5),
                                   GenRequest(prompt, 2, TEMPERATURE, MAX_NEW, seed=6)], swapper.inflight())
    assert swapper.swapped == 1
    for c in short:  # every token version 0's
        assert c.token_versions == []
        logp = logprobs_under(tiny_model_dir, versions[0], prompt, c.token_ids)
        assert c.logprobs == pytest.approx([float(logp[i, t]) for i, t in enumerate(c.token_ids)], abs=1e-4)
    straddled = [c for c in long if len(c.token_ids) > SEGMENT]
    assert straddled and all(c.token_versions[0] == (0, SEGMENT) for c in straddled)
