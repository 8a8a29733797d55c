"""What the load benchmark measures, in forms that merge across processes: latency histograms on
a 1% log scale (a percentile of the merged histogram is within 1% of the exact one, and a client
process's histograms are a few kB however many requests it made), outcome counters, and a
`Recorder` that files every observation under the phase of the run it started in. Also the CPU
time of a process tree read from /proc, and the event-loop lag ticker."""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections import Counter
from pathlib import Path

_FLOOR_MS = 0.01
_STEP = math.log(1.01)
MAX_REASONS = 200
"""Distinct refusal texts kept per process (the rest are counted as 'other'): bounded output."""


class Histogram:
    """Durations in ms, bucketed on a 1% log scale from 0.01 ms."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.n = 0
        self.max_ms = 0.0
        self.sum_ms = 0.0

    def add(self, ms: float) -> None:
        ms = max(ms, 0.0)
        self.counts[int(math.log(max(ms, _FLOOR_MS) / _FLOOR_MS) / _STEP)] += 1
        self.n += 1
        self.max_ms = max(self.max_ms, ms)
        self.sum_ms += ms

    def merge(self, other: Histogram) -> None:
        self.counts.update(other.counts)
        self.n += other.n
        self.max_ms = max(self.max_ms, other.max_ms)
        self.sum_ms += other.sum_ms

    def percentile(self, q: float) -> float | None:
        """The q-quantile (0..1) in ms: the middle of the bucket holding it (None when empty)."""
        if self.n == 0:
            return None
        rank, seen = q * (self.n - 1), 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen > rank:
                return min(self.max_ms, _FLOOR_MS * math.exp((bucket + 0.5) * _STEP))
        return self.max_ms

    def summary(self) -> dict:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 2)

        return {"count": self.n, "p50_ms": r(self.percentile(0.5)), "p99_ms": r(self.percentile(0.99)),
                "max_ms": r(self.max_ms) if self.n else None, "mean_ms": r(self.sum_ms / self.n) if self.n else None}

    def to_dict(self) -> dict:
        return {"counts": {str(k): v for k, v in self.counts.items()}, "n": self.n, "max_ms": self.max_ms,
                "sum_ms": self.sum_ms}

    @classmethod
    def from_dict(cls, data: dict) -> Histogram:
        out = cls()
        out.counts = Counter({int(k): v for k, v in data["counts"].items()})
        out.n, out.max_ms, out.sum_ms = data["n"], data["max_ms"], data["sum_ms"]
        return out


def reason_key(message: str) -> str:
    """A refusal's text with its numbers and ids blanked, so alike refusals count together."""
    text = re.sub(r"'[^']*'", "'…'", message)
    return re.sub(r"\d+", "#", text)[:160]


class Recorder:
    """Observations filed by phase: the phase a request *started* in (by wall clock; the phases
    are `(name, starts_at)` pairs, the first also covering anything earlier)."""

    def __init__(self, phases: list[tuple[str, float]]) -> None:
        self.phases = sorted(phases, key=lambda p: p[1])
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.outcomes: Counter[tuple[str, str, str]] = Counter()
        self.reasons: Counter[tuple[str, str, str]] = Counter()
        self.counts: Counter[tuple[str, str]] = Counter()

    def phase(self, at: float | None = None) -> str:
        at = time.time() if at is None else at
        name = self.phases[0][0]
        for candidate, starts_at in self.phases:
            if at >= starts_at:
                name = candidate
        return name

    def took(self, kind: str, started_at: float, ms: float) -> None:
        self.latency.setdefault((self.phase(started_at), kind), Histogram()).add(ms)

    def outcome(self, kind: str, outcome: str, started_at: float, reason: str = "") -> None:
        self.outcomes[(self.phase(started_at), kind, outcome)] += 1
        if reason:
            key = reason_key(reason)
            if len(self.reasons) >= MAX_REASONS and (kind, outcome, key) not in self.reasons:
                key = "other"
            self.reasons[(kind, outcome, key)] += 1

    def count(self, what: str, n: int = 1, at: float | None = None) -> None:
        self.counts[(self.phase(at), what)] += n

    def to_dict(self) -> dict:
        return {
            "latency": [[p, k, h.to_dict()] for (p, k), h in self.latency.items()],
            "outcomes": [[p, k, o, n] for (p, k, o), n in self.outcomes.items()],
            "reasons": [[k, o, r, n] for (k, o, r), n in self.reasons.items()],
            "counts": [[p, w, n] for (p, w), n in self.counts.items()],
        }


class Merged:
    """Several processes' `Recorder.to_dict()`s added together."""

    def __init__(self) -> None:
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.outcomes: Counter[tuple[str, str, str]] = Counter()
        self.reasons: Counter[tuple[str, str, str]] = Counter()
        self.counts: Counter[tuple[str, str]] = Counter()

    def add(self, data: dict) -> None:
        for phase, kind, hist in data["latency"]:
            self.latency.setdefault((phase, kind), Histogram()).merge(Histogram.from_dict(hist))
        self.outcomes.update({(p, k, o): n for p, k, o, n in data["outcomes"]})
        self.reasons.update({(k, o, r): n for k, o, r, n in data["reasons"]})
        self.counts.update({(p, w): n for p, w, n in data["counts"]})

    def histogram(self, kind: str, phases: tuple[str, ...]) -> Histogram:
        out = Histogram()
        for phase in phases:
            if (phase, kind) in self.latency:
                out.merge(self.latency[(phase, kind)])
        return out

    def count(self, what: str, phases: tuple[str, ...]) -> int:
        return sum(self.counts.get((p, what), 0) for p in phases)


async def lag_ticker(recorder: Recorder, stop: asyncio.Event, interval_s: float = 0.05) -> None:
    """How late this process's event loop wakes a sleeper: the overshoot of each `interval_s`
    sleep, in ms, as kind 'loop_lag' (a client whose loop lags also delays what it measures)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        asked = loop.time()
        await asyncio.sleep(interval_s)
        recorder.took("loop_lag", time.time(), (loop.time() - asked - interval_s) * 1000.0)


# ---- CPU from /proc ----
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from the 3rd (state) on


def children_of(pid: int) -> list[int]:
    """Live child pids of `pid` (scanning /proc: no CONFIG_PROC_CHILDREN needed)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of `pid`, its reaped children (cutime + cstime) and its live
    descendants: the whole cost of a process and the helpers it started."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    own = sum(int(fields[i]) for i in (11, 12, 13, 14)) * _TICK_S  # utime stime cutime cstime
    return own + sum(tree_cpu_s(child) for child in children_of(pid))


def cores_busy_s() -> dict[str, float]:
    """Busy seconds of each core since boot (/proc/stat: all but idle and iowait), keyed
    "core<N>", and the part of it spent in interrupts ("core<N>_irq": irq and softirq, where
    the kernel moves loopback packets, counted against no process): with the processes' own
    CPU, whether something else shared a core."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *ticks = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(t) for t in ticks]
            out[f"core{name[3:]}"] = (sum(values[:8]) - values[3] - values[4]) * _TICK_S
            out[f"core{name[3:]}_irq"] = (values[5] + values[6]) * _TICK_S
    return out
