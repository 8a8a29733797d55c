"""The simulated learner: ask for the batch of step t, wait until the data plane has P admissible
groups, train for one step time, publish version t+1, repeat. Utilization is busy / (busy +
wait), exactly as the run summary computes it from the real learner's `train_step` records."""

from __future__ import annotations

import random
from collections.abc import Callable

from echo2.sim.dataplane import SimDataPlane
from echo2.sim.events import EventLoop


class Learner:
    def __init__(
        self,
        loop: EventLoop,
        data: SimDataPlane,
        *,
        steps: int,
        step_time_s: float,
        step_time_cv: float,
        rng: random.Random,
        publish: Callable[[int], None],
    ) -> None:
        self.loop, self.data, self.steps = loop, data, steps
        self.step_time_s, self.step_time_cv, self.rng = step_time_s, step_time_cv, rng
        self.publish_version = publish
        self.on_step: Callable[[float], None] = lambda train_s: None
        """A step was trained in `train_s` (what the learner reports to the coordinator)."""
        self.step = 0
        self.waiting_since_s: float | None = None
        self.busy_s: list[float] = []
        self.wait_s: list[float] = []
        self.end_s = 0.0

    def start(self) -> None:
        self._publish(0)
        self._ask()

    def _publish(self, version: int) -> None:
        self.data.publish(version)
        self.publish_version(version)

    def _ask(self) -> None:
        self.waiting_since_s = self.loop.now_s
        self.try_take()

    def try_take(self) -> None:
        """Take the batch if it is ready (called on every submission while waiting)."""
        if self.waiting_since_s is None or self.data.take_batch(self.step, self.loop.now_s) is None:
            return
        self.wait_s.append(self.loop.now_s - self.waiting_since_s)
        self.waiting_since_s = None
        train_s = self._sample_step_s()
        self.busy_s.append(train_s)
        self.loop.after(train_s, self._stepped, train_s)

    def _sample_step_s(self) -> float:
        cv = self.step_time_cv
        if cv == 0:
            return self.step_time_s
        return self.step_time_s * self.rng.gammavariate(1.0 / cv**2, cv**2)

    def _stepped(self, train_s: float) -> None:
        self.on_step(train_s)
        self.data.core.step_time_s = train_s  # what the coordinator knows of the learner's pace
        self.step += 1
        self.end_s = self.loop.now_s
        if self.step >= self.steps:
            self.loop.stopped = True
            return
        self._publish(self.step)
        self._ask()

    def utilization(self, skip_first: bool = False) -> float:
        busy, wait = self.busy_s[skip_first:], self.wait_s[skip_first:]
        total = sum(busy) + sum(wait)
        return sum(busy) / total if total > 0 else 0.0
