"""Metric sinks: TensorBoard and W&B fed from the records every role writes to metrics.jsonl
(the one metrics path; a sink only mirrors it). A small ABC and the feeder that hands records to
the sinks; sink_factory.py builds them from the run's `[report]` settings; which scalars is
echo2.report.scalars' table.

One process feeds them, the one that reads the whole file: `echo2 run` (its launcher tails
metrics.jsonl for the live view anyway), or `echo2 report --run-dir DIR --follow` beside roles
started by hand. Each start replays the file from the beginning into a fresh TensorBoard log and
a new W&B run, so a resumed run's charts hold all of it once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from echo2.report.scalars import scalars_of

SAMPLE_COLUMNS = ("step", "prompt", "completion", "reward", "worker_id", "version")


class Sink(ABC):
    name: str

    @abstractmethod
    def scalars(self, values: dict[str, float], step: int, time_s: float) -> None:
        """Values of one record at learner step `step`, wall-clock `time_s` (Unix seconds)."""

    @abstractmethod
    def samples(self, rows: list[dict], step: int, time_s: float) -> None:
        """Sample completions (dicts with SAMPLE_COLUMNS but `step`) logged at `step`."""

    @abstractmethod
    def close(self) -> None:
        """Flush everything to disk (and end the W&B run)."""


class SinkFeeder:
    """Hands each record to every sink. A sink that fails is dropped with one warning: training
    goes on, and metrics.jsonl still holds everything (`echo2 report --follow` replays it)."""

    def __init__(self, sinks: list[Sink], warn: Callable[[str], None] = print) -> None:
        self.sinks, self.warn = list(sinks), warn
        self.step = 0  # newest learner step seen: the step of records that carry none
        self.unreadable = 0

    def feed(self, records: Iterable[dict]) -> None:
        for record in records:
            if not self.sinks:
                return
            try:
                self._one(record)
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                self.unreadable += 1  # a record of another echo2 release; the rest still counts
                if self.unreadable == 1:
                    self.warn(f"metric sinks: skipped a {record.get('kind')!r} record they cannot read")

    def close(self) -> None:
        for sink in list(self.sinks):
            self._call(sink, sink.close)
        self.sinks = []

    def _one(self, record: dict) -> None:
        if record.get("role") == "learner" and record.get("kind") == "samples":
            step = int(record["step"]) + 1  # logged with the train_step of the same step
            rows = [{c: row[c] for c in SAMPLE_COLUMNS[1:]} for row in record["samples"]]
            self._each("samples", rows, step, record["time"])
            return
        mapped = scalars_of(record)
        if mapped is None:
            return
        step, values = mapped
        step = self.step if step is None else int(step)
        self.step = max(self.step, step)
        if values:
            self._each("scalars", values, step, record["time"])

    def _each(self, method: str, *args: object) -> None:
        for sink in list(self.sinks):
            self._call(sink, getattr(sink, method), *args)

    def _call(self, sink: Sink, call: Callable[..., None], *args: object) -> None:
        try:
            call(*args)
        except Exception as exc:  # whatever a sink's library raises: drop that sink, keep training
            self.warn(f"metric sink {sink.name} failed and is off for the rest of this run: {exc!r}")
            if sink in self.sinks:
                self.sinks.remove(sink)
