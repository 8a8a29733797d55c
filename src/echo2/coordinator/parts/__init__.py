"""The coordinator's parts, each built from its own section of the run config and owning its
data: the activation controller, published versions and their dissemination, the counters,
the audit's ledger, the worker registry, the lease book, the group book (the policy's data
plane over stored groups) and the scoring limits; and the one list of events they all append
to. The desks (`coordinator.desks`) run the transactions that span them."""

from __future__ import annotations

import time
from collections.abc import Callable

from echo2.config.run import RunConfig
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
from echo2.policy.credit import MIN_PASSED_AUDITS
from echo2.policy.evidence import VersionEvidence


class Parts:
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

    def __init__(self, cfg: RunConfig, store: Store, scorer: Scorer, clock: Callable[[], float] = time.monotonic):
        self.cfg, self.store, self.scorer, self.clock = cfg, store, scorer, clock
        self.events = []
        self.controller = _controller(cfg, now=clock())
        self.audit = AuditLedger(cfg.audit.flags_to_quarantine, store.get_meta("quarantined", {}), VersionEvidence(
            cfg.audit.older_versions, cfg.audit.honest_match_rate, cfg.audit.false_positive_rate,
            cfg.audit.honest_logprob_fit_rate),
            proven_groups=cfg.audit.proven_groups)
        self.registry = Registry(cfg.coordinator, clock, self.audit.quarantined)
        self.versions = VersionDesk(store, cfg.broadcast, cfg.learner.upload_bps)
        self.counters = Counters(**store.get_meta("counters", {}))
        self.leases_book = LeaseBook(store, self.registry.workers, clock)
        self.groups = GroupBook(store, self.counters, cfg, current_version=self.versions.current, clock=clock)
        self.limits = ScoringLimits(cfg.coordinator.scoring, events=self.events, clock=clock)

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
                                      catalog=cfg.activation_plan(), max_masked_fraction=cfg.train.max_masked_fraction,
                                      # rates count once the audit has checked some work (the audit off: as measured)
                                      min_passed_audits=MIN_PASSED_AUDITS if cfg.audit.enabled else 0,
                                      groups_per_step=cfg.grpo.prompts_per_step)
    for offered in cfg.offered_workers():
        controller.offer(*offered)
    return controller
