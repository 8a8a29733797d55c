"""The coordinator's ledger of the rollout audit: per-worker statistics from the learner's
verdicts, and the decision to quarantine (echo2.learner.audit computes the verdicts): after
`flags_to_quarantine` failed groups, or when the evidence that the worker samples with an older
version than it claims reaches its bound (policy.evidence)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

from echo2.policy.evidence import VersionEvidence
from echo2.protocol.learner_api import AuditReport, GroupAudit
from echo2.protocol.messages import AuditMode

WEIGHED_GROUPS_KEPT = 65_536
"""Lease ids whose version checks were weighed (or that were held out), kept so a group audited
again (handed back by a step the audit skipped, a retried report) adds no evidence twice:
re-audits come within a few steps."""


@dataclass
class WorkerAudit:
    audited: int = 0
    failed: int = 0
    max_passed_diff: float = 0.0
    """The largest mean |difference| among this worker's groups that passed: its honest noise."""
    max_failed_diff: float = 0.0
    held_out: int = 0
    """Its groups the learner held out of training (GroupAudit.held_out)."""
    version_evidence_nats: float = 0.0
    """policy.evidence: above 0 its tokens lean to an older version than it claims."""


class AuditLedger:
    def __init__(self, flags_to_quarantine: int, quarantined: dict[str, str] | None = None,
                 evidence: VersionEvidence | None = None, *, proven_groups: int = 0) -> None:
        self.flags_to_quarantine = flags_to_quarantine
        self.evidence = evidence
        self.proven_groups = proven_groups
        self.weighed: OrderedDict[str, None] = OrderedDict()
        self.held_out_groups: OrderedDict[str, None] = OrderedDict()
        """Ids of groups the learner held out: their prompts are redone (GroupBook.reject)."""
        self.workers: dict[str, WorkerAudit] = {}
        self.failed_groups: set[str] = set()
        """Ids of groups that failed: a failure reported twice (a retried request, a step
        redone) counts once."""
        self.quarantined: dict[str, str] = dict(quarantined or {})
        """worker id -> why; kept across coordinator restarts by the caller."""

    def record(self, report: AuditReport) -> dict[str, str]:
        """Take one step's verdicts; returns the workers this report quarantines, with why."""
        newly: dict[str, str] = {}
        for verdict in report.groups:
            stats = self.workers.setdefault(verdict.worker_id, WorkerAudit())
            lie = self._weigh(stats, verdict)
            if lie and verdict.worker_id not in self.quarantined:
                self.quarantined[verdict.worker_id] = newly[verdict.worker_id] = lie
            if verdict.held_out and verdict.lease_id not in self.held_out_groups:
                stats.held_out += 1
                _keep(self.held_out_groups, verdict.lease_id)
            if not verdict.failed:
                stats.audited += 1
                stats.max_passed_diff = max(stats.max_passed_diff, verdict.mean_abs_logprob_diff)
                continue
            if verdict.lease_id in self.failed_groups:
                continue
            self.failed_groups.add(verdict.lease_id)
            stats.audited += 1
            stats.failed += 1
            stats.max_failed_diff = max(stats.max_failed_diff, verdict.mean_abs_logprob_diff)
            if stats.failed >= self.flags_to_quarantine and verdict.worker_id not in self.quarantined:
                reason = f"rollout audit: {stats.failed} of its groups failed (the latest {_why(verdict)})"
                self.quarantined[verdict.worker_id] = reason
                newly[verdict.worker_id] = reason
        return newly

    def _weigh(self, stats: WorkerAudit, verdict: GroupAudit) -> str | None:
        """Add the group's version checks to its worker's evidence, once per group; returns why
        to quarantine it when the evidence reaches the bound."""
        if self.evidence is None or not verdict.version_checks or verdict.lease_id in self.weighed:
            return None
        _keep(self.weighed, verdict.lease_id)
        stats.version_evidence_nats = self.evidence.add(verdict.worker_id, verdict.version_checks)
        if not self.evidence.lied(verdict.worker_id):
            return None
        side, offset = self.evidence.likeliest(verdict.worker_id) or ("tokens", 0)
        what = "tokens" if side == "tokens" else "log-probs"
        return (f"version audit: its {what} fit the version {offset} older than it claims (latest: claimed "
                f"{verdict.version}, fits {verdict.version - offset}); evidence {stats.version_evidence_nats:.1f} "
                f"nats reached the bound of {self.evidence.bound_nats:.1f} (audit.false_positive_rate)")

    def audit_mode(self, worker_id: str) -> AuditMode:
        """How the learner is to audit a group of this worker accepted now (TrainGroup.audit)."""
        if self.evidence is not None and self.evidence.leans(worker_id):
            return "hold_out"
        if self.evidence is not None and self.evidence.watched(worker_id):
            return "unproven"  # risen from its low: a worker that turned after clearing
        if self.evidence is not None and self.evidence.cleared(worker_id):
            return "by_chance"
        stats = self.workers.get(worker_id)
        return "unproven" if (stats.audited if stats else 0) < self.proven_groups else "by_chance"

    def redone_groups(self) -> set[str]:
        """Groups whose prompts another worker redoes when their step is rejected: those that
        failed the audit, and those held out."""
        return self.failed_groups | self.held_out_groups.keys()

    def snapshot(self) -> dict:
        return {"workers": {w: asdict(s) for w, s in sorted(self.workers.items())},
                "quarantined": dict(self.quarantined)}


def _why(verdict) -> str:
    """Which check the latest failed group failed: the seeded sampler's (tokens it did not draw
    with the lease's seed) or the log-prob comparison."""
    how = "recomputed under" if verdict.recomputed else "at"
    if verdict.sampler_violations:
        return (f"{how} version {verdict.version}: {verdict.sampler_violations} of its tokens are not the seeded "
                "sampler's choice for the lease's seed")
    return (f"{how} version {verdict.version}: tokens differ from that version's log-probs by "
            f"{verdict.mean_abs_logprob_diff:.3g} nats per token")


def _keep(ids: OrderedDict[str, None], lease_id: str) -> None:
    """Remember a lease id, forgetting the oldest beyond WEIGHED_GROUPS_KEPT."""
    ids[lease_id] = None
    if len(ids) > WEIGHED_GROUPS_KEPT:
        ids.popitem(last=False)
