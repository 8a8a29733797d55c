"""The fleet ledger: every machine a provider acquires, written to the run dir before it is
started, and its release after. Whatever the ledger holds and has not released is what the run
may still be paying for: on a clean exit, Ctrl-C or a crash the launcher releases it, and after
a SIGKILL `echo2 fleet down --all --run-dir R` does, from this file alone.

One JSON object a line (`fleet_ledger.jsonl`), appended and flushed to disk before the action it
records goes ahead, so a crash between the two leaves an entry to release, never a machine
nobody knows of. Billing reads the same lines: a machine bills from its acquire to its release,
boot included, as clouds bill it."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

LEDGER_NAME = "fleet_ledger.jsonl"

Event = Literal["acquiring", "started", "released", "lost"]


@dataclass
class Holding:
    """One machine (or worker slot) the ledger holds: the acquire record, merged with what came after."""

    worker_id: str
    provider: str
    machine: str
    """The host (ssh) or cluster name (skypilot) the worker runs on."""
    worker_class: str
    price_per_hour: float
    acquired_at: float
    """Wall clock (s) of the acquire: billing starts here, boot included."""
    details: dict = field(default_factory=dict)
    """What the start recorded: the worker's PID on its host, a launch's request id."""
    released_at: float | None = None

    def billed_s(self, now: float) -> float:
        return max(0.0, (self.released_at if self.released_at is not None else now) - self.acquired_at)

    def billed_usd(self, now: float) -> float:
        return self.billed_s(now) * self.price_per_hour / 3600.0


class FleetLedger:
    """Append-only record of acquires and releases in the run dir; `holdings()` replays it."""

    def __init__(self, run_path: Path) -> None:
        self.path = Path(run_path) / LEDGER_NAME

    def acquiring(self, worker_id: str, *, provider: str, machine: str, worker_class: str,
                  price_per_hour: float, **details: object) -> None:
        """Recorded before the machine is asked for: from here on it may bill. `details`: what a
        release needs should the start's own record never be written (a host's address)."""
        self._append({"event": "acquiring", "worker_id": worker_id, "provider": provider, "machine": machine,
                      "worker_class": worker_class, "price_per_hour": price_per_hour, "details": details})

    def started(self, worker_id: str, **details: object) -> None:
        """The worker is running; `details` is what its release needs (a PID, a cluster name)."""
        self._append({"event": "started", "worker_id": worker_id, "details": details})

    def released(self, worker_id: str, *, reason: str) -> None:
        """The machine is handed back and bills no more (`reason`: idle, lost, shutdown...)."""
        self._append({"event": "released", "worker_id": worker_id, "reason": reason})

    def holdings(self) -> dict[str, Holding]:
        """Every worker ever acquired (the latest acquire of each), released or not."""
        held: dict[str, Holding] = {}
        for record in self._records():
            worker_id = record["worker_id"]
            if record["event"] == "acquiring":
                held[worker_id] = Holding(worker_id, record["provider"], record["machine"], record["worker_class"],
                                          float(record["price_per_hour"]), record["time"],
                                          dict(record.get("details", {})))
            elif worker_id in held and record["event"] == "started":
                held[worker_id].details.update(record["details"])
            elif worker_id in held and record["event"] == "released":
                held[worker_id].released_at = record["time"]
        return held

    def held(self) -> dict[str, Holding]:
        """The machines acquired and not released: what the run may still be paying for."""
        return {w: h for w, h in self.holdings().items() if h.released_at is None}

    def billed_usd(self, now: float | None = None) -> float:
        """Every acquire's billed dollars, from acquire to release (or `now`)."""
        now = time.time() if now is None else now
        return sum(h.billed_usd(now) for h in self.spans())

    def bill(self, now: float | None = None) -> dict:
        """What the fleet billed: dollars and seconds in all and by worker (every acquire, boot
        included), and how many acquires; empty when nothing was ever acquired."""
        now = time.time() if now is None else now
        by_worker: dict[str, dict] = {}
        for span in self.spans():
            entry = by_worker.setdefault(span.worker_id, {"worker_class": span.worker_class, "machine": span.machine,
                                                          "billed_s": 0.0, "billed_usd": 0.0, "acquires": 0})
            entry["billed_s"] += span.billed_s(now)
            entry["billed_usd"] += span.billed_usd(now)
            entry["acquires"] += 1
        if not by_worker:
            return {}
        return {"billed_usd": sum(e["billed_usd"] for e in by_worker.values()),
                "billed_s": sum(e["billed_s"] for e in by_worker.values()),
                "held_at_end": sorted(self.held()), "billed_by_worker": dict(sorted(by_worker.items()))}

    def spans(self) -> list[Holding]:
        """Each acquire separately (a worker released and acquired again bills twice)."""
        spans: list[Holding] = []
        for record in self._records():
            if record["event"] == "acquiring":
                spans.append(Holding(record["worker_id"], record["provider"], record["machine"],
                                     record["worker_class"], float(record["price_per_hour"]), record["time"]))
            elif record["event"] == "released":
                for span in reversed(spans):
                    if span.worker_id == record["worker_id"] and span.released_at is None:
                        span.released_at = record["time"]
                        break
        return spans

    def _append(self, record: dict) -> None:
        line = json.dumps({"time": time.time(), **record}) + "\n"
        with open(self.path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())  # before the action it records: a crash must not lose it

    def _records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a crash mid-write: the rest still counts
                continue
        return records


class CachedLedger(FleetLedger):
    """A ledger read again only when its file changed: the dashboard and /metrics ask every
    second, and a large fleet's ledger holds thousands of lines."""

    def __init__(self, run_path: Path) -> None:
        super().__init__(run_path)
        self.seen: tuple[int, int] | None = None
        self.cached: list[dict] = []

    def _records(self) -> list[dict]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        if (stat.st_size, stat.st_mtime_ns) != self.seen:
            self.seen, self.cached = (stat.st_size, stat.st_mtime_ns), super()._records()
        return self.cached
