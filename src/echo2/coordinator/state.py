"""The coordinator's wiring: its parts, each built from its own section of the run config and
owning its data, its desks, which run the transactions that span the parts, and the one list
of events they all append to (the server logs them and writes them to metrics.jsonl).

Nothing here decides anything: the server calls the desks (`worker_desk`, `fleet_desk`,
`learner_desk`, `intake`, `evaluation`) directly, and the dashboard and /metrics read the parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from echo2.config.run import RunConfig
from echo2.coordinator.desks.evaluation import EvaluationDesk
from echo2.coordinator.desks.fleet import FleetDesk
from echo2.coordinator.desks.learner import LearnerDesk
from echo2.coordinator.desks.rollouts import RolloutIntake
from echo2.coordinator.desks.workers import WorkerDesk
from echo2.coordinator.parts.audit import AuditLedger
from echo2.coordinator.parts.groups import Counters, GroupBook
from echo2.coordinator.parts.leases import LeaseBook
from echo2.coordinator.parts.registry import Registry
from echo2.coordinator.parts.versions import VersionDesk
from echo2.coordinator.records import events as ev
from echo2.coordinator.records.store import Store
from echo2.coordinator.scoring.limits import ScoringLimits
from echo2.coordinator.scoring.scorer import Scorer
from echo2.policy.controller import ActivationController


class CoordinatorState:
    cfg: RunConfig
    store: Store
    scorer: Scorer
    clock: Callable[[], float]
    events: list[ev.Event]
    controller: ActivationController
    versions: VersionDesk
    counters: Counters
    audit: AuditLedger
    registry: Registry
    leases_book: LeaseBook
    groups: GroupBook
    limits: ScoringLimits
    evaluation: EvaluationDesk | None
    """Evaluation leases (None: the learner evaluates, [evaluation] where)."""
    intake: RolloutIntake
    fleet_desk: FleetDesk
    worker_desk: WorkerDesk
    learner_desk: LearnerDesk

    def __init__(self, cfg: RunConfig, store: Store, scorer: Scorer, clock: Callable[[], float] = time.monotonic):
        self.cfg, self.store, self.scorer, self.clock = cfg, store, scorer, clock
        self.events = []
        self.controller = _controller(cfg, now=clock())
        self.versions = VersionDesk(store, cfg.broadcast, cfg.learner.upload_bps)
        self.counters = Counters(**store.get_meta("counters", {}))
        self.audit = AuditLedger(cfg.audit.flags_to_quarantine, store.get_meta("quarantined", {}))
        self.registry = Registry(cfg.coordinator, clock, self.audit.quarantined)
        self.leases_book = LeaseBook(store, self.registry.workers, clock)
        self.groups = GroupBook(store, self.counters, cfg, current_version=self.versions.current)
        self.limits = ScoringLimits(cfg.coordinator.scoring, events=self.events, clock=clock)
        multi_turn = scorer.max_episode_tokens is not None
        self.evaluation = EvaluationDesk(self) if cfg.evaluation.on_workers(multi_turn=multi_turn) else None
        self.intake = RolloutIntake(self)
        self.fleet_desk = FleetDesk(self)
        self.worker_desk = WorkerDesk(self)
        self.learner_desk = LearnerDesk(self)

    def take_events(self) -> list[ev.Event]:
        """The events since the last call, oldest first (the parts share the list: emptied in place)."""
        taken = list(self.events)
        self.events.clear()
        return taken


def _controller(cfg: RunConfig, *, now: float) -> ActivationController:
    """Cost-aware activation over the run's workers, with the local workers started on demand
    offered to it before any registers."""
    controller = ActivationController(cfg.activation, batch_rollouts=cfg.batch_rollouts,
                                      max_staleness=cfg.train.max_staleness,
                                      learner_price_per_hour=cfg.learner.price_per_hour, now=now,
                                      catalog=cfg.activation_plan(), max_masked_fraction=cfg.train.max_masked_fraction)
    for offered in cfg.offered_workers():
        controller.offer(*offered)
    return controller
