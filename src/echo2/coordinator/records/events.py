"""The coordinator's events: one frozen record type per kind, its fields what `metrics.jsonl`
gets under that kind (role "coordinator"). The state machine appends them; the server logs and
writes them (`http.base.write_events`) before the reply that caused them leaves. Readers of
metrics.jsonl (summary, history, plots, benchmarks) key on these `kind` names. The relay
reports' events are in `records.relay_events`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = ""

    def record(self) -> dict[str, Any]:
        """The metrics record: `kind` first, then the fields."""
        return {"kind": self.kind, **asdict(self)}


# ---- workers ----
@dataclass(frozen=True)
class WorkerRegistered(Event):
    kind: ClassVar[str] = "worker_registered"
    worker_id: str
    engine: str
    price_per_hour: float
    relay_address: str
    source: str
    trusted: bool = False
    """It presented the trusted-worker token (a worker-trusted environment's rewards rest on it)."""


@dataclass(frozen=True)
class WorkerLeft(Event):
    kind: ClassVar[str] = "worker_left"
    worker_id: str
    leases_requeued: int
    released: bool
    """Left idle under a releasable fleet provider: a candidate the controller may choose again."""


@dataclass(frozen=True)
class WorkerLost(Event):
    kind: ClassVar[str] = "worker_lost"
    worker_id: str
    leases_requeued: int


@dataclass(frozen=True)
class WorkerQuarantined(Event):
    kind: ClassVar[str] = "worker_quarantined"
    worker_id: str
    reason: str
    groups_dropped: int
    leases_requeued: int


@dataclass(frozen=True)
class Activation(Event):
    kind: ClassVar[str] = "activation"
    active: list[str]
    reason: str
    trigger: str
    changed: bool
    required_rps: float | None
    """None: unbounded (no estimate yet)."""
    estimates_rps: dict[str, float]


@dataclass(frozen=True)
class CoordinatorStalled(Event):
    """The coordinator's event loop did not run for `stall_s` (a step of its own that blocked):
    no worker is taken for silent over that time (each live worker's last sign of life moves
    forward by it)."""

    kind: ClassVar[str] = "coordinator_stalled"
    stall_s: float
    workers_excused: int


@dataclass(frozen=True)
class CoordinatorStats(Event):
    """The run's gauges, once per control period (metric sinks, end-of-run plots)."""

    kind: ClassVar[str] = "coordinator_stats"
    learner_step: int
    version: int
    queued: int
    leased: int
    buffered: int
    workers_alive: int
    workers_active: int
    cost_total: float
    price_per_hour: float


# ---- leases and groups ----
# why a lease went back to the queue without a group; why groups will never train
RequeueReason = Literal["worker_timeout", "lease_timeout", "worker_left", "reregistered", "worker_quarantined"]
DropReason = Literal["stale", "uninformative"]


@dataclass(frozen=True)
class LeaseRequeued(Event):
    kind: ClassVar[str] = "lease_requeued"
    worker_id: str
    reason: RequeueReason
    prompt_index: int


@dataclass(frozen=True)
class GroupsDropped(Event):
    """Groups that will never train, by prompt: where every prompt went (none is lost)."""

    kind: ClassVar[str] = "groups_dropped"
    reason: DropReason
    step: int
    prompt_indices: list[int]
    straddling: int = 0
    """How many of them several versions sampled (sampling.segment_tokens): stale for too many
    old tokens, not for their first version alone."""


@dataclass(frozen=True)
class UninformativeStreak(Event):
    """So many groups in a row scored all alike that one is admitted anyway (zero advantage),
    lest the learner wait forever (policy.rewards.STALL_GUARD_BATCHES)."""

    kind: ClassVar[str] = "uninformative_streak"
    step: int
    dropped_in_a_row: int


@dataclass(frozen=True)
class EpisodesReplayed(Event):
    """What verifying a multi-turn group's episodes cost the coordinator."""

    kind: ClassVar[str] = "episodes_replayed"
    worker_id: str
    episodes: int
    replay_s: float


@dataclass(frozen=True)
class ReplayRefused(Event):
    kind: ClassVar[str] = "replay_refused"
    worker_id: str
    lease_id: str
    prompt_index: int
    reason: str


@dataclass(frozen=True)
class ScoringOverBudget(Event):
    """A completion whose scoring ran past coordinator.scoring.timeout_s (or whose scoring
    process died, or that was not run: its submission had used up its worker's strikes): it
    scored 0, its process was killed and replaced, and it counts against its worker (`strikes`
    of coordinator.scoring.strikes within its strike_window_s; `refused`: the worker's
    submissions are refused with 429 from now on, for a while)."""

    kind: ClassVar[str] = "scoring_over_budget"
    worker_id: str
    what: str
    """"rollout" or "evaluation"."""
    lease_id: str
    completion: int
    """Its index in the submission."""
    reason: str
    pid: int
    """The scoring process killed for it (0: none)."""
    strikes: int
    refused: bool


@dataclass(frozen=True)
class BatchAssigned(Event):
    kind: ClassVar[str] = "batch_assigned"
    step: int
    staleness_hist: dict[str, int]
    max_staleness_seen: int
    lease_window_steps: int
    buffered: int
    leased: int
    max_worker_share: float
    """The largest share of the batch's groups one worker sent (activation.max_worker_share caps it)."""
    dropped_uninformative: int = 0
    """Scored groups dropped as uninformative (all rewards equal) since the previous batch:
    the prompts leased beyond the batch's P to fill it (grpo.drop_uninformative_groups)."""
    completions_truncated: int = 0
    """Completions cut off at sampling.max_new_tokens without an EOS, since the previous batch."""


@dataclass(frozen=True)
class BatchRejected(Event):
    kind: ClassVar[str] = "batch_rejected"
    step: int
    groups: int
    requeued: int
    prompts_redone: int
    reason: str
    retired_prompt_indices: list[int]


@dataclass(frozen=True)
class GroupsCompacted(Event):
    kind: ClassVar[str] = "groups_compacted"
    durable_step: int
    groups_deleted: int
    store_bytes: int


# ---- versions ----
@dataclass(frozen=True)
class VersionPublished(Event):
    kind: ClassVar[str] = "version_published"
    version: int
    broadcast_mode: str
    first_hop: list[str]
    max_depth: int
    form: str
    anchor: bool


@dataclass(frozen=True)
class PublishReplayed(Event):
    """A restarted learner replaying steps: workers already hold the newer version."""

    kind: ClassVar[str] = "publish_replayed"
    version: int
    latest: int


# ---- evaluation leases ----
@dataclass(frozen=True)
class EvaluationStarted(Event):
    kind: ClassVar[str] = "evaluation_started"
    version: int
    due: list[int]
    worker_id: str
    problems: int


@dataclass(frozen=True)
class EvaluationAbandoned(Event):
    kind: ClassVar[str] = "evaluation_abandoned"
    version: int
    due: list[int]
    worker_id: str
    scored: int
    reason: str = "its worker is gone or stalled"


@dataclass(frozen=True)
class EvaluationSkipped(Event):
    kind: ClassVar[str] = "evaluation_skipped"
    version: int
    reason: str


@dataclass(frozen=True)
class EvaluationDone(Event):
    """A version's held-out evaluation on a worker: the same `eval` kind the learner writes."""

    kind: ClassVar[str] = "eval"
    step: int
    version: int
    due: list[int]
    accuracy: float
    problems: int
    correct: int
    worker_id: str
    gen_s: float
    wall_s: float
    correct_mask: str
    eval_s: float
    where: str = "workers"


def event_kinds() -> dict[str, type[Event]]:
    """Every event type by its kind (the names metrics.jsonl uses)."""
    found: dict[str, type[Event]] = {}
    pending = list(Event.__subclasses__())
    while pending:
        cls = pending.pop()
        found[cls.kind] = cls
        pending += cls.__subclasses__()
    return found
