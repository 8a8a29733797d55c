"""The run's history as the dashboard and `/metrics` show it, read from `<run_dir>/metrics.jsonl`.

The coordinator's live state (`CoordinatorState`) says where the run is now; how it got there
(reward and held-out accuracy per step, the learner's utilization, the staleness trained on,
the activation decisions) is in the run's metrics file: the learner writes its step and eval
records there, the coordinator its batch and activation records. Reading the file rather than
adding the learner's numbers to a wire message keeps one source for the dashboard, the
end-of-run summary and the tests (the same records, the same definitions, e.g. utilization as
in `report.summary`), survives a coordinator restart (the file is read from its start), and
includes the final evaluation, which no message follows. It needs the learner to write to the
coordinator's run dir, as `echo2 run` and the documented several-machine recipe do (learner
and coordinator share a machine); a learner elsewhere leaves the curves empty and everything
else live.

The file grows for the whole run, so it is read in bounded slices off the event loop, only the
kinds read here are parsed, and each curve keeps at most `MAX_POINTS` points (thinned evenly
as it grows)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter, deque
from pathlib import Path

from echo2.report.fleet_ledger import CachedLedger
from echo2.report.metrics import MetricsTail
from echo2.report.summary import utilization

log = logging.getLogger("echo2.coordinator")

HISTORY_KINDS = frozenset({"train_step", "eval", "checkpoint", "batch_assigned", "activation"})
MAX_POINTS = 1000
"""Points kept per curve: a browser draws 1,000 points at once with ease; a 100k-step run's
curve thinned to them keeps its shape."""
UTILIZATION_WINDOW_STEPS = 20
"""Learner utilization is reported over the last steps: recent enough to see a starved
learner, long enough that one checkpoint or slow batch does not swing it."""
DECISIONS_KEPT = 20
READ_SLICE_BYTES = 8 << 20
"""Bytes of the metrics file read per refresh: catching up on a long run's file after a
restart takes several refreshes instead of one read of every segment into memory."""
REFRESH_INTERVAL_S = 1.0
"""How often the file is read: the dashboard polls every 2 s."""


class Curve:
    """(step, value) points in step order, at most MAX_POINTS of them: past 2 x MAX_POINTS every
    other point goes and only every `stride`-th step is kept from then on; the newest point is
    always there."""

    def __init__(self) -> None:
        self.points: list[tuple[int, float]] = []
        self.stride = 1
        self.newest: tuple[int, float] | None = None

    def add(self, step: int, value: float) -> None:
        """A step again (a resumed learner re-logs the steps it replays) replaces what followed.
        A value that is not finite is left out (JSON has no NaN)."""
        if not math.isfinite(value):
            return
        if self.newest is not None and step <= self.newest[0]:
            self.points = [p for p in self.points if p[0] < step]
        self.newest = (step, value)
        if step % self.stride == 0:
            self.points.append((step, value))
        if len(self.points) > 2 * MAX_POINTS:
            self.stride *= 2
            self.points = [p for p in self.points if p[0] % self.stride == 0]

    def shown(self) -> list[tuple[int, float]]:
        """The kept points and the newest one."""
        if self.newest is None or (self.points and self.points[-1] == self.newest):
            return list(self.points)
        return [*self.points, self.newest]


class RunHistory:
    def __init__(self, metrics_path: Path | None) -> None:
        self.tail = MetricsTail(metrics_path, HISTORY_KINDS, READ_SLICE_BYTES) if metrics_path else None
        self.reward, self.accuracy, self.utilization = Curve(), Curve(), Curve()
        self.staleness_trained: Counter[int] = Counter()
        """Groups per staleness (step - version) over the batches assigned."""
        self.token_staleness_trained: Counter[int] = Counter()
        """Trained tokens per staleness (step - the version that sampled each), as the learner
        counted them; a generation that straddled versions is younger than its group's oldest."""
        self.tokens_masked_stale = 0
        """Tokens the learner masked out of the loss as older than S."""
        self.decisions: deque[dict] = deque(maxlen=DECISIONS_KEPT)
        self.step_busy_s: dict[int, float] = {}
        self.recent_steps: dict[int, dict] = {}
        """The last UTILIZATION_WINDOW_STEPS train_step records, by step."""
        self.ledger = CachedLedger(metrics_path.parent) if metrics_path else None
        self.fleet_bill: dict = {}
        """What the machines a remote provider rented have billed (its ledger, read with the metrics)."""

    def refresh(self) -> list[dict]:
        """Read what the file gained (blocking I/O: call off the event loop); `apply` the result."""
        if self.ledger is not None:
            self.fleet_bill = self.ledger.bill()
        return self.tail.read_new() if self.tail is not None else []

    async def follow(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.apply(await asyncio.to_thread(self.refresh))
            except (OSError, ValueError) as exc:  # a torn or unreadable file: try again next time
                log.warning("dashboard history: reading %s failed (%s); retrying", self.tail.path, exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=REFRESH_INTERVAL_S)
            except TimeoutError:
                pass

    def apply(self, records: list[dict]) -> None:
        for record in records:
            try:
                self._apply(record)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # a record of another release's shape must not stop the dashboard's history
                log.warning("dashboard history: skipped a %s record it cannot read (%r)", record.get("kind"), exc)

    def _apply(self, record: dict) -> None:
        kind, role = record.get("kind"), record.get("role")
        if role == "learner" and kind == "train_step":
            self._train_step(record)
        elif role in ("learner", "coordinator") and kind == "eval":  # the coordinator's: evaluation leases
            self.accuracy.add(int(record["step"]), float(record["accuracy"]))
        elif role == "learner" and kind == "checkpoint":  # busy time of the step that wrote it
            step = int(record["step"]) - 1
            if step in self.step_busy_s:
                self.step_busy_s[step] += float(record["checkpoint_s"])
        elif role == "coordinator" and kind == "batch_assigned":
            self.staleness_trained.update({int(k): int(v) for k, v in record["staleness_hist"].items()})
        elif role == "coordinator" and kind == "activation":
            self.decisions.append({key: record.get(key) for key in
                                   ("time", "active", "reason", "trigger", "changed", "required_rps")})

    def _train_step(self, record: dict) -> None:
        step = int(record["step"])
        self.reward.add(step, float(record["reward_mean"]))
        self.token_staleness_trained.update({int(k): int(v) for k, v in record.get("token_staleness_hist", {}).items()})
        self.tokens_masked_stale += int(record.get("tokens_masked_stale", 0))
        # busy and wait as report.summary counts them: training, publishing and the checkpoint
        self.step_busy_s[step] = float(record["train_s"]) + float(record["publish_s"])
        self.recent_steps[step] = {"step": step, "wait_s": float(record["wait_s"])}
        for old in [s for s in self.step_busy_s if s <= step - UTILIZATION_WINDOW_STEPS or s > step]:
            del self.step_busy_s[old], self.recent_steps[old]
        utilization = self.learner_utilization()
        if utilization is not None:
            self.utilization.add(step, utilization)

    def learner_utilization(self) -> float | None:
        """Share of the last UTILIZATION_WINDOW_STEPS steps' loop time not spent waiting for data
        (the summary's definition); None before the first step."""
        return utilization(list(self.recent_steps.values()), self.step_busy_s) if self.recent_steps else None
