"""The coordinator's wiring: its parts (`coordinator.parts.Parts`, each built from its own
section of the run config) and its desks, which run the transactions that span the parts.

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
from echo2.coordinator.parts import Parts
from echo2.coordinator.records.store import Store
from echo2.coordinator.scoring.scorer import Scorer


class CoordinatorState(Parts):
    evaluation: EvaluationDesk | None
    """Evaluation leases (None: the learner evaluates, [evaluation] where)."""
    intake: RolloutIntake
    fleet_desk: FleetDesk
    worker_desk: WorkerDesk
    learner_desk: LearnerDesk

    def __init__(self, cfg: RunConfig, store: Store, scorer: Scorer, clock: Callable[[], float] = time.monotonic):
        super().__init__(cfg, store, scorer, clock)
        multi_turn = scorer.max_episode_tokens is not None
        self.evaluation = EvaluationDesk(self) if cfg.evaluation.on_workers(multi_turn=multi_turn) else None
        self.intake = RolloutIntake(self)
        self.fleet_desk = FleetDesk(self, evaluation=self.evaluation)
        self.worker_desk = WorkerDesk(self, fleet=self.fleet_desk, evaluation=self.evaluation)
        self.learner_desk = LearnerDesk(self, fleet=self.fleet_desk, evaluation=self.evaluation)
