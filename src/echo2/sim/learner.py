"""The simulated learner: ask for the batch of step t, wait until the data plane has P admissible
groups, train for one step time, publish version t+1, repeat. Utilization is busy / (busy +
wait), exactly as the run summary computes it from the real learner's `train_step` records."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence

from echo2.config.sim import ProfileSegment
from echo2.sim.dataplane import SimDataPlane
from echo2.sim.events import EventLoop


def profile_at(profile: Sequence[ProfileSegment], step: int, step_time_s: float, uninformative_share: float,
               ) -> tuple[float, float]:
    """T_train and d at learner `step`: the last segment starting at or before it, its missing
    fields (and any step before the first segment) the workload's `step_time_s` and
    `uninformative_share`."""
    at = bisect.bisect_right([segment.from_step for segment in profile], step) - 1
    if at < 0:
        return step_time_s, uninformative_share
    segment = profile[at]
    return (step_time_s if segment.step_time_s is None else segment.step_time_s,
            uninformative_share if segment.uninformative_share is None else segment.uninformative_share)


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
        profile: Sequence[ProfileSegment] = (),
    ) -> None:
        self.loop, self.data, self.steps = loop, data, steps
        self.step_time_s, self.step_time_cv, self.rng = step_time_s, step_time_cv, rng
        self.profile = list(profile)
        self.uninformative_share = data.uninformative_share
        """The workload's d, which the profile's segments replace from their steps on."""
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
        if self.profile:  # groups arriving while step `version` waits for its batch are drawn at its d
            self.data.uninformative_share = self._at(version)[1]
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

    def _at(self, step: int) -> tuple[float, float]:
        return profile_at(self.profile, step, self.step_time_s, self.uninformative_share)

    def _sample_step_s(self) -> float:
        cv, mean_s = self.step_time_cv, self._at(self.step)[0]
        if cv == 0:
            return mean_s
        return mean_s * self.rng.gammavariate(1.0 / cv**2, cv**2)

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
