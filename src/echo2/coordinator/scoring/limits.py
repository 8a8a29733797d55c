"""What scoring one worker's submissions may cost the coordinator, in two rules:

- one submission at a time: a worker's rollout or evaluation submission is refused (429) while
  another of its submissions is being scored (an honest worker submits one after the other);
- strikes: each completion cut off over its budget (`OverBudget`: coordinator.scoring.timeout_s)
  scores 0 and is a strike against its worker; a worker with coordinator.scoring.strikes
  strikes within the last coordinator.scoring.strike_window_s seconds has its submissions
  refused (429) until the oldest of them is that old; and the pool stops running a
  submission's completions once it has cut off as many as its worker has strikes left. So one worker's completions cost
  the scoring pool at most `strikes` budgets (plus those already running) per window.

Strikes are recorded when the scoring ends, whether or not the group is then accepted (the
cost was paid), and kept in memory only: at most `strikes` times per worker, workers whose
strikes are all older than the window forgotten."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from echo2.config.scoring import ScoringConfig
from echo2.coordinator.records import events as ev
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.scoring.jobs import Outcome, OverBudget


class ScoringLimits:
    def __init__(self, cfg: ScoringConfig, *, events: list[ev.Event], clock: Callable[[], float]) -> None:
        """`cfg`: coordinator.scoring; `events`: the coordinator's (shared)."""
        self.strikes, self.window_s, self.events, self.clock = cfg.strikes, cfg.strike_window_s, events, clock
        self.struck: dict[str, deque[float]] = {}
        """Worker id -> the times of its last `strikes` over-budget completions."""
        self.busy: set[str] = set()
        """Workers with a submission being scored now."""

    def admit(self, worker_id: str) -> None:
        """Refuse (429) a worker whose submission may not be scored now."""
        if worker_id in self.busy:
            raise RequestError(429, f"worker {worker_id!r} already has a submission being scored: wait for its reply "
                                    "before sending another")
        wait_s = self.refused_for_s(worker_id)
        if wait_s > 0:
            raise RequestError(429, f"{self.strikes} of worker {worker_id!r}'s completions ran past "
                                    f"coordinator.scoring.timeout_s within {self.window_s:g} s: its submissions are "
                                    f"refused for another {wait_s:.0f} s")

    def refused_for_s(self, worker_id: str) -> float:
        times = self.struck.get(worker_id)
        if times is None or len(times) < self.strikes:
            return 0.0
        return max(0.0, times[0] + self.window_s - self.clock())

    def strikes_left(self, worker_id: str) -> int:
        """Over-budget completions this worker may still have before it is refused."""
        now = self.clock()
        recent = sum(1 for t in self.struck.get(worker_id, ()) if t + self.window_s > now)
        return max(1, self.strikes - recent)

    @contextmanager
    def scoring(self, worker_id: str) -> Iterator[None]:
        """While a submission of `worker_id` is scored (released however the scoring ends)."""
        self.busy.add(worker_id)
        try:
            yield
        finally:
            self.busy.discard(worker_id)

    def values(self, worker_id: str, what: str, lease_id: str, outcomes: list[Outcome]) -> list[float]:
        """Each outcome's value: over budget (and a `Mismatch`, which the caller refuses) is 0.0.
        Each over-budget one is struck against the worker and recorded."""
        now = self.clock()
        self._forget(now)
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, OverBudget):
                times = self.struck.setdefault(worker_id, deque(maxlen=self.strikes))
                times.append(now)
                self.events.append(ev.ScoringOverBudget(
                    worker_id=worker_id, what=what, lease_id=lease_id, completion=index, reason=outcome.reason,
                    pid=outcome.pid, strikes=len(times), refused=self.refused_for_s(worker_id) > 0))
        return [outcome if isinstance(outcome, float) else 0.0 for outcome in outcomes]

    def _forget(self, now: float) -> None:
        for worker_id in [w for w, times in self.struck.items() if times[-1] + self.window_s <= now]:
            del self.struck[worker_id]
