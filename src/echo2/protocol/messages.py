"""Wire messages between workers, the coordinator and the learner: typed, tagged, versioned.

Every message carries `kind` (what it is) and `protocol` (the wire version); receivers refuse
unknown fields and non-finite numbers so malformed input fails loudly at the boundary. Every
string and list a worker sends has a cap: what it sends is stored and logged, so its size must
not be its to choose (the coordinator answers an oversized field with 422 naming it).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from echo2.config.base import MAX_GROUP_SIZE, MAX_NEW_TOKENS
from echo2.config.broadcast import BroadcastConfig
from echo2.config.run import LoraConfig, SamplingConfig
from echo2.config.task import TaskConfig
from echo2.protocol.broadcast import Assignment, BadPeerReport
from echo2.protocol.manifest import SignedManifest
from echo2.protocol.release import RELEASE

PROTOCOL_VERSION = 11
PROTOCOL_CHANGES = {
    5: "the learner's batch request is a POST carrying its progress; replies are typed messages",
    6: "version news reaches a worker by its held heartbeat only; one lease_id names a lease, its group "
       "and the group's records",
    7: "a completion says which version sampled which tokens (token_versions): workers swap versions "
       "mid-generation",
    8: "version news and activation reach a worker on its open news line (GET /v1/news), not a held "
       "heartbeat; a heartbeat is answered at once and its reply says when to beat next "
       "(heartbeat_interval_s, stretched for large fleets and under load)",
    9: "a bad-peer report names the form fetched and the sha256 of the chunk received (form, got_sha256); "
       "the coordinator fetches that chunk from the peer itself before it drops the peer for everyone",
    10: "the coordinator tells the learner how to audit each group (TrainGroup.audit) and the learner reports "
        "the groups it held out (GroupAudit.held_out)",
    11: "a worker-trusted episode carries its tool calls' answers (RolloutCompletion.tool_answers)",
}
"""What each protocol changed, told in the error a peer of another protocol gets."""
# a worker's running totals: far above any real run, and small enough that every sum and float
# conversion of them (the dashboard, /metrics) stays exact and finite
MAX_CLAIMED_COUNT = 1 << 53
"""Bumped whenever a message changes incompatibly: peers of different protocols refuse each
other with a message naming both (`protocol_mismatch`) rather than failing on some field."""
MAX_HEARTBEAT_INTERVAL_S = 600.0
"""The longest a coordinator may tell a worker to wait between heartbeats."""
MAX_TOOL_CALLS, MAX_TOOL_ANSWER_CHARS = 256, 1_000_000
"""One episode's tool calls, and one answer's characters (task.max_tool_output_chars' bound)."""
MAX_VERSION_RUNS = 64
"""Runs of token_versions in one completion: a version swap every segment_tokens tokens, at most
one per version; a generation straddling more versions than this is far past any S."""
# the id length bound keeps a hostile client from making us store megabyte-long keys
_ID = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    protocol: Literal[11] = PROTOCOL_VERSION  # keep equal to PROTOCOL_VERSION (a test checks)


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    temperature: float
    max_new_tokens: int
    group_size: int
    segment_tokens: int = 0
    """sampling.segment_tokens: swap a newer version in at every multiple of this many tokens
    of a generation in flight (0: between generations only)."""

    @classmethod
    def of(cls, sampling: SamplingConfig) -> SamplingParams:
        """The run's [sampling], as every lease carries it."""
        return cls(temperature=sampling.temperature, max_new_tokens=sampling.max_new_tokens,
                   group_size=sampling.group_size, segment_tokens=sampling.segment_tokens)


class VersionInfo(BaseModel):
    """A published policy version: its signed manifest and the learner's broadcast origin."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    version: int = Field(ge=0)
    signed: SignedManifest
    """The form the broadcast tree carries: with broadcast.deltas a delta against version - 1
    (unless the learner held no base), else the full version."""
    full: SignedManifest | None = None
    """An anchor's full manifest, published next to its delta `signed` for workers that lack
    the base; None when `signed` is full or the version is no anchor."""
    origin_url: str = Field(max_length=512)
    published_at: float
    """Learner wall clock at publish (publish-to-loaded latency is measured against it)."""


# ---- worker <-> coordinator -------------------------------------------------------------


class RegisterRequest(Message):
    kind: Literal["register"] = "register"
    worker_id: str = Field("", max_length=128, pattern=r"^[A-Za-z0-9_.:-]*$")
    # a character rule, not only a cap: the engine is shown on the coordinator's console, where a
    # newline in it once forged log lines
    engine: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.:+-]+$")
    price_per_hour: float = Field(0.0, ge=0)
    relay_address: str = Field("", max_length=256)
    """Where peers can pull weights from this worker; empty: not reachable (a broadcast leaf)."""
    upload_bps: float = Field(1e9, gt=0)
    download_bps: float = Field(1e9, gt=0)
    """Declared link speeds (bits/s) the broadcast planner builds the relay tree from."""
    release: str = Field("", max_length=64)
    """The worker's echo2 release, named (with the protocol) when its protocol is refused."""
    worker_class: str = Field("", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    """Its declared class in the run's activation catalog (empty: none): a prior, never trusted
    past probation (policy/planned.py)."""
    sampler: Literal["seeded", "free"] = "seeded"
    """How its engine draws tokens: "seeded", the seeded sampler (`models/sampler.py`) with each
    lease's seed, which the learner's audit checks token by token (echo2's hf and vllm engines);
    "free", the engine's own sampling, audited by log-probs only and refused unless
    audit.require_seeded_sampler is off."""


class RegisterResponse(Message):
    kind: Literal["registered"] = "registered"
    worker_id: str
    heartbeat_interval_s: float
    max_staleness: int
    sampling: SamplingParams
    model_source: str
    broadcast: BroadcastConfig
    """The run's broadcast settings (chunking, timeouts, limits): every peer must agree on it."""
    learner_public_key: str
    """Hex Ed25519 key manifests must be signed with ("" until the learner first publishes)."""
    credential: str
    """This worker's own credential: every later call carries it as its bearer token. Issued
    once per registration, bound to `worker_id`."""
    task: TaskConfig | None = None
    """The run's task config when it is multi-turn (the environment a worker plays episodes in,
    its budgets); None for single-turn tasks, whose prompts come whole with each lease."""
    lora: LoraConfig | None = None
    """The run's grpo.lora when it trains adapters (None otherwise): a vLLM worker reserves
    adapter room of that rank when it builds its engine, before the first version arrives."""


class ProbeRequest(Message):
    """`echo2 worker --check`: dial this relay address back and say whether it answers."""

    kind: Literal["probe"] = "probe"
    relay_address: str = Field(min_length=1, max_length=256)


class ProbeResponse(Message):
    kind: Literal["probe_result"] = "probe_result"
    reachable: bool
    detail: str


class Heartbeat(Message):
    kind: Literal["heartbeat"] = "heartbeat"
    worker_id: str = _ID
    version: int = Field(ge=-1)
    """Version the worker's engine holds (-1: none loaded yet)."""
    base_version: int | None = Field(None, ge=-1)
    """Newest version the worker holds in full, loaded or staged (-1: none): what a delta it is
    sent must be against. None: the same as `version`."""
    swap_s: float | None = Field(None, ge=0)
    """How long the last weight swap paused generation (the per-version stall)."""
    dissemination_s: float | None = Field(None, ge=0)
    """Last version: publish until verified here plus the swap (when it could first generate)."""
    generation_s: float | None = Field(None, ge=0)
    """Last lease: seconds from lease to submitted results (T_gen of the capacity model)."""
    rollouts_total: int = Field(0, ge=0, le=MAX_CLAIMED_COUNT)
    busy_s_total: float = Field(0.0, ge=0)
    """Cumulative rollouts and seconds spent in lease-generate-submit cycles: their ratio is the
    worker's full-load throughput, protocol overhead included."""
    bytes_relayed_total: int = Field(0, ge=0, le=MAX_CLAIMED_COUNT)
    """Weight bytes its relay sent to other workers since it started (shown on the dashboard and
    /metrics as the worker's claim; nothing is decided on it)."""


class HeartbeatResponse(Message):
    """A heartbeat's reply, and each line of a worker's news (GET /v1/news): the newest version,
    what to fetch next and from where, whether to work, and when to beat next."""

    kind: Literal["heartbeat_ack"] = "heartbeat_ack"
    latest: VersionInfo | None
    assignment: Assignment | None = None
    """Where this worker pulls `fetch` from (its parent first, the learner last)."""
    fetch: VersionInfo | None = None
    """What the worker pulls next on its way to `latest`, when it is not `latest` itself: a
    delta against the version it holds, or an anchor (its `signed` is the form to fetch).
    None: `latest` (when the worker does not hold it already)."""
    learner_public_key: str = ""
    active: bool = True
    """False: the worker should idle (not lease) until told otherwise."""
    heartbeat_interval_s: float = Field(1.0, gt=0, le=MAX_HEARTBEAT_INTERVAL_S)
    """When to send the next heartbeat: coordinator.heartbeat_interval_s, stretched when the
    fleet is large or the coordinator is loaded (its liveness timeout stretches with it)."""


class LeaveRequest(Message):
    """A worker shutting down cleanly; its leases return to the queue at once."""

    kind: Literal["leave"] = "leave"
    worker_id: str = _ID


class LeaseRequest(Message):
    kind: Literal["lease"] = "lease"
    worker_id: str = _ID
    version: int = Field(ge=0)
    max_tasks: int = Field(1, ge=1, le=256)
    wait_s: float = Field(0.0, ge=0, le=30)
    """How long the coordinator may hold the request while the staleness window is full
    (a long poll: it answers as soon as room opens); 0: answer at once."""


class Task(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    lease_id: str
    """The lease id: valid only for the worker it was handed to, until it expires."""
    prompt_ids: list[int]
    sampling: SamplingParams
    episode_seed: int | None = None
    """Multi-turn tasks: the seed the episodes of this group start from (the coordinator replays
    them from it); None for single-turn tasks."""
    sampling_seed: int | None = None
    """The seed the seeded sampler draws this group's tokens with (chosen by the coordinator,
    checked by the learner's audit). Multi-turn tasks too: episode j is the sampler's sample j,
    each action's tokens at their positions in the transcript. None: draw freely (a coordinator
    that seeds no leases)."""


class EvalTask(BaseModel):
    """Part of a held-out evaluation: greedy completions of these prompts under `version`,
    scored by the coordinator and never trained on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    lease_id: str
    version: int
    """The version to generate with: the one the worker holds (and keeps until the evaluation
    is done: `LeaseResponse.hold_version`)."""
    prompt_ids: list[list[int]]
    max_new_tokens: int


LeaseRefusal = Literal["no_version", "stale", "own_cap", "new_pool", "window_full", "inactive", "evaluation_hold"]
"""Why a lease carries no work: no version yet, weights too stale, the worker holds all it may,
new workers hold their share of the window, the window is full, the worker is idle, or it
holds a version for the evaluation it serves."""
WAITS_FOR_ROOM: frozenset[str] = frozenset({"own_cap", "new_pool", "window_full", "evaluation_hold"})
"""Refusals that room opening ends (a lease returned, a batch taken, a version out): a lease
request refused for one of them is held at the coordinator until then."""


class LeaseResponse(Message):
    kind: Literal["lease_granted"] = "lease_granted"
    tasks: list[Task]
    retry_after_s: float = 0.0
    """When `tasks` is empty: how long to wait before asking again."""
    reason: str = ""
    refusal: LeaseRefusal | None = None
    """When `tasks` is empty and no evaluation is given: why, as a kind (`reason` says it in words)."""
    evaluation: EvalTask | None = None
    """Instead of rollouts: part of a held-out evaluation at the version the worker holds."""
    hold_version: int | None = None
    """The version this worker must keep (not swap out) until the evaluation it serves is done;
    None: swap in newer versions as they arrive."""


class RolloutCompletion(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    # the run's own sampling.max_new_tokens is checked after parsing (coordinator.validation)
    token_ids: list[int] = Field(max_length=MAX_NEW_TOKENS)
    logprobs: list[float] = Field(max_length=MAX_NEW_TOKENS)
    segments: list[int] = Field([], max_length=MAX_NEW_TOKENS)
    """Multi-turn episodes: lengths of the transcript's segments, alternating the model's action
    (trained with its behaviour log-probs) and the environment's answer (masked out of the loss,
    log-probs 0), the model's first and last. Empty: one completion, every token the model's."""
    token_versions: list[tuple[int, int]] = Field([], max_length=MAX_VERSION_RUNS)
    """Which version sampled which tokens, as runs (version, tokens) in token order, when the
    worker swapped versions mid-generation (`protocol/token_versions.py`); empty: every token is
    the submission's version."""
    tool_answers: list[Annotated[str, Field(max_length=MAX_TOOL_ANSWER_CHARS)]] = Field([], max_length=MAX_TOOL_CALLS)
    """A worker-trusted episode (task.trust): what its tool calls answered, in order; the
    coordinator's replay renders them itself (ignored where the coordinator runs the tools)."""

    def model_token_mask(self) -> list[bool]:
        """Per token: the model's (True: sampled, trained) or the environment's (context only)."""
        if not self.segments:
            return [True] * len(self.token_ids)
        return [index % 2 == 0 for index, length in enumerate(self.segments) for _ in range(length)]


class RolloutSubmission(Message):
    kind: Literal["rollout"] = "rollout"
    worker_id: str = _ID
    lease_id: str = _ID
    version: int = Field(ge=0)
    completions: list[RolloutCompletion] = Field(max_length=MAX_GROUP_SIZE)
    """One per sample of the group (the run's sampling.group_size, checked after parsing)."""
    gen_time_s: float = Field(ge=0)


class EvalSubmission(Message):
    """Greedy completions of an evaluation lease's prompts, in its order."""

    kind: Literal["evaluation"] = "evaluation"
    worker_id: str = _ID
    lease_id: str = _ID
    version: int = Field(ge=0)
    completions: list[list[int]] = Field(max_length=10_000)
    """Token ids of each completion (each at most the lease's max_new_tokens, checked after
    parsing)."""
    gen_time_s: float = Field(ge=0)


class EvalAck(Message):
    kind: Literal["evaluation_ack"] = "evaluation_ack"
    accepted: bool
    done: bool = False
    """The evaluation is complete (this was its last lease)."""


class EvaluationResult(Message):
    """What the learner is told of a version's evaluation (GET /v1/evaluation)."""

    kind: Literal["evaluation_result"] = "evaluation_result"
    version: int
    done: bool
    accuracy: float | None = None
    problems: int = 0
    evaluated_version: int | None = None
    """The version actually evaluated (a due version may be evaluated at a newer one)."""


class SubmitResponse(Message):
    kind: Literal["rollout_ack"] = "rollout_ack"
    accepted: bool
    reason: str = ""
    rewards: list[float] = []


class BadPeerRequest(Message):
    """A worker reporting a source that sent bytes no honest relay sends."""

    kind: Literal["bad_peer_report"] = "bad_peer_report"
    report: BadPeerReport


AuditMode = Literal["by_chance", "unproven", "hold_out"]


class TrainGroup(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    lease_id: str
    prompt_index: int
    prompt_ids: list[int]
    version: int
    worker_id: str
    rewards: list[float]
    completions: list[RolloutCompletion]
    sampling_seed: int | None = None
    """The lease's sampler seed when its worker draws with the seeded sampler (the audit checks
    its tokens against it: a multi-turn group's actions only, not the environment's answers);
    None: a free-sampling worker."""
    audit: AuditMode = "by_chance"
    """How the learner's rollout audit treats the group, set by the coordinator when the group
    is accepted from what the audit knows of its worker (never the worker's word): `by_chance`,
    checked when audit.recompute_fraction's keyed draw picks it; `unproven`, its worker is neither
    cleared by its version evidence nor past audit.proven_groups audited groups: checked whatever
    the draw says; `hold_out`, its worker's version evidence leans against it (policy.evidence):
    checked, and not trained."""


class OkResponse(Message):
    """The reply to a request that changes state and has nothing else to say."""

    kind: Literal["ok"] = "ok"


class ErrorResponse(Message):
    kind: Literal["error"] = "error"
    error: str


def protocol_mismatch(sent: object, sent_release: object, *, here: str, there: str,
                      spoken: int = PROTOCOL_VERSION) -> str | None:
    """Why a message of protocol `sent` (from `there`, running echo2 `sent_release` when known)
    cannot be understood by `here`, which speaks `spoken`; None when it can."""
    if sent == spoken:
        return None
    theirs = f"protocol {sent!r}" + (f" (echo2 {str(sent_release)[:64]})" if sent_release else "")
    changed = f" (protocol {spoken}: {PROTOCOL_CHANGES[spoken]})" if spoken in PROTOCOL_CHANGES else ""
    return (f"incompatible echo2 versions: {here} speaks protocol {spoken} (echo2 {RELEASE}){changed}, {there} "
            f"speaks {theirs}. Run the same echo2 release on the coordinator, the learner and every worker")
