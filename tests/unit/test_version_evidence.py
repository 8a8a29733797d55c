"""The version test's evidence (policy.evidence) and the coordinator's ledger weighing it: honest
workers matching at the modelled rate are quarantined no more often than the stated error rate,
a worker sampling an older version is caught and the record says which, evidence banked by a
long honest run is bounded, and a group audited twice counts once."""

from __future__ import annotations

import random

from echo2.coordinator.parts.audit import AuditLedger
from echo2.policy.evidence import VersionEvidence
from echo2.protocol.learner_api import AuditReport, GroupAudit, VersionCheck


def _positions(rng: random.Random, n: int, p_claimed: float, offset: int = 1) -> list[VersionCheck]:
    """n disagreement positions, each a token of the claimed version's choice with p_claimed."""
    claimed = sum(rng.random() < p_claimed for _ in range(n))
    return [VersionCheck(offset=offset, claimed=claimed, older=n - claimed)]


def test_honest_workers_at_the_modelled_rate_are_quarantined_at_most_at_the_stated_rate():
    rng = random.Random(0)
    alpha, workers = 0.05, 2000
    lied = 0
    for w in range(workers):
        evidence = VersionEvidence(older_versions=3, honest_match_rate=0.8, false_positive_rate=alpha)
        for _ in range(100):  # 100 groups of 3 disagreements each, honest at exactly the modelled rate
            evidence.add(f"w{w}", _positions(rng, 3, 0.8, offset=rng.randint(1, 3)))
            if evidence.lied(f"w{w}"):
                lied += 1
                break
    assert lied / workers <= alpha, lied
    assert lied > 0  # the bound is tight enough to be reached by chance at this rate (the test can fail)


def test_a_worker_sampling_one_version_older_is_caught_within_a_few_groups_and_the_offset_named():
    rng = random.Random(1)
    evidence = VersionEvidence(older_versions=3, honest_match_rate=0.9, false_positive_rate=1e-3)
    groups = 0
    while not evidence.lied("liar"):
        groups += 1
        evidence.add("liar", _positions(rng, 2, 0.1, offset=1) + [VersionCheck(offset=2, claimed=1, older=1)])
    # log(1/a) = 6.9 nats at log(9) = 2.2 nats a token, less log 3 for the average over offsets
    assert groups <= 4, groups
    assert evidence.likeliest_offset("liar") == 1


def test_a_long_honest_record_banks_no_more_than_one_bound_against_a_later_lie():
    evidence = VersionEvidence(older_versions=1, honest_match_rate=0.9, false_positive_rate=1e-3)
    for _ in range(1000):
        evidence.add("w", [VersionCheck(offset=1, claimed=5, older=0)])
    assert evidence.log_ratio["w"][("tokens", 1)] == -evidence.bound_nats
    tokens = 0
    while not evidence.lied("w"):
        tokens += 1
        evidence.add("w", [VersionCheck(offset=1, claimed=0, older=1)])
    # 2 x 6.9 nats, and log 2 for the log-prob side's say, at 2.2 a token, not 1000 x 5 x 2.2
    assert tokens == 7


def test_offsets_beyond_the_configured_ones_and_no_offsets_weigh_nothing():
    evidence = VersionEvidence(older_versions=2, honest_match_rate=0.9, false_positive_rate=1e-3)
    evidence.add("w", [VersionCheck(offset=5, claimed=0, older=50)])
    assert evidence.nats("w") == 0.0 and evidence.likeliest_offset("w") is None
    off = VersionEvidence(older_versions=0, honest_match_rate=0.9, false_positive_rate=1e-3)
    off.add("w", [VersionCheck(offset=1, claimed=0, older=50)])
    assert not off.lied("w")


def _verdict(lease_id: str, worker_id: str, claimed: int, older: int) -> GroupAudit:
    return GroupAudit(lease_id=lease_id, worker_id=worker_id, version=7, tokens=16, mean_abs_logprob_diff=0.01,
                      recomputed=True, sampler_violations=0, failed=False,
                      version_checks=[VersionCheck(offset=2, claimed=claimed, older=older)])


def test_the_ledger_quarantines_on_evidence_once_per_group_and_says_which_version_fits():
    ledger = AuditLedger(2, evidence=VersionEvidence(3, 0.9, 1e-3))
    honest = [_verdict(f"h{i}", "honest", claimed=2, older=0) for i in range(20)]
    assert ledger.record(AuditReport(step=1, groups=honest)) == {}
    again = [_verdict("l0", "liar", claimed=0, older=2)]
    for step in range(2, 6):  # the same group reported again and again: one group's evidence
        assert ledger.record(AuditReport(step=step, groups=again)) == {}
    assert 0 < ledger.workers["liar"].version_evidence_nats < ledger.evidence.bound_nats
    newly = ledger.record(AuditReport(step=6, groups=[_verdict("l1", "liar", claimed=0, older=3)]))
    assert list(newly) == ["liar"]
    assert "version 2 older" in newly["liar"] and "fits 5" in newly["liar"]
    assert ledger.workers["liar"].failed == 0  # no group failed on its own: the evidence did it
    assert ledger.workers["honest"].version_evidence_nats < 0
    assert ledger.snapshot()["quarantined"] == {"liar": newly["liar"]}


def test_a_worker_whose_tokens_match_its_claims_at_every_offset_is_cleared_and_a_liar_never_is():
    evidence = VersionEvidence(older_versions=2, honest_match_rate=0.9, false_positive_rate=1e-3)
    evidence.add("honest", [VersionCheck(offset=1, claimed=4, older=0)])
    assert not evidence.cleared("honest")  # offset 2 has said nothing yet
    evidence.add("honest", [VersionCheck(offset=2, claimed=3, older=0)])
    assert not evidence.cleared("honest")  # 3 x 2.2 nats is short of the 6.9 bound
    evidence.add("honest", [VersionCheck(offset=2, claimed=1, older=0)])
    assert evidence.cleared("honest") and not evidence.leans("honest")
    # a liar two versions older: its tokens match the claim where version 1 older differs, never
    # where its own version does, so one offset leans and it is never cleared
    evidence.add("liar", [VersionCheck(offset=1, claimed=9, older=0), VersionCheck(offset=2, claimed=0, older=1)])
    assert evidence.leans("liar") and not evidence.cleared("liar") and not evidence.lied("liar")


def test_the_ledger_clears_an_honest_worker_early_and_holds_a_leaning_one():
    ledger = AuditLedger(2, evidence=VersionEvidence(1, 0.9, 1e-3), proven_groups=100)
    assert ledger.audit_mode("w") == "unproven"
    ledger.record(AuditReport(step=1, groups=[_verdict("a", "w", claimed=0, older=0)]))
    assert ledger.audit_mode("w") == "unproven"  # offset 1 is the only one weighed; offset 2 unknown
    ledger.evidence.add("w", [VersionCheck(offset=1, claimed=4, older=0)])
    assert ledger.audit_mode("w") == "by_chance"  # cleared long before 100 audited groups
    ledger.evidence.add("w", [VersionCheck(offset=1, claimed=0, older=4)])
    assert ledger.audit_mode("w") == "hold_out"


def test_honest_log_probs_at_the_modelled_fit_rate_are_quarantined_at_most_at_the_stated_rate():
    rng = random.Random(2)
    alpha, workers, r = 0.05, 2000, 0.05
    lied = 0
    for _ in range(workers):
        evidence = VersionEvidence(3, 0.9, alpha, honest_logprob_fit_rate=r)
        for _ in range(100):  # every group's log-probs fit each older version with chance r
            evidence.add("w", [VersionCheck(offset=k, claimed=0, older=0, logprob_fit=rng.random() < r)
                               for k in (1, 2, 3)])
            if evidence.lied("w"):
                lied += 1
                break
    assert lied / workers <= alpha, lied
    assert lied > 0, lied  # reached by chance at this rate: the test can fail


def test_a_liar_seen_only_in_its_log_probs_is_caught_and_the_record_says_so():
    rng = random.Random(3)
    ledger = AuditLedger(2, evidence=VersionEvidence(3, 0.9, 1e-3))
    newly, groups = {}, 0
    while not newly:  # every token also the claimed version's choice; a third of its groups fit version 1 older
        groups += 1
        checks = [VersionCheck(offset=1, claimed=0, older=0, logprob_fit=rng.random() < 1 / 3)]
        verdict = _verdict(f"g{groups}", "liar", 0, 0).model_copy(update={"version_checks": checks})
        newly = ledger.record(AuditReport(step=groups, groups=[verdict]))
    assert groups <= 20, groups
    assert "its log-probs fit the version 1 older" in newly["liar"]


def _first(lease_id: str, claimed: int, older: int) -> GroupAudit:
    """A group of worker "w" checked against the version just before its claim."""
    return _verdict(lease_id, "w", 0, 0).model_copy(
        update={"version_checks": [VersionCheck(offset=1, claimed=claimed, older=older)]})


def test_a_cleared_worker_that_turns_to_lying_has_every_group_checked_before_its_evidence_leans():
    ledger = AuditLedger(2, evidence=VersionEvidence(1, 0.9, 1e-3), proven_groups=4)
    for i in range(8):
        ledger.record(AuditReport(step=i, groups=[_first(f"h{i}", claimed=3, older=0)]))
    assert ledger.evidence.cleared("w") and ledger.audit_mode("w") == "by_chance"
    ledger.record(AuditReport(step=9, groups=[_first("l0", claimed=0, older=1)]))
    assert ledger.audit_mode("w") == "by_chance"  # one token: an honest engine's near-tie, by chance
    ledger.record(AuditReport(step=10, groups=[_first("l1", claimed=0, older=1)]))
    assert not ledger.evidence.leans("w") and ledger.audit_mode("w") == "unproven"  # 4.4 nats up: watched
    ledger.record(AuditReport(step=11, groups=[_first("h9", claimed=2, older=0)]))
    assert ledger.audit_mode("w") == "by_chance"  # fallen back within WATCH_NATS of its low
