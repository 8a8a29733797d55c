"""The learner's version check (learner.version_check) on real seeded samples from the HF engine,
with versions one real training step apart: an honest worker's tokens are its claimed version's
choice wherever an older version would have chosen otherwise, a worker sampling one or two
versions older than it claims passes every per-group check yet its tokens fit the older version,
and the coordinator's ledger quarantines it on the evidence of a few groups; one three versions
older, staler than S, has every group held out."""

from __future__ import annotations

import pytest
import torch

from echo2.config.audit import AuditConfig
from echo2.config.run import GRPOConfig
from echo2.coordinator.parts.audit import AuditLedger
from echo2.learner.audit import Auditor, audit_skip_reason, recompute_mean_abs_diff
from echo2.learner.precision import CPU_FP32
from echo2.learner.step import train_step
from echo2.learner.version_check import fits, may_be_staler, merge, version_checks, with_logprob_fits
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import model_payload, payload_tensors
from echo2.policy.evidence import VersionEvidence
from echo2.protocol.learner_api import AuditReport, VersionCheck
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.rollout.engine import GenRequest
from echo2.rollout.hf_engine import HFEngine

GRPO = GRPOConfig(prompts_per_step=4, lr=5e-3)
STEPS = 3


def _seeded(engine: HFEngine, version: int, worker_id: str, seed: int, groups: int = 4) -> list[TrainGroup]:
    """What a worker holding the engine's weights returns when it says they are `version`."""
    tok = engine.tokenizer
    prompts = [tok.encode(f"{(seed + i) % 10}+{i}=", add_special_tokens=False) for i in range(groups)]
    out = engine.generate([GenRequest(p, 4, 1.0, 8, seed=seed + i) for i, p in enumerate(prompts)])
    return [TrainGroup(lease_id=f"{worker_id}-{seed}-{i}", prompt_index=i, prompt_ids=p, version=version,
                       worker_id=worker_id, rewards=[float(k % 2) for k in range(4)], sampling_seed=seed + i,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in comps])
            for i, (p, comps) in enumerate(zip(prompts, out, strict=True))]


@pytest.fixture(scope="module")
def versions(tiny_model_dir):
    """The learner's model after STEPS real steps, and every version's published payload."""
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    engine = HFEngine(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)))
    opt = torch.optim.AdamW(model.parameters(), lr=GRPO.lr)
    payloads = [model_payload(model)]
    for step in range(STEPS):
        engine.load_state_dict(payload_tensors(payloads[-1]))
        train_step(model, opt, _seeded(engine, step, "trainer", 100 * step), step=step, cfg=GRPO, temperature=1.0,
                   pad_id=engine.tokenizer.pad_token_id)
        payloads.append(model_payload(model))
    return model, engine, payloads


def _holding(engine: HFEngine, payloads, version: int) -> HFEngine:
    engine.load_state_dict(payload_tensors(payloads[version]))
    return engine


def _audit(model, payloads, groups: list[TrainGroup], version_margin: float = 0.0):
    """By default every position where the versions' choices differ, near-ties included: an fp32
    engine picks the claimed version's at each (audit.version_margin leaves near-ties out for bf16)."""
    auditor = Auditor(AuditConfig(recompute_fraction=1.0, version_margin=version_margin), max_staleness=2,
                      secret=b"s", exact_wire=True)
    for version, payload in enumerate(payloads):
        auditor.published(version, payload)
    assert len(auditor.cache.payloads) == len(payloads)  # S + 1 + older_versions kept by default
    before = auditor.check_before_step(model, groups, step=STEPS, grpo=GRPO, temperature=1.0,
                                       pad_id=0, precision=CPU_FP32)
    # groups claiming the current version: their differences are the step's own (train_step)
    current = [g for g in groups if g.version == STEPS]
    diffs = recompute_mean_abs_diff(model, payload_tensors(payloads[STEPS]), current, grpo=GRPO, temperature=1.0,
                                    pad_id=0)
    return before + auditor.check_current(current, STEPS, diffs)


def test_an_honest_workers_tokens_fit_its_claimed_version_and_a_liars_fit_the_older_one(versions):
    model, engine, payloads = versions
    honest = _seeded(_holding(engine, payloads, STEPS), STEPS, "honest", 7)
    stale_honest = _seeded(_holding(engine, payloads, 1), 1, "stale", 8)  # honestly one version old
    lie1 = _seeded(_holding(engine, payloads, STEPS - 1), STEPS, "lie1", 9)
    lie2 = _seeded(_holding(engine, payloads, STEPS - 2), STEPS, "lie2", 10)
    lie3 = _seeded(_holding(engine, payloads, STEPS - 3), STEPS, "lie3", 12)
    verdicts = {v.lease_id: v for v in _audit(model, payloads, honest + stale_honest + lie1 + lie2 + lie3)}

    def totals(groups) -> list[VersionCheck]:
        out: list[VersionCheck] = []
        for g in groups:
            out = merge(out, verdicts[g.lease_id].version_checks)
        return out

    for groups, claimed in ((honest, STEPS), (stale_honest, 1)):
        checks = totals(groups)
        assert checks and all(c.older == 0 for c in checks), checks
        assert sum(c.claimed for c in checks) > 0  # the versions do disagree somewhere: the check saw it
        assert fits(claimed, checks) == claimed
    assert [c.offset for c in totals(stale_honest)] == [1]  # only version 0 is older than its claim
    for groups, sampled in ((lie1, STEPS - 1), (lie2, STEPS - 2)):
        checks = totals(groups)
        assert fits(STEPS, checks) == sampled, checks
        assert next(c for c in checks if c.offset == STEPS - sampled).claimed == 0
        # a small lie: every group passes the per-group checks, and those whose own tokens fit the
        # older version are held out of training (the rest agree with the claimed version's choices)
        assert not any(verdicts[g.lease_id].failed for g in groups)
        assert all(verdicts[g.lease_id].sampler_violations == 0 for g in groups)
        assert all(verdicts[g.lease_id].held_out for g in groups if fits(STEPS, verdicts[g.lease_id].version_checks)
                   < STEPS)
        assert any(verdicts[g.lease_id].held_out for g in groups)
    assert not any(verdicts[g.lease_id].held_out for g in honest + stale_honest)
    # their log-probs too: an fp32 engine's differ from the claimed version's by numerics only
    # (below LOGPROB_FIT_FLOOR: no observation), a liar's fit the version it sampled with
    assert all(c.logprob_fit is None for g in honest + stale_honest for c in verdicts[g.lease_id].version_checks)
    for groups, lie in ((lie1, 1), (lie2, 2), (lie3, 3)):
        fit = [next(c for c in verdicts[g.lease_id].version_checks if c.offset == lie).logprob_fit for g in groups]
        assert fit == [True] * len(groups), fit
    # three versions older: staler than S = 2 even claiming the current version, so every one of
    # its groups is held out, by its tokens or, where both versions choose every token alike, by
    # its log-probs, which are version 0's
    assert all(verdicts[g.lease_id].held_out and not verdicts[g.lease_id].failed for g in lie3)

    ledger = AuditLedger(2, evidence=VersionEvidence(3, 0.9, 1e-3))
    newly = ledger.record(AuditReport(step=STEPS, groups=[verdicts[g.lease_id] for g in honest + stale_honest]))
    assert newly == {} and ledger.workers["honest"].version_evidence_nats < 0
    for groups, fit in ((lie1, "fits 2"), (lie2, "fits 1")):
        reports = [ledger.record(AuditReport(step=STEPS, groups=[verdicts[g.lease_id]])) for g in groups]
        # one group at a time, as steps report them: quarantined once, on the last group or before
        assert [list(r) for r in reports if r] == [[groups[0].worker_id]]
        assert fit in next(r for r in reports if r)[groups[0].worker_id]


def test_at_the_default_margin_a_liars_log_probs_still_give_it_away(versions):
    """audit.version_margin leaves out the near-ties where an fp32 liar's tokens tell (above),
    and its groups' log-probs, which fit the version it sampled with, carry the evidence."""
    model, engine, payloads = versions
    ledger = AuditLedger(2, evidence=VersionEvidence(3, 0.9, 1e-3))
    for worker, lie in (("lie1", 1), ("lie2", 2)):
        groups = _seeded(_holding(engine, payloads, STEPS - lie), STEPS, worker, 20 + lie)
        verdicts = _audit(model, payloads, groups, version_margin=AuditConfig().version_margin)
        newly = [ledger.record(AuditReport(step=STEPS, groups=[v])) for v in verdicts]
        assert [list(n) for n in newly if n] == [[worker]], ledger.workers[worker]
        assert f"log-probs fit the version {lie} older" in next(n for n in newly if n)[worker]


def test_version_checks_count_each_sides_choices_and_refuse_misaligned_tokens():
    claimed = torch.tensor([0.0, 0.0, 0.3, 0.2, 0.0])
    older = torch.tensor([0.0, 0.5, 0.0, 0.1, 0.0])
    assert version_checks(claimed, {1: older}) == [VersionCheck(offset=1, claimed=1, older=1)]
    # a margin leaves out near-ties: the older version's choice at index 2 is 0.3 ahead of the
    # token under the claimed version, the claimed one's at index 1 is 0.5 ahead under the older
    assert version_checks(claimed, {1: older}, margin=0.4) == [VersionCheck(offset=1, claimed=1, older=0)]
    assert version_checks(claimed, {1: older}, margin=0.5) == [VersionCheck(offset=1, claimed=0, older=0)]
    assert fits(5, [VersionCheck(offset=1, claimed=1, older=1)]) == 5  # a tie keeps the claim
    assert fits(5, [VersionCheck(offset=1, claimed=0, older=1), VersionCheck(offset=2, claimed=0, older=3)]) == 3
    with pytest.raises(ValueError, match="cover"):
        version_checks(claimed, {1: older[:3]})


def test_the_coordinators_audit_mode_overrides_the_draw_and_holds_out(versions):
    model, engine, payloads = versions
    groups = _seeded(_holding(engine, payloads, STEPS - 1), STEPS - 1, "w", 11, groups=3)
    always, hold, by_chance = (g.model_copy(update={"audit": mode})
                               for g, mode in zip(groups, ("always", "hold_out", "by_chance"), strict=True))
    unseeded = hold.model_copy(update={"lease_id": "unseeded", "sampling_seed": None, "worker_id": "free"})
    other = by_chance.model_copy(update={"lease_id": "other", "worker_id": "x"})
    auditor = Auditor(AuditConfig(recompute_fraction=0.0), max_staleness=2, secret=b"s", exact_wire=True)
    for version, payload in enumerate(payloads):
        auditor.published(version, payload)
    verdicts = {v.lease_id: v for v in auditor.check_before_step(
        model, [always, hold, by_chance, unseeded, other], step=STEPS, grpo=GRPO, temperature=1.0, pad_id=0,
        precision=CPU_FP32)}
    # the draw at 0 picks none by chance; the worker's group it left unchecked is held out beside
    # its held-out one (a companion), another worker's is not
    assert set(verdicts) == {always.lease_id, hold.lease_id, "unseeded", by_chance.lease_id}
    assert verdicts[always.lease_id].recomputed
    assert verdicts[hold.lease_id].held_out and not verdicts[hold.lease_id].failed
    assert verdicts["unseeded"].held_out and verdicts["unseeded"].sampler_violations is None
    companion = verdicts[by_chance.lease_id]
    assert companion.held_out and not companion.recomputed and companion.sampler_violations is None
    assert audit_skip_reason([verdicts[always.lease_id]], 0.15) == ""
    assert "3 group(s) held out" in audit_skip_reason(list(verdicts.values()), 0.15)


def test_a_groups_log_probs_fit_an_older_version_only_by_the_margin_and_above_the_floor():
    checks = [VersionCheck(offset=1, claimed=0, older=0), VersionCheck(offset=2, claimed=0, older=0)]
    claimed = torch.full((4,), 0.04)  # bf16 numerics and a version's gap
    got = with_logprob_fits(checks, claimed, {1: torch.full((4,), 0.019), 2: torch.full((4,), 0.021)})
    assert [c.logprob_fit for c in got] == [True, False]  # under half the claimed difference, or not
    tiny = with_logprob_fits(checks, torch.full((4,), 2e-5), {1: torch.full((4,), 1e-6)})
    assert [c.logprob_fit for c in tiny] == [None, None]  # an fp32 engine's numerics: no observation
    assert with_logprob_fits(checks, torch.empty(0), {}) == checks
    # a group sampled by two versions: each segment's fit is against its own version, none is kept
    merged = merge(got, [VersionCheck(offset=1, claimed=1, older=0, logprob_fit=False)])
    assert merged[0] == VersionCheck(offset=1, claimed=1, older=0) and merged[1].logprob_fit is False
    # a fit to a version staler than S holds the group out though no token tells
    assert may_be_staler(7, [VersionCheck(offset=3, claimed=0, older=0, logprob_fit=True)], step=7, max_staleness=2)
    assert not may_be_staler(7, [VersionCheck(offset=2, claimed=0, older=0, logprob_fit=True)], step=7,
                             max_staleness=2)


def test_a_group_whose_tokens_fit_a_version_staler_than_s_as_well_as_its_claim_is_held_out():
    def staler(version, step, *checks):
        return may_be_staler(version, [VersionCheck(offset=o, claimed=c, older=x) for o, c, x in checks],
                             step=step, max_staleness=2)

    assert staler(7, 7, (3, 1, 1))  # fresh, but its tokens fit version 4 (staleness 3) as well as 7
    assert not staler(7, 7, (3, 2, 1))  # more of them are version 7's choice
    assert not staler(7, 7, (1, 0, 3), (2, 0, 3))  # a lie that stays within S: left to the evidence
    assert staler(5, 7, (1, 4, 0), (2, 0, 2))  # at S already: any older version is too stale
    assert not staler(5, 7, (1, 0, 0), (2, 0, 0), (3, 0, 0))  # every token the claimed version's choice
