"""What workers ask of the coordinator, as whole transactions over its parts: joining, heartbeats,
the news each worker is told, leaving, leases (rollouts, or evaluations first or spare), and the
sweep that expires silent workers and overdue leases and re-plans activation when one is lost.
Every method applies a whole change or raises `RequestError` having changed nothing; events go
to the shared list.

The work per request does not grow with the fleet: a worker's news is a version's plan entry
(made once per version), the first step of its way to the newest version (once per version
held) and a few lookups; the heartbeat interval it is told stretches so that the fleet together
beats at about coordinator.heartbeats_per_s."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from echo2.config.task import trusted_workers_only
from echo2.coordinator.parts import Parts
from echo2.coordinator.parts.leases import Lease
from echo2.coordinator.parts.registry import WorkerRecord
from echo2.coordinator.parts.relay_reports import CheckVerdict, RelayCheck, ReportEffect
from echo2.coordinator.records import events as ev
from echo2.coordinator.records import relay_events
from echo2.coordinator.records.errors import RequestError
from echo2.policy.dataplane import LeaseGrant
from echo2.policy.trust import REPORT_STANDING_GROUPS
from echo2.protocol.broadcast import Assignment
from echo2.protocol.messages import (
    MAX_HEARTBEAT_INTERVAL_S,
    BadPeerRequest,
    Heartbeat,
    LeaseRequest,
    LeaseResponse,
    LeaveRequest,
    RegisterRequest,
    RegisterResponse,
    SamplingParams,
    Task,
    VersionInfo,
)

if TYPE_CHECKING:
    from echo2.coordinator.desks.evaluation import EvaluationDesk
    from echo2.coordinator.desks.fleet import FleetDesk


PEERS_MAX_AGE_S = 1.0
"""Replies to workers outside a version's plan share one view of the live workers a second."""
BEAT_JITTER = 0.1
"""Each told interval is spread this much either way, so a fleet that joined together does not
beat together."""
OVERLOADED = 4.0
"""A load stretch this large: the coordinator admits no registration for OVERLOADED_REFUSAL_S."""
OVERLOADED_REFUSAL_S = 5.0
IDLE_LEASE_ASKS_PER_S = 20.0
"""How often idle workers together may ask for work (to serve a due evaluation): each is told
to come back after its share of that, and activation reaches it on its news line at once."""


@dataclass(frozen=True, slots=True)
class WorkerNews:
    """What a worker is told, in its heartbeat's reply or on its news line (as a HeartbeatResponse)."""

    latest: VersionInfo | None
    fetch: VersionInfo | None
    assignment: Assignment | None
    active: bool
    learner_public_key: str
    heartbeat_interval_s: float


class WorkerDesk:
    def __init__(self, state: Parts, *, fleet: FleetDesk, evaluation: EvaluationDesk | None) -> None:
        self.cfg = state.cfg
        self.registry, self.leases_book, self.groups = state.registry, state.leases_book, state.groups
        self.versions, self.controller, self.evaluation = state.versions, state.controller, evaluation
        self.scorer, self.store, self.counters = state.scorer, state.store, state.counters
        self.events, self.clock = state.events, state.clock
        self.sampling = SamplingParams.of(state.cfg.sampling)
        self.load_stretch = 1.0
        """How much longer than planned heartbeats are told to wait now (the server sets it from
        its event loop's lag: 1 when keeping up)."""
        self.fleet = fleet

    def register(self, req: RegisterRequest, source: str = "", trusted: bool = False) -> RegisterResponse:
        """Join the run (with the join token). Issues the credential every later call of this
        worker must carry; only an evicted or departed worker's id can register again (its old
        credential and leases are void). `source`, the caller's address, is rate-limited.
        `trusted`: it presented the trusted-worker token, which a worker-trusted environment's
        workers must."""
        if trusted_workers_only(self.cfg.task) and not trusted:
            raise RequestError(403, "task.trust = 'worker-trusted': this run's rewards rest on its workers' tool "
                                    "answers, so only workers holding the trusted-worker token may join: set "
                                    "$ECHO2_TRUSTED_TOKEN (or $ECHO2_TRUSTED_TOKEN_FILE) on this worker to the "
                                    "coordinator's (its $ECHO2_TRUSTED_TOKEN or <run_dir>/keys/trusted.token)")
        self.registry.take_join_token(source)
        self.registry.take_admission(refuse_for_s=OVERLOADED_REFUSAL_S if self.load_stretch >= OVERLOADED else 0.0)
        if self.cfg.audit.require_seeded_sampler and req.sampler != "seeded":
            raise RequestError(422, f"sampler {req.sampler!r}: this run audits every worker's tokens against the "
                                    "seeded sampler (audit.require_seeded_sampler = true), which echo2's engines "
                                    "use; run this worker with engine = 'hf' or 'vllm' (of this release), or set "
                                    "audit.require_seeded_sampler "
                                    "= false on the run (free-sampling workers are then audited by log-probs only)")
        self._check_class(req.worker_class)
        record, credential, old = self.registry.admit(req)
        if old is not None:
            self.fleet.release_leases(record.worker_id, reason="reregistered")
        self.groups.trust.forget(record.worker_id)  # earned by a registration, not an id
        # while the controller decides with a known demand, a newcomer waits for its decision (at
        # most a sweep away) instead of leasing with thousands of others that join with it
        deciding = self.controller.cfg.enabled and math.isfinite(self.controller.required_rps())
        self.controller.join(record.worker_id, req.price_per_hour, req.worker_class or None, active=not deciding)
        if deciding:
            self.fleet.control_soon()
        self.events.append(ev.WorkerRegistered(worker_id=record.worker_id, engine=req.engine,
                                               price_per_hour=req.price_per_hour, relay_address=req.relay_address,
                                               source=source, trusted=trusted))
        cfg = self.cfg
        return RegisterResponse(
            worker_id=record.worker_id, heartbeat_interval_s=cfg.coordinator.heartbeat_interval_s,
            max_staleness=cfg.train.max_staleness, sampling=self.sampling, model_source=cfg.base_model_path,
            broadcast=cfg.broadcast, learner_public_key=self.versions.public_key_hex, credential=credential,
            task=self.scorer.task_config(), lora=cfg.grpo.lora,
        )

    def _check_class(self, worker_class: str) -> None:
        planned = self.controller.planned
        if worker_class and planned is not None and not planned.knows(worker_class):
            known = ", ".join(sorted(planned.catalog.workers))
            raise RequestError(422, f"worker_class {worker_class!r} is not a class of the run's activation catalog "
                                    f"(classes: {known}); set worker.worker_class to one of them, or empty")

    def leave(self, req: LeaveRequest) -> None:
        """A worker shutting down cleanly: its leases go back at once, no timeout needed. With a
        releasable provider an idle worker leaving was released: it stays a candidate the
        controller may choose again (an active one leaving is a departure, as always)."""
        record = self.registry.live(req.worker_id)
        fleet_release = self.cfg.activation.provider != "static" and not self.controller.is_active(req.worker_id)
        self.registry.depart(record)
        (self.controller.release if fleet_release else self.controller.vanish)(req.worker_id)
        released = self.fleet.release_leases(req.worker_id, reason="worker_left")
        self.events.append(ev.WorkerLeft(worker_id=req.worker_id, leases_requeued=released, released=fleet_release))
        self.fleet.control_soon(trigger=f"{req.worker_id} left")

    def heartbeat(self, req: Heartbeat) -> WorkerNews:
        """A sign of life with the worker's claims (shown, never decided on) and its latencies;
        answered with its news as of now."""
        record = self.registry.live(req.worker_id)
        self.versions.check(req.version, "heartbeat.version")
        held = req.version if req.base_version is None else req.base_version
        self.versions.check(held, "heartbeat.base_version")
        record.version, record.held = req.version, held
        self.track_stale(record)
        if record.stale_since is not None:  # too stale to lease, it submits nothing: sample it now
            self.controller.observe_busy(record.worker_id, *record.work_counters(self.clock()))
        if req.swap_s is not None:
            self.controller.observe_swap(req.swap_s)
        record.claimed_rollouts, record.claimed_busy_s = req.rollouts_total, req.busy_s_total
        record.claimed_bytes_relayed = req.bytes_relayed_total
        if req.dissemination_s is not None:
            record.claimed_dissemination_s = req.dissemination_s
        self.controller.observe_latencies(req.worker_id, req.dissemination_s, req.generation_s)
        return self.news(record, held, beat=True)

    def news(self, record: WorkerRecord, held: int | None = None, *, beat: bool = False) -> WorkerNews:
        """What `record`'s worker is told: the newest version, what to pull next and from where
        (for the version it holds, `held`: a heartbeat says; for news, the newest it holds or was
        told to fetch), whether to work, and when to beat next (which also sets when it is taken
        for gone). `beat`: told in a heartbeat's reply, else on its news line."""
        held = max(record.held, record.fetching) if held is None else held
        fetch = self.versions.next_fetch(record.worker_id, held, self.registry.peers(PEERS_MAX_AGE_S), joiner=record)
        if fetch is not None:
            record.fetching = max(record.fetching, fetch[0].version)
        interval_s = self.beat_interval_s() * random.uniform(1.0 - BEAT_JITTER, 1.0 + BEAT_JITTER)
        cfg = self.cfg.coordinator
        allowed_s = cfg.worker_timeout_s * interval_s / cfg.heartbeat_interval_s
        # a news line is no sign of life, and the worker still sleeps the interval its last beat
        # was told: the silence allowed is never shortened there (a fleet shrinking fast would
        # time out workers that beat just when they were told to)
        since_beat_s = self.clock() - record.last_seen
        record.silent_after_s = allowed_s if beat else max(record.silent_after_s, since_beat_s + allowed_s)
        # the newest version itself is not sent twice: no `fetch` means "fetch `latest`"
        to_fetch = fetch[0] if fetch is not None and fetch[0] is not self.versions.announced else None
        return WorkerNews(self.versions.announced, to_fetch, fetch[1] if fetch else None,
                          self.controller.is_active(record.worker_id), self.versions.public_key_hex, interval_s)

    def news_of(self, worker_id: str) -> WorkerNews | None:
        """A live worker's news (None: it is gone)."""
        record = self.registry.workers.get(worker_id)
        return self.news(record) if record is not None and record.alive else None

    def beat_interval_s(self) -> float:
        """coordinator.heartbeat_interval_s, stretched so that the live fleet beats at about
        coordinator.heartbeats_per_s, and further while the coordinator is loaded
        (`load_stretch`): spare heartbeats are the first work it sheds."""
        cfg = self.cfg.coordinator
        fleet = self.registry.live_count / (cfg.heartbeat_interval_s * cfg.heartbeats_per_s)
        return min(MAX_HEARTBEAT_INTERVAL_S / (1.0 + BEAT_JITTER),
                   cfg.heartbeat_interval_s * max(1.0, fleet) * self.load_stretch)

    def bad_peer(self, req: BadPeerRequest) -> ReportEffect:
        """A worker caught a source sending bytes that fail verification: it avoids the source
        if the coordinator sent it there, and a report from a reporter with standing (accepted
        groups) asks for the coordinator's own check of the chunk (parts.relay_reports). A
        report that changes nothing is recorded as such (took_effect False)."""
        self.registry.live(req.report.reporter_id)
        said, dissemination = req.report, self.versions.dissemination
        manifest = dissemination.manifest(said.version, said.form)
        if manifest is not None and said.chunk_index >= manifest.num_chunks:
            raise RequestError(422, f"report.chunk_index: {said.chunk_index}, but version {said.version} "
                                    f"({said.form}) has {manifest.num_chunks} chunks")
        standing = self.groups.trust.accepted(said.reporter_id) >= REPORT_STANDING_GROUPS
        effect = dissemination.report(said.peer_id, said.reporter_id, said.version, standing=standing,
                                      form=said.form, chunk_index=said.chunk_index, manifest=manifest)
        report = req.report.model_dump(exclude={"kind"})
        self.events.append(relay_events.BadPeer(**report, took_effect=effect != "none", avoided_by=effect))
        return effect

    def relay_checked(self, check: RelayCheck, verdict: CheckVerdict, seen: str) -> None:
        """The coordinator's own fetch of a reported chunk came back (`http/relay_checks`)."""
        refuted = self.versions.dissemination.reports.checked(check, verdict)
        peer_id, version, form, chunk_index = check.key
        self.events.append(relay_events.RelayChecked(
            peer_id=peer_id, version=version, form=form, chunk_index=chunk_index, verdict=verdict, seen=seen,
            reporters=sorted(check.reporters), refuted=refuted))

    def lease(self, req: LeaseRequest) -> LeaseResponse:
        """Work for a worker: the run's exact evaluations (versions 0 and last) first, then
        rollouts, then, when it gets none, a due evaluation; a worker serving an evaluation gets
        its next lease until it is done."""
        record = self.registry.live(req.worker_id)
        if self.versions.latest is not None:
            self.versions.check(req.version, "lease.version")
        record.version = req.version
        record.held = max(record.held, req.version)
        evaluation = self._evaluation_first(record, req.version)
        if evaluation is not None:
            return evaluation
        if not self.controller.is_active(record.worker_id):
            idle_s = max(1.0, self.registry.live_count / IDLE_LEASE_ASKS_PER_S)
            return self._spare_or_refused(record, req.version, LeaseGrant(0, idle_s, "inactive: idle until activated",
                                                                          "inactive"))
        grant = self.groups.grant(record.worker_id, req.version, req.max_tasks, leased=len(self.leases_book.leases),
                                  held_by_worker=len(self.leases_book.held_by(record.worker_id)),
                                  held_by_new=self.leases_book.held_by_new(self.groups.trust.is_new))
        if grant.count == 0:
            self.track_stale(record)
            return self._spare_or_refused(record, req.version, grant)
        deadline_s = self.groups.trust.deadline_s(record.worker_id, self.cfg.coordinator.lease_timeout_s)
        leases = self.leases_book.issue(record, req.version, grant.count, deadline_s)
        self.track_stale(record)
        tasks = [self._task(lease) for lease in leases]
        return LeaseResponse(tasks=tasks)

    def track_stale(self, record: WorkerRecord) -> None:
        """Time an active worker holds no lease because its weights are too stale (the worker
        does not even ask then: its heartbeats say which version it holds) counts as working
        time in its measured rate, so a link too slow for S shows in what it is credited."""
        stale = (self.controller.is_active(record.worker_id) and record.leases_held == 0 and record.version >= 0
                 and not self.groups.may_lease(record.version))
        record.mark_stale(stale, self.clock())

    def _task(self, lease: Lease) -> Task:
        return Task(lease_id=lease.lease_id, prompt_ids=self.scorer.prompt_ids(lease.prompt_index),
                    sampling=self.sampling, episode_seed=self.scorer.episode_seed(lease.prompt_index),
                    sampling_seed=self.leases_book.seed_of(lease.lease_id))

    def _evaluation_first(self, record: WorkerRecord, version: int) -> LeaseResponse | None:
        if self.evaluation is None:
            return None
        return self.evaluation.first_reply(record.worker_id, version, self.clock())

    def _spare_or_refused(self, record: WorkerRecord, version: int, refused: LeaseGrant) -> LeaseResponse:
        """A due evaluation for a worker that gets no rollouts, else the refusal."""
        spare = self.evaluation.spare_reply(record.worker_id, version, self.clock()) \
            if self.evaluation is not None else None
        return spare or LeaseResponse(tasks=[], retry_after_s=refused.retry_after_s, reason=refused.reason,
                                      refusal=refused.refusal)
