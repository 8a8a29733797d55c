"""The coordinator's state machine, free of HTTP: registry, leases, rollout buffer, staleness
admission, batches. Every public method either applies a whole change (persisted before it
returns) or raises `RequestError` having changed nothing. The data-plane rules (lease room,
admission, stale drops, batches) are the policy core's (`echo2.policy.DataPlane`, which the
simulator drives too); this class adds the prompts, persistence, the registry and accounting.

Lifecycle of a prompt: queued -> leased to one worker -> (expired: queued again) ->
submitted as a group -> buffered -> trained in exactly one step's batch, or dropped as stale.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from echo2.broadcast.signing import (
    ManifestRejected,
    load_public_key,
    public_key_from_hex,
    public_key_hex,
    verify_manifest,
)
from echo2.config.broadcast import BroadcastConfig
from echo2.config.run import ActivationConfig
from echo2.coordinator.audit import AuditLedger
from echo2.coordinator.credentials import credential_digest, new_worker_credential
from echo2.coordinator.dissemination import Dissemination, Peer
from echo2.coordinator.evaluation_desk import EvaluationDesk
from echo2.coordinator.scoring import Scorer
from echo2.coordinator.store import Store
from echo2.coordinator.validation import check_submission
from echo2.envs.episode import ReplayMismatch
from echo2.policy import DataPlane, staleness
from echo2.policy.controller import ActivationController
from echo2.protocol.messages import (
    AuditReport,
    BadPeerRequest,
    EvalAck,
    EvalSubmission,
    EvaluationResult,
    Heartbeat,
    HeartbeatResponse,
    LeaseRequest,
    LeaseResponse,
    LeaveRequest,
    RegisterRequest,
    RegisterResponse,
    RolloutSubmission,
    SamplingParams,
    SubmitResponse,
    Task,
    TrainGroup,
    VersionInfo,
)


class RequestError(Exception):
    """A refused request: HTTP status and a message saying what was wrong and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Settings:
    max_staleness: int
    groups_per_step: int
    sampling: SamplingParams
    model_source: str
    heartbeat_interval_s: float
    worker_timeout_s: float
    lease_timeout_s: float
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    learner_price_per_hour: float = 0.0
    broadcast: BroadcastConfig = field(default_factory=BroadcastConfig)
    learner_upload_bps: float = 1e9
    max_leases_per_worker: int = 0
    """0: groups_per_step."""
    forget_workers_after_s: float = 300.0
    registrations_per_minute: float = 60.0
    audit_flags_to_quarantine: int = 2
    lora: dict = field(default_factory=dict)
    """grpo.lora when the run trains adapters: told to workers at registration."""
    eval_on_workers: bool = False
    """Held-out evaluation runs as evaluation leases ([evaluation] where)."""
    eval_every: int = 25
    final_version: int = 0
    """train.steps: the last version, evaluated exactly."""
    eval_problems_per_lease: int = 50
    fresh_leases: bool = False
    """train.fresh_leases: lease only as far ahead as keeps the learner from waiting."""


# ids the broadcast uses for itself: a worker registered as one could hijack the learner's place
RESERVED_WORKER_IDS = frozenset({"origin"})


@dataclass
class WorkerRecord:
    worker_id: str
    engine: str
    price_per_hour: float
    relay_address: str
    last_seen: float
    upload_bps: float = 1e9
    download_bps: float = 1e9
    version: int = -1
    alive: bool = True
    """False once evicted; the record stays for the run's accounting until it registers again."""
    rollouts: int = 0
    tokens: int = 0
    gen_time_s: float = 0.0
    credential_digest: str = ""
    """sha256 of the credential issued at registration (the credential itself is not kept)."""
    leases_held: int = 0
    busy_since: float = 0.0
    busy_s: float = 0.0
    """Time it held at least one lease, on the coordinator's clock: with `rollouts` (validated
    submissions) its measured throughput, which is what activation uses."""
    claimed_rollouts: int = 0
    claimed_busy_s: float = 0.0
    """What its heartbeats say (reported beside the measurement, never used to decide)."""
    claimed_bytes_relayed: int = 0
    claimed_dissemination_s: float | None = None
    """Its heartbeats' weight bytes relayed to peers and last publish-to-loaded time (shown on
    the dashboard and /metrics; nothing is decided on them)."""


@dataclass
class Lease:
    lease_id: str
    worker_id: str
    prompt_index: int
    version: int
    leased_at: float


@dataclass
class Counters:
    accepted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    leases_expired: int = 0
    workers_lost: int = 0
    rejected_by_learner: int = 0
    """Groups of batches the learner could not train on (non-finite loss or gradient, or a
    failed rollout audit)."""
    dropped_quarantined: int = 0
    """Buffered groups of workers quarantined by the rollout audit (their prompts are redone)."""


class CoordinatorState:
    def __init__(self, settings: Settings, store: Store, scorer: Scorer, clock: Callable[[], float] = time.monotonic):
        self.settings, self.store, self.scorer, self.clock = settings, store, scorer, clock
        self.workers: dict[str, WorkerRecord] = {}
        self.credentials: dict[str, str] = {}  # credential digest -> worker id
        self.join_buckets: dict[str, tuple[float, float]] = {}  # source address -> (tokens, as of)
        self.leases: dict[str, Lease] = {}
        self.events: list[dict] = []  # metric records for the server to flush
        s = settings
        self.controller = ActivationController(
            s.activation, s.groups_per_step * s.sampling.group_size, s.max_staleness,
            s.learner_price_per_hour, clock(),
        )
        self.dissemination = Dissemination(s.broadcast, s.learner_upload_bps)
        self._restore()
        self.evaluation: EvaluationDesk | None = None
        if s.eval_on_workers:
            self.evaluation = EvaluationDesk(scorer, store, s.eval_every, s.final_version, s.eval_problems_per_lease,
                                             s.sampling.max_new_tokens)
            if self.latest is not None:
                self.evaluation.published(self.latest.version)

    # ---- restart ----
    def _restore(self) -> None:
        store = self.store
        self.cursor: int = store.get_meta("cursor", 0)
        latest = store.get_meta("latest")
        self.latest: VersionInfo | None = VersionInfo.model_validate(latest) if latest else None
        if self.latest is not None:  # with the earlier forms the origin serves: workers behind get deltas
            self.dissemination.published(self.latest, restarted=True)
            self.dissemination.restore([VersionInfo.model_validate_json(info) for info in store.offers()])
        stored, configured = store.get_meta("learner_public_key", ""), self._configured_learner_key()
        if stored and configured and stored != configured:
            raise ValueError(f"broadcast.learner_public_key ({configured[:16]}...) is not the key this run's versions "
                             f"were published with ({stored[:16]}...)")
        self.public_key_hex: str = stored or configured
        self.counters = Counters(**store.get_meta("counters", {}))
        self.audit = AuditLedger(self.settings.audit_flags_to_quarantine, store.get_meta("quarantined", {}))
        # prompts that were leased when we stopped go back to the queue: their leases died with us
        self.queue: deque[int] = deque(store.pending_prompts())
        with store.tx():
            for index in self.queue:
                store.set_pending(index, None)
        # steps before the learner's newest checkpoint have no batch left (see `checkpointed`)
        self.durable_step: int = store.get_meta("durable_step", 0)
        s = self.settings
        self.plane: DataPlane[dict] = DataPlane(
            s.max_staleness, s.groups_per_step, _group_version, max_leases_per_worker=s.max_leases_per_worker,
            buffer=store.groups_in_state("buffered"), learner_step=store.get_meta("learner_step", 0),
            steps_taken=max(store.last_batch_step() + 1, self.durable_step), current_version=self.current_version,
            fresh_leases=s.fresh_leases,
        )
        self.seq = store.max_seq() + 1

    def _configured_learner_key(self) -> str:
        """broadcast.learner_public_key, when set, pins the learner key from the start."""
        configured = self.settings.broadcast.learner_public_key
        return public_key_hex(load_public_key(configured)) if configured else ""

    def _save_counters(self) -> None:
        self.store.set_meta("counters", asdict(self.counters))

    @property
    def current_version(self) -> int:
        return self.latest.version if self.latest else -1

    @property
    def buffer(self) -> list[dict]:
        """Admitted groups waiting for a batch, oldest first (the data plane's)."""
        return self.plane.buffer

    @property
    def learner_step(self) -> int:
        return self.plane.learner_step

    @property
    def steps_taken(self) -> int:
        """Steps whose batch was assigned (the next batch is for this step)."""
        return self.plane.steps_taken

    # ---- workers ----
    def register(self, req: RegisterRequest, source: str = "") -> RegisterResponse:
        """Join the run (with the join token). Issues the credential every later call of this
        worker must carry. A live worker's id cannot be taken over: only an evicted or departed
        worker's id can register again (its old credential and leases are void). `source`, the
        caller's address, is rate-limited."""
        self.take_join_token(source)
        worker_id = req.worker_id or f"w-{uuid.uuid4().hex[:8]}"
        self._refuse_quarantined(worker_id)
        if worker_id in RESERVED_WORKER_IDS:
            raise RequestError(422, f"worker_id {worker_id!r} is reserved; choose another")
        old = self.workers.get(worker_id)
        if old is not None and old.alive:
            raise RequestError(409, f"worker {worker_id!r} is live; a restarted worker may register again once the "
                                    f"coordinator has timed it out (worker_timeout_s={self.settings.worker_timeout_s})")
        if old is not None:
            # an evicted worker joining again: its old leases are void, its totals stay
            self._release_leases(worker_id, reason="reregistered")
            self.credentials.pop(old.credential_digest, None)
        credential, digest = new_worker_credential()
        record = WorkerRecord(worker_id, req.engine, req.price_per_hour, req.relay_address, self.clock(),
                              upload_bps=req.upload_bps, download_bps=req.download_bps, credential_digest=digest)
        if old is not None:
            record.rollouts, record.tokens, record.gen_time_s = old.rollouts, old.tokens, old.gen_time_s
        self.workers[worker_id] = record
        self.credentials[digest] = worker_id
        self.controller.join(worker_id, req.price_per_hour)
        self.events.append({"kind": "worker_registered", "worker_id": worker_id, "engine": req.engine,
                            "price_per_hour": req.price_per_hour, "relay_address": req.relay_address,
                            "source": source})
        s = self.settings
        return RegisterResponse(
            worker_id=worker_id,
            heartbeat_interval_s=s.heartbeat_interval_s,
            max_staleness=s.max_staleness,
            sampling=s.sampling,
            model_source=s.model_source,
            latest=self.latest,
            broadcast=s.broadcast.model_dump(),
            learner_public_key=self.public_key_hex,
            credential=credential,
            task=self.scorer.task_config(),
            lora=s.lora,
        )

    def take_join_token(self, source: str) -> None:
        """Token bucket per source address: registrations_per_minute, with as large a burst (relay
        probes draw from it too: each makes the coordinator open a connection)."""
        rate = self.settings.registrations_per_minute
        now = self.clock()
        tokens, as_of = self.join_buckets.get(source, (rate, now))
        tokens = min(rate, tokens + (now - as_of) * rate / 60.0)
        if tokens < 1.0:
            wait_s = (1.0 - tokens) * 60.0 / rate
            raise RequestError(429, f"too many registrations from {source or 'this address'}: at most {rate:g} a "
                                    f"minute; retry in {wait_s:.1f} s")
        self.join_buckets[source] = (tokens - 1.0, now)

    def worker_for_credential(self, credential: str) -> str | None:
        """The worker id a credential was issued to (None: not one this coordinator issued)."""
        return self.credentials.get(credential_digest(credential)) if credential else None

    def leave(self, req: LeaveRequest) -> None:
        """A worker shutting down cleanly: its leases go back at once, no timeout needed."""
        record = self._worker(req.worker_id)
        # with a releasable provider an idle worker leaving was released: it stays a candidate
        # the controller may choose again. (An active one leaving is a departure, as always.)
        fleet_release = self.settings.activation.provider != "static" and not self.controller.is_active(req.worker_id)
        record.alive = False
        if fleet_release:
            self.controller.release(req.worker_id)
        else:
            self.controller.vanish(req.worker_id)
        released = self._release_leases(req.worker_id, reason="worker_left")
        self.events.append({"kind": "worker_left", "worker_id": req.worker_id, "leases_requeued": released,
                            "released": fleet_release})
        self.control(trigger=f"{req.worker_id} left")

    def _refuse_quarantined(self, worker_id: str) -> None:
        reason = self.audit.quarantined.get(worker_id)
        if reason is not None:
            raise RequestError(403, f"worker {worker_id!r} is quarantined: {reason}")

    def _worker(self, worker_id: str) -> WorkerRecord:
        self._refuse_quarantined(worker_id)
        record = self.workers.get(worker_id)
        if record is None or not record.alive:
            raise RequestError(404, f"unknown worker {worker_id!r}: register first (or again, after a timeout)")
        record.last_seen = self.clock()
        return record

    def heartbeat(self, req: Heartbeat) -> HeartbeatResponse:
        record = self._worker(req.worker_id)
        self._check_version(req.version, "heartbeat.version")
        held = req.version if req.base_version is None else req.base_version
        self._check_version(held, "heartbeat.base_version")
        record.version = req.version
        if req.swap_s is not None:
            self.controller.observe_swap(req.swap_s)
        record.claimed_rollouts, record.claimed_busy_s = req.rollouts_total, req.busy_s_total
        record.claimed_bytes_relayed = req.bytes_relayed_total
        if req.dissemination_s is not None:
            record.claimed_dissemination_s = req.dissemination_s
        self.controller.observe_latencies(req.worker_id, req.dissemination_s, req.generation_s)
        fetch = self._next_fetch(record, held)
        return HeartbeatResponse(latest=self.latest.model_copy(update={"full": None}) if self.latest else None,
                                 fetch=fetch[0] if fetch else None, assignment=fetch[1] if fetch else None,
                                 active=self.controller.is_active(req.worker_id),
                                 learner_public_key=self.public_key_hex)

    def _peers(self) -> list[Peer]:
        return [Peer(w.worker_id, w.relay_address, w.upload_bps, w.download_bps, w.version)
                for w in self.workers.values() if w.alive]

    def _next_fetch(self, record: WorkerRecord, held: int):
        """What the worker pulls next towards the newest version, and from where; None when it
        holds the newest already (or waits for an anchor)."""
        if self.latest is None or held >= self.latest.version:
            return None
        return self.dissemination.next_fetch(record.worker_id, held, self.latest, self._peers())

    def bad_peer(self, req: BadPeerRequest) -> None:
        """A worker caught a source sending bytes that fail verification: never use it again."""
        self._worker(req.report.reporter_id)
        effect = self.dissemination.report(req.report.peer_id, req.report.reporter_id)
        self.events.append({"kind": "bad_peer", **req.report.model_dump(), "took_effect": effect != "none",
                            "avoided_by": effect})

    def _check_version(self, version: int, field_name: str) -> None:
        if version > self.current_version:
            raise RequestError(
                422, f"{field_name}={version} is from the future: newest published version is {self.current_version}"
            )

    # ---- leases ----
    def lease(self, req: LeaseRequest) -> LeaseResponse:
        """Work for a worker: the run's exact evaluations (versions 0 and last) first, then
        rollouts, then, when it gets none, a due evaluation; a worker serving an evaluation gets
        its next lease until it is done."""
        record = self._worker(req.worker_id)
        if self.latest is not None:
            self._check_version(req.version, "lease.version")
        record.version = req.version
        held = self.evaluation.hold_version(record.worker_id, req.version) if self.evaluation else None
        if held is not None:
            return self._evaluation_reply(record, req.version, spare=True) or self._refused(
                1.0, f"holding version {held} for its evaluation: load it again or wait for the evaluation to move")
        exact = self._evaluation_reply(record, req.version, spare=False)
        if exact is not None:
            return exact
        if not self.controller.is_active(record.worker_id):
            return self._evaluation_reply(record, req.version, spare=True) or self._refused(
                1.0, "inactive: idle until activated")
        mine = sum(1 for lease in self.leases.values() if lease.worker_id == record.worker_id)
        grant = self.plane.grant(req.version, req.max_tasks, leased=len(self.leases), held_by_worker=mine)
        if grant.count == 0:
            return self._evaluation_reply(record, req.version, spare=True) or self._refused(grant.retry_after_s,
                                                                                           grant.reason)
        with self.store.tx():
            tasks = [self._new_lease(record, req.version) for _ in range(grant.count)]
            self.store.set_meta("cursor", self.cursor)
        return LeaseResponse(tasks=tasks, latest_version=self.current_version)

    def _refused(self, retry_after_s: float, reason: str) -> LeaseResponse:
        return LeaseResponse(tasks=[], retry_after_s=retry_after_s, reason=reason, latest_version=self.current_version)

    def _evaluation_reply(self, record: WorkerRecord, version: int, spare: bool) -> LeaseResponse | None:
        if self.evaluation is None:
            return None
        task = self.evaluation.offer(record.worker_id, version, spare, self.clock())
        self._take_evaluation_events()
        if task is None:
            return None
        return LeaseResponse(tasks=[], evaluation=task, hold_version=task.version, latest_version=self.current_version)

    def _take_evaluation_events(self) -> None:
        if self.evaluation is not None and self.evaluation.events:
            self.events += self.evaluation.events
            self.evaluation.events = []

    def submit_evaluation(self, req: EvalSubmission) -> EvalAck:
        """A worker's greedy completions for its evaluation lease, scored here (never trained)."""
        self._worker(req.worker_id)
        if self.evaluation is None:
            raise RequestError(409, "this run evaluates on the learner ([evaluation] where); no evaluation leases")
        ack, problem = self.evaluation.submit(req, self.clock())
        self._take_evaluation_events()
        if ack is None:
            raise RequestError(409 if "not held" in problem else 422, problem)
        return ack.model_copy(update={"latest_version": self.current_version})

    def evaluation_result(self, version: int) -> EvaluationResult:
        if self.evaluation is None:
            raise RequestError(409, "this run evaluates on the learner ([evaluation] where)")
        return self.evaluation.result(version)

    def _new_lease(self, record: WorkerRecord, version: int) -> Task:
        if self.queue:
            index = self.queue.popleft()
        else:
            index, self.cursor = self.cursor, self.cursor + 1
        lease = Lease(f"L{uuid.uuid4().hex[:16]}", record.worker_id, index, version, self.clock())
        self.leases[lease.lease_id] = lease
        if record.leases_held == 0:
            record.busy_since = lease.leased_at
        record.leases_held += 1
        self.store.set_pending(index, lease.lease_id)
        return Task(task_id=lease.lease_id, prompt_ids=self.scorer.prompt_ids(index), sampling=self.settings.sampling,
                    episode_seed=self.scorer.episode_seed(index))

    def _release_leases(self, worker_id: str, reason: str) -> int:
        mine = [lease for lease in self.leases.values() if lease.worker_id == worker_id]
        self._requeue(mine, reason)
        return len(mine)

    def _requeue(self, leases: list[Lease], reason: str) -> None:
        with self.store.tx():
            for lease in leases:
                del self.leases[lease.lease_id]
                self._lease_ended(lease.worker_id)
                self.queue.appendleft(lease.prompt_index)  # oldest work first
                self.store.set_pending(lease.prompt_index, None)
            self.counters.leases_expired += len(leases)
            self._save_counters()
        for lease in leases:
            self.events.append({"kind": "lease_requeued", "worker_id": lease.worker_id, "reason": reason,
                                "prompt_index": lease.prompt_index})

    def sweep(self) -> None:
        """Expire silent workers (all their leases go back) and leases held too long."""
        now = self.clock()
        lost: list[str] = []
        for worker_id, record in self.workers.items():
            if record.alive and now - record.last_seen > self.settings.worker_timeout_s:
                record.alive = False
                self.controller.vanish(worker_id)
                lost.append(worker_id)
                self.counters.workers_lost += 1
                released = self._release_leases(worker_id, reason="worker_timeout")
                self.events.append({"kind": "worker_lost", "worker_id": worker_id, "leases_requeued": released})
        overdue = [lease for lease in self.leases.values() if now - lease.leased_at > self.settings.lease_timeout_s]
        if overdue:
            self._requeue(overdue, reason="lease_timeout")
        if lost:  # a preempted worker: re-plan now, not at the next control period
            self.control(trigger=f"lost {', '.join(lost)}")
        if self.evaluation is not None:
            alive = {w.worker_id: w.version for w in self.workers.values() if w.alive}
            self.evaluation.sweep(alive, self.settings.lease_timeout_s, now)
            self._take_evaluation_events()
        self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop long-gone workers that never did any work and cost nothing, and idle
        registration buckets: what a flood of registrations leaves behind stays bounded."""
        horizon = self.settings.forget_workers_after_s
        gone = [w for w in self.workers.values()
                if not w.alive and w.rollouts == 0 and now - w.last_seen > horizon and self.controller.costless(w.worker_id)]
        for record in gone:
            del self.workers[record.worker_id]
            self.credentials.pop(record.credential_digest, None)
            self.controller.forget(record.worker_id)
            self.dissemination.forget(record.worker_id)
        idle = [s for s, (_, as_of) in self.join_buckets.items() if now - as_of > 60.0]
        for source in idle:  # a full bucket again: nothing to remember
            del self.join_buckets[source]

    def control(self, trigger: str = "") -> None:
        """Re-decide which workers are active; record the decision when the set changes, or
        always when something happened (`trigger`, e.g. a worker vanished). Each periodic call
        (no trigger) also records the run's gauges (`coordinator_stats`) for the metric sinks
        and the end-of-run plots: queue depth, active workers, dollars spent so far."""
        decision = self.controller.decide(self.clock())
        self.plane.window.set_floor(self.controller.s_min())
        if not trigger:
            self.events.append(self._stats_event())
        if decision.changed or trigger:
            self.events.append({
                "kind": "activation", "active": sorted(decision.active), "reason": decision.reason,
                "trigger": trigger, "changed": decision.changed,
                "required_rps": decision.required_rps if decision.required_rps != float("inf") else None,
                "estimates_rps": decision.estimates,
            })

    # ---- rollouts ----
    def submit(self, req: RolloutSubmission) -> SubmitResponse:
        record = self._worker(req.worker_id)
        lease = self.leases.get(req.task_id)
        if lease is None or lease.worker_id != req.worker_id:
            raise RequestError(409, f"task {req.task_id!r} is not leased to {req.worker_id!r} (expired, re-leased or never leased)")
        self._check_version(req.version, "rollout.version")
        if req.version < lease.version:
            raise RequestError(422, f"rollout.version={req.version} is older than the lease's version {lease.version}")
        problem = check_submission(req, self.settings.sampling, self.scorer.vocab_size, self.scorer.max_episode_tokens)
        if problem:
            raise RequestError(422, problem)
        rewards = self._rewards(lease, req)
        self._account(record, req)
        self.controller.observe_tokens(req.worker_id, sum(len(c.token_ids) for c in req.completions), req.gen_time_s)
        fresh = self.plane.admits(req.version)
        self.controller.observe_outcome(req.worker_id, admitted=fresh)
        if fresh:
            self._accept(lease, req, rewards)
            self._measure(record)
            return SubmitResponse(accepted=True, rewards=rewards, latest_version=self.current_version)
        with self.store.tx():
            self._close_lease(lease, dropped=True)
        self._measure(record)
        self.events.append({"kind": "groups_dropped", "reason": "stale", "step": self.learner_step,
                            "prompt_indices": [lease.prompt_index]})
        return SubmitResponse(accepted=False, rewards=rewards, latest_version=self.current_version,
                              reason=f"stale: step {self.learner_step} - version {req.version} > S")

    def _rewards(self, lease: Lease, req: RolloutSubmission) -> list[float]:
        """Computed here, never taken from the worker; a multi-turn transcript that its seed and
        its own actions do not reproduce is refused whole (and recorded: an honest worker never
        sends one)."""
        try:
            started = time.perf_counter()
            rewards = self.scorer.rewards(lease.prompt_index, req.completions)
            if self.scorer.max_episode_tokens is not None:  # what verifying the episodes cost us
                self.events.append({"kind": "episodes_replayed", "worker_id": req.worker_id,
                                    "episodes": len(rewards), "replay_s": time.perf_counter() - started})
            return rewards
        except ReplayMismatch as exc:
            self.events.append({"kind": "replay_refused", "worker_id": req.worker_id, "task_id": req.task_id,
                                "prompt_index": lease.prompt_index, "reason": str(exc)[:500]})
            raise RequestError(422, f"{exc}; the group is refused") from None

    def _measure(self, record: WorkerRecord) -> None:
        """Throughput as the coordinator sees it: validated rollouts per second of holding
        leases. A worker's own figures (heartbeats) never steer activation: one claiming 10^6
        rollouts/s once had the honest workers switched off."""
        self.controller.observe_busy(record.worker_id, record.rollouts, self._measured_busy_s(record))

    def _account(self, record: WorkerRecord, req: RolloutSubmission) -> None:
        record.rollouts += len(req.completions)
        record.tokens += sum(len(c.token_ids) for c in req.completions)
        record.gen_time_s += req.gen_time_s

    def _accept(self, lease: Lease, req: RolloutSubmission, rewards: list[float]) -> None:
        group = TrainGroup(
            group_id=lease.lease_id,
            prompt_index=lease.prompt_index,
            prompt_ids=self.scorer.prompt_ids(lease.prompt_index),
            version=req.version,
            worker_id=req.worker_id,
            rewards=rewards,
            completions=req.completions,
        ).model_dump()
        with self.store.tx():
            self.store.add_group(group["group_id"], self.seq, group)
            self._close_lease(lease, dropped=False)
        self.seq += 1
        self.plane.add(group)

    def _lease_ended(self, worker_id: str) -> None:
        record = self.workers.get(worker_id)
        if record is not None and record.leases_held > 0:
            record.leases_held -= 1
            if record.leases_held == 0:
                record.busy_s += self.clock() - record.busy_since

    def _measured_busy_s(self, record: WorkerRecord) -> float:
        ongoing = self.clock() - record.busy_since if record.leases_held else 0.0
        return record.busy_s + ongoing

    def _close_lease(self, lease: Lease, dropped: bool) -> None:
        del self.leases[lease.lease_id]
        self._lease_ended(lease.worker_id)
        self.store.clear_pending(lease.prompt_index)
        if dropped:
            self.counters.dropped_stale += 1
        else:
            self.counters.accepted += 1
        self._save_counters()

    # ---- learner ----
    def publish(self, info: VersionInfo, public_key_hex: str) -> bool:
        """Accept a version from the learner: signed by the pinned learner key (broadcast.
        learner_public_key, else the key of the first publish, kept across restarts), and the
        next version (latest + 1) or the latest again; a replay of an older one by a resumed
        learner changes nothing. Checked in full before anything changes, then applied in one
        transaction. Returns whether the learner should make its next version an anchor."""
        pinned = self.public_key_hex or public_key_hex
        if public_key_hex != pinned:
            raise RequestError(409, f"publish signed by key {public_key_hex[:16]}...; this run's learner key is "
                                    f"{pinned[:16]}... (pinned at the first publish or by broadcast.learner_public_key)")
        try:
            manifest = verify_manifest(info.signed, public_key_from_hex(pinned), held_version=None, check_base=False)
        except (ManifestRejected, ValueError) as exc:
            raise RequestError(422, f"publish of version {info.version} refused: {exc}") from None
        if manifest.version != info.version:
            raise RequestError(422, f"publish says version {info.version}, its signed manifest {manifest.version}")
        self._check_full_form(info, manifest, pinned)
        newest = self.current_version
        if self.latest is not None and info.version < newest:
            # a restarted learner replaying steps: workers already hold the newer version
            self.events.append({"kind": "publish_replayed", "version": info.version, "latest": newest})
            return False
        # the newest version again is a restarted learner serving it from its new origin: workers
        # that had not finished it can only get it there, so it is announced anew
        if self.latest is not None and info.version not in (newest, newest + 1):
            raise RequestError(422, f"publish of version {info.version} skips ahead: the newest is {newest}, so the "
                                    f"next is {newest + 1}")
        plan = self.dissemination.plan_version(info.version, info.origin_url, self._peers())
        # the newest version again, or a new origin: a restarted learner, serving none of the forms before
        restarted = self.latest is None or info.version == newest or info.origin_url != self.latest.origin_url
        self.dissemination.published(info, restarted=restarted)
        with self.store.tx():
            self.store.set_meta("learner_public_key", pinned)
            self.store.set_meta("latest", info.model_dump())
            self.store.keep_offers(self.dissemination.stored_offers(), replace=restarted)
        self.public_key_hex, self.latest = pinned, info
        self.plane.publish(info.version)
        if self.evaluation is not None:
            self.evaluation.published(info.version)
        self.events.append({
            "kind": "version_published", "version": info.version, "broadcast_mode": plan.mode,
            "first_hop": plan.origin_children, "max_depth": max((a.depth for a in plan.assignments), default=0),
            "form": manifest.form, "anchor": info.full is not None or manifest.form == "full",
        })
        wanted, self.dissemination.anchor_wanted = self.dissemination.anchor_wanted, False
        return wanted

    def _check_full_form(self, info: VersionInfo, manifest, pinned: str) -> None:
        """An anchor's full manifest rides next to its delta: the same version, signed alike."""
        if info.full is None:
            return
        try:
            full = verify_manifest(info.full, public_key_from_hex(pinned), held_version=None)
        except (ManifestRejected, ValueError) as exc:
            raise RequestError(422, f"publish of version {info.version} refused: its full form: {exc}") from None
        if full.version != info.version or full.form != "full" or manifest.form != "delta":
            raise RequestError(422, f"publish of version {info.version}: `full` must be the full form of the same "
                                    f"version next to a delta `signed` (got {full.form} {full.version} next to "
                                    f"{manifest.form} {manifest.version})")

    def observe_step_time(self, step_time_s: float) -> None:
        """The learner's busy time per step (train + publish), reported with its batch requests."""
        self.controller.observe_step_time(step_time_s)
        self.plane.step_time_s = self.controller.step_time_s.value

    def checkpointed(self, durable_step: int, step: int) -> None:
        """The learner's checkpoint of `durable_step` is on disk, and it asks for `step` now: it
        resumes from that checkpoint or a newer one, never an older one, so the batches of
        earlier steps and their groups are deleted and the space returned. What resume needs
        stays: the batches of steps >= durable_step (a learner killed before its next
        checkpoint replays them exactly) and every buffered group."""
        if durable_step > min(step, self.steps_taken):
            raise RequestError(422, f"durable_step={durable_step} is ahead of what the learner was given (step={step}, "
                                    f"batches assigned up to step {self.steps_taken - 1}): it can only have "
                                    "checkpointed steps it trained")
        if durable_step <= self.durable_step:
            return
        with self.store.tx():
            deleted = self.store.compact(durable_step)
            self.store.set_meta("durable_step", durable_step)
        self.store.reclaim()
        self.durable_step = durable_step
        self.events.append({"kind": "groups_compacted", "durable_step": durable_step, "groups_deleted": deleted,
                            "store_bytes": self.store.size_bytes()})

    def take_batch(self, step: int) -> list[dict] | None:
        """The batch for learner step `step`, or None while not enough admissible groups exist.
        Asking again for an assigned step returns the same batch (exact learner resume)."""
        recorded = self.store.batch(step)
        if recorded is not None:
            return recorded
        if step < self.durable_step:
            raise RequestError(409, f"step {step}'s batch was deleted once the learner checkpointed step "
                                    f"{self.durable_step}; resume the learner from that checkpoint or a newer one")
        if step < self.steps_taken - 1:
            raise RequestError(409, f"step {step} was never assigned a batch; the learner is at an unknown step")
        self._advance(step)
        batch = self.plane.take_batch(step, now_s=self.clock())
        if batch is None:
            return None
        ids = [g["group_id"] for g in batch]
        with self.store.tx():
            self.store.set_group_state(ids, "trained", step)
            self.store.save_batch(step, ids)
            self.counters.trained += len(batch)
            self._save_counters()
        self.events.append(self._batch_event(step, batch))
        return batch

    def reject_batch(self, step: int, reason: str, requeue_group_ids: Iterable[str] = ()) -> int:
        """The learner skipped `step` without training: its groups are retired as rejected (not
        retrained: a poisoned group would poison every batch it joined) and the step gets a fresh
        batch when asked again; groups in `requeue_group_ids` (the learner found nothing wrong
        with them: the step was skipped over another worker's failed audit) go back to the head
        of the buffer instead, unless their worker is quarantined. A group that failed the audit
        is retired and its prompt redone. Only the newest assigned step can be rejected."""
        if step == self.steps_taken and self.store.batch(step) is None and self.store.has_groups("rejected", step):
            return 0  # already rejected: a retried request whose first answer was lost
        if step != self.steps_taken - 1:
            raise RequestError(409, f"step {step} cannot be rejected: the newest assigned batch is step {self.steps_taken - 1}")
        groups = self.store.batch(step) or []
        wanted = set(requeue_group_ids)
        keep = [g for g in groups if g["group_id"] in wanted and g["worker_id"] not in self.audit.quarantined
                and g["group_id"] not in self.audit.failed_groups]
        kept = {g["group_id"] for g in keep}
        retired = [g for g in groups if g["group_id"] not in kept]
        redo = [g for g in retired if g["group_id"] in self.audit.failed_groups
                or g["worker_id"] in self.audit.quarantined]
        with self.store.tx():
            self.store.set_group_state([g["group_id"] for g in retired], "rejected", step)
            self.store.set_group_state([g["group_id"] for g in keep], "buffered", None)
            self.store.delete_batch(step)
            self._redo_prompts(redo)
            self.counters.trained -= len(groups)
            self.counters.rejected_by_learner += len(retired)
            self._save_counters()
        self.plane.requeue_front(keep)  # the batch took the oldest groups: they stay the oldest
        self.plane.steps_taken = step
        redone = {g["group_id"] for g in redo}
        self.events.append({"kind": "batch_rejected", "step": step, "groups": len(retired), "requeued": len(keep),
                            "prompts_redone": len(redo), "reason": reason[:500],
                            "retired_prompt_indices": [g["prompt_index"] for g in retired if g["group_id"] not in redone]})
        return len(retired)

    # ---- rollout audit ----
    def record_audit(self, report: AuditReport) -> list[str]:
        """The learner's verdicts on a step's groups; quarantines workers whose groups failed
        `audit_flags_to_quarantine` times. Returns the workers quarantined now."""
        newly = self.audit.record(report)
        for worker_id, reason in newly.items():
            self._quarantine(worker_id, reason)
        return sorted(newly)

    def _quarantine(self, worker_id: str, reason: str) -> None:
        """Cut a worker off for good: its id refused from now on (also after a restart), its
        buffered groups dropped and their prompts redone by others, its leases handed back."""
        mine = [g for g in self.buffer if g["worker_id"] == worker_id]
        with self.store.tx():
            self.store.set_meta("quarantined", self.audit.quarantined)
            self.store.set_group_state([g["group_id"] for g in mine], "quarantined", self.learner_step)
            self._redo_prompts(mine)
            self.counters.dropped_quarantined += len(mine)
            self._save_counters()
        self.plane.remove(lambda g: g["worker_id"] != worker_id)
        released = self._release_leases(worker_id, reason="worker_quarantined")
        record = self.workers.get(worker_id)
        if record is not None:
            record.alive = False
        self.controller.vanish(worker_id)
        self.events.append({"kind": "worker_quarantined", "worker_id": worker_id, "reason": reason,
                            "groups_dropped": len(mine), "leases_requeued": released})
        self.control(trigger=f"{worker_id} quarantined")

    def _redo_prompts(self, groups: list[dict]) -> None:
        """Prompts whose groups were thrown away go back to the head of the queue (inside the
        caller's transaction), so no prompt of the dataset is lost to a lying worker."""
        for group in groups:
            self.queue.appendleft(group["prompt_index"])
            self.store.set_pending(group["prompt_index"], None)

    def _advance(self, step: int) -> None:
        """Move the learner step forward and drop buffered groups that became too stale."""
        if step != self.learner_step:
            self.store.set_meta("learner_step", step)
        stale = self.plane.advance(step)
        for group in stale:
            self.controller.observe_outcome(group["worker_id"], admitted=False)
        if stale:
            with self.store.tx():
                self.store.set_group_state([g["group_id"] for g in stale], "dropped", step)
                self.counters.dropped_stale += len(stale)
                self._save_counters()
            # which prompts: an account of where every prompt went (benchmarks/chaos.py checks
            # that none is lost)
            self.events.append({"kind": "groups_dropped", "reason": "stale", "step": step,
                                "prompt_indices": [g["prompt_index"] for g in stale]})

    def _stats_event(self) -> dict:
        return {  # right after decide(), which billed up to now
            "kind": "coordinator_stats", "learner_step": self.learner_step, "version": self.current_version,
            "queued": len(self.queue), "leased": len(self.leases), "buffered": len(self.buffer),
            "workers_alive": sum(1 for w in self.workers.values() if w.alive),
            "workers_active": sum(1 for w in self.workers.values() if self.controller.is_active(w.worker_id)),
            "cost_total": self.controller.total_cost(), "price_per_hour": self.controller.price_per_hour_now(),
        }

    def _batch_event(self, step: int, batch: list[dict]) -> dict:
        hist = Counter(staleness(step, g["version"]) for g in batch)
        return {
            "kind": "batch_assigned",
            "step": step,
            "staleness_hist": {str(k): v for k, v in sorted(hist.items())},
            "max_staleness_seen": max(hist),
            "lease_window_steps": self.plane.window.steps,
            "buffered": len(self.buffer),
            "leased": len(self.leases),
        }

    def snapshot(self) -> dict:
        self.controller.account(self.clock())  # bill up to now, not to the last control tick
        return {
            "learner_step": self.learner_step,
            "version": self.current_version,
            "queued": len(self.queue),
            "leased": len(self.leases),
            "buffered": len(self.buffer),
            "counters": asdict(self.counters),
            "cost": self.controller.snapshot(),
            "audit": self.audit.snapshot(),
            "evaluations": self.evaluation.snapshot() if self.evaluation is not None else None,
            "workers": {
                w.worker_id: {
                    "version": w.version,
                    "alive": w.alive,
                    "active": self.controller.is_active(w.worker_id),
                    "price_per_hour": w.price_per_hour,
                    "leases": w.leases_held,
                    "rollouts": w.rollouts,
                    "tokens": w.tokens,
                    "tokens_per_s": w.tokens / w.gen_time_s if w.gen_time_s > 0 else 0.0,
                    "rollouts_per_s_measured": w.rollouts / busy if (busy := self._measured_busy_s(w)) > 0 else None,
                    "rollouts_per_s_claimed": (w.claimed_rollouts / w.claimed_busy_s if w.claimed_busy_s > 0
                                               else None),
                    "bytes_relayed_claimed": w.claimed_bytes_relayed,
                    "publish_to_loaded_s_claimed": w.claimed_dissemination_s,
                }
                for w in self.workers.values()
            },
        }


def _group_version(group: dict) -> int:
    return group["version"]
