"""Messages between the learner and the coordinator: its batch requests (which carry its
progress), batches, publishes, rejections and audits, and their replies. All are POSTs: each
changes the coordinator's state (a batch request assigns the step's batch)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from echo2.protocol.messages import Message, TrainGroup, VersionInfo


class BatchRequest(Message):
    """The learner asks for step `step`'s batch, waiting up to `wait_s` for it, and reports its
    progress: `step_time_s`, its busy time on the last step (the activation controller's
    demand), and `durable_step`, the step of its newest checkpoint on disk (the coordinator
    deletes the batches of earlier steps: a resumed learner never asks for them)."""

    kind: Literal["batch_request"] = "batch_request"
    step: int = Field(ge=0)
    wait_s: float = Field(10.0, ge=0.0)
    """Capped by the coordinator (its long polls hold at most 30 s)."""
    step_time_s: float | None = Field(None, ge=0.0)
    durable_step: int | None = Field(None, ge=0)


class BatchResponse(Message):
    kind: Literal["batch"] = "batch"
    step: int
    groups: list[TrainGroup]
    """Empty while the batch is not ready; the learner asks again (long poll)."""


class PublishRequest(Message):
    kind: Literal["publish"] = "publish"
    info: VersionInfo
    public_key_hex: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The learner's signing key, relayed to workers that do not pin one."""


class RejectBatchRequest(Message):
    """The learner could not use the batch of `step` (its loss or gradient was not finite): the
    step was skipped, nothing was published, and the next request for `step` needs new groups."""

    kind: Literal["reject_batch"] = "reject_batch"
    step: int = Field(ge=0)
    reason: str = Field("", max_length=500)
    requeue_lease_ids: list[str] = Field([], max_length=100_000)
    """Groups of the batch that are fine (the step was skipped for others' sake, e.g. a failed
    audit): they go back to the buffer instead of being retired."""


class VersionCheck(BaseModel):
    """A group's seeded-sampler tokens compared under its claimed version and one `offset`
    versions older, at the positions where the two versions' choices differ."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    offset: int = Field(ge=1, le=64)
    claimed: int = Field(ge=0)
    """Tokens that are the claimed version's choice and not the older one's."""
    older: int = Field(ge=0)
    """Tokens that are the older version's choice and not the claimed one's."""
    logprob_fit: bool | None = None
    """Whether the group's behaviour log-probs fit the older version better than the claimed one
    (learner.version_check.LOGPROB_FIT_RATIO); None: not measured (a group sampled by several
    versions, or log-probs within an fp32 engine's numerics of the claimed version's)."""


class GroupAudit(BaseModel):
    """The learner's check of one trained group: its tokens' mean |log-prob under the claimed
    version - behaviour log-prob|."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    lease_id: str = Field(max_length=200)
    worker_id: str = Field(max_length=200)
    version: int
    tokens: int = Field(ge=0)
    mean_abs_logprob_diff: float = Field(ge=0)
    recomputed: bool
    """True: recomputed under the published version it claims (the wire payload); False: checked
    by the learner's own step at its current version (a wire equal to the learner's weights)."""
    sampler_violations: int | None = Field(None, ge=0)
    """Tokens that fall short of the seeded sampler's choice by more than audit.sampler_margin
    under the claimed version; None: not checked (a free-sampling worker, a multi-turn group, or
    a group the keyed hash did not pick)."""
    version_checks: list[VersionCheck] = Field([], max_length=64)
    """Against each older version the learner still holds (learner.version_check); empty where
    the sampler was not checked."""
    failed: bool
    held_out: bool = False
    """Not trained although it passed: its own version checks fit an older version than it
    claims, or the coordinator asked for it to be held out (TrainGroup.audit); the step is redone
    without it and its prompt goes to another worker."""


class AuditReport(Message):
    """What the learner audited at `step` (sent before the step is applied or skipped)."""

    kind: Literal["audit_report"] = "audit_report"
    step: int = Field(ge=0)
    groups: list[GroupAudit] = Field(max_length=100_000)


class PublishResponse(Message):
    kind: Literal["published"] = "published"
    version: int
    anchor_wanted: bool
    """A worker's way to the newest version got too long: make the next version an anchor."""


class RejectBatchResponse(Message):
    kind: Literal["batch_rejected"] = "batch_rejected"
    groups_rejected: int


class AuditResponse(Message):
    kind: Literal["audit_recorded"] = "audit_recorded"
    quarantined: list[str]
    """Workers quarantined because of this report."""
