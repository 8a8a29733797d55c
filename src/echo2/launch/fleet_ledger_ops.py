"""What `echo2 fleet` does with a run dir's ledger alone (no launcher needed, none running after a
SIGKILL): show what is held and what it has billed, and release held machines by the provider
that acquired them (ssh: the worker stopped by its PID and checked gone; skypilot: its cluster
downed)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from echo2.report.fleet_ledger import FleetLedger, Holding
from echo2.report.metrics import MetricsTail

STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class FleetRow:
    worker_id: str
    provider: str
    machine: str
    worker_class: str
    price_per_hour: float
    billed_s: float
    billed_usd: float
    state: str
    """"booting (N s)", "running", "released (reason)"."""


def fleet_rows(run_path: Path, now: float | None = None) -> list[FleetRow]:
    """One row per worker the ledger ever acquired (its latest acquire), with its billed time
    over every acquire."""
    now = time.time() if now is None else now
    ledger = FleetLedger(run_path)
    registered = _registered_at(run_path)
    billed: dict[str, tuple[float, float]] = {}
    for span in ledger.spans():
        seconds, usd = billed.get(span.worker_id, (0.0, 0.0))
        billed[span.worker_id] = (seconds + span.billed_s(now), usd + span.billed_usd(now))
    rows = []
    for worker_id, holding in sorted(ledger.holdings().items()):
        seconds, usd = billed.get(worker_id, (0.0, 0.0))
        rows.append(FleetRow(worker_id, holding.provider, holding.machine, holding.worker_class or "-",
                             holding.price_per_hour, seconds, usd,
                             _state(holding, registered.get(worker_id, 0.0), now)))
    return rows


def _state(holding: Holding, registered_at: float, now: float) -> str:
    if holding.released_at is not None:
        return "released"
    if registered_at >= holding.acquired_at:
        return "running"
    step = "starting" if "pid" in holding.details or "request_id" in holding.details else "booting"
    return f"{step} ({now - holding.acquired_at:.0f} s)"


def _registered_at(run_path: Path) -> dict[str, float]:
    """Worker id -> when the coordinator last recorded its registration."""
    path = run_path / "metrics.jsonl"
    if not path.is_file():
        return {}
    seen: dict[str, float] = {}
    for record in MetricsTail(path).read_new():
        if record.get("kind") == "worker_registered" and record.get("role") == "coordinator":
            seen[record["worker_id"]] = record["time"]
    return seen


def release_held(run_path: Path, worker_ids: list[str] | None, *, reason: str = "fleet_down") -> list[str]:
    """Release the held machines of `worker_ids` (None: every one); returns one line for each that
    could not be released (still held: try again). Unknown ids are an error before anything stops."""
    ledger = FleetLedger(run_path)
    held = ledger.held()
    if worker_ids is not None:
        unknown = [w for w in worker_ids if w not in held]
        if unknown:
            raise ValueError(f"not held in {ledger.path}: {', '.join(unknown)} (held: "
                             f"{', '.join(sorted(held)) or 'nothing'}); `echo2 fleet status` lists them")
        held = {w: held[w] for w in worker_ids}
    failures = []
    for worker_id, holding in sorted(held.items()):
        error = _release_one(holding)
        if error is None:
            ledger.released(worker_id, reason=reason)
        else:
            failures.append(error)
    return failures


def _release_one(holding: Holding) -> str | None:
    if holding.provider == "ssh":
        from echo2.launch.ssh_fleet import stop_holding

        return stop_holding(holding, STOP_GRACE_S)
    if holding.provider == "skypilot":
        return _down_cluster(holding)
    return f"{holding.worker_id}: provider {holding.provider!r} is not one `echo2 fleet` can release"


def _down_cluster(holding: Holding) -> str | None:
    try:
        from echo2.launch.sky_api import ClusterGone, SkySdk, SkyTimeouts
    except ImportError as exc:
        return (f"{holding.worker_id}: SkyPilot is not installed here ({exc}): pip install 'echo2[skypilot]', or "
                f"sky down {holding.machine}")
    sky = SkySdk()
    try:
        sky.get(sky.down(holding.machine), SkyTimeouts().down_s)
    except ClusterGone:
        return None  # nothing there to pay for
    except Exception as exc:  # still billing, maybe: the line says what to run by hand
        return f"{holding.worker_id}: sky down {holding.machine} failed ({type(exc).__name__}: {exc})"
    return None
