"""One view of a running run, for the dashboard (`/dashboard/state.json`) and Prometheus
(`/metrics`): the coordinator's live state (`CoordinatorState.snapshot`) joined with the run's
history (`RunHistory`). Both read it at request time, so there is one source of truth and no
gauge to keep in step with the state.

Per-worker publish-to-loaded time and bytes relayed are what the worker's heartbeats say
(display only: nothing is decided on them); tokens/s, versions, leases and cost are the
coordinator's own."""

from __future__ import annotations

import math
import time
from typing import Any

from echo2.coordinator.history import RunHistory
from echo2.coordinator.state import CoordinatorState
from echo2.protocol.broadcast import ORIGIN_ID

MAX_WORKER_ROWS = 500
"""Workers listed (live ones first): a flood of registrations must not make every poll of the
dashboard megabytes long."""


def run_view(state: CoordinatorState, history: RunHistory) -> dict[str, Any]:
    snap = state.snapshot()
    workers = _worker_rows(snap)
    return _finite({
        "time": time.time(),
        "learner_step": snap["learner_step"],
        "version": snap["version"],
        "max_staleness": state.settings.max_staleness,
        "queued": snap["queued"],
        "leased": snap["leased"],
        "buffered": snap["buffered"],
        "counters": snap["counters"],
        "learner_utilization": history.learner_utilization(),
        "curves": {"reward": history.reward.shown(), "accuracy": history.accuracy.shown(),
                   "utilization": history.utilization.shown()},
        "staleness_hist": {str(k): v for k, v in sorted(history.staleness_trained.items())},
        "workers": workers[:MAX_WORKER_ROWS],
        "workers_total": len(workers),
        "workers_live": sum(1 for w in workers if w["alive"]),
        "workers_active": sum(1 for w in workers if w["status"] == "active"),
        # the controller's billing rule: a rented machine costs the same idle, a released one nothing
        "cost": {"per_hour": state.controller.price_per_hour_now(), "total": snap["cost"]["cost_total"]},
        "required_rps": snap["cost"]["required_rps"],
        "decisions": list(reversed(history.decisions)),
        "broadcast": _tree(state),
    })


def _worker_rows(snap: dict) -> list[dict[str, Any]]:
    bills = snap["cost"]["workers"]
    rows = []
    for worker_id, w in snap["workers"].items():
        bill = bills.get(worker_id, {})
        status = ("active" if w["active"] else "idle") if w["alive"] else \
            ("released" if bill.get("released") else "gone")
        rows.append({
            "worker_id": worker_id, "status": status, "alive": w["alive"], "version": w["version"],
            "leases": w["leases"], "rollouts": w["rollouts"], "tokens": w["tokens"],
            "tokens_per_s": w["tokens_per_s"], "rollouts_per_s": w["rollouts_per_s_measured"],
            "publish_to_loaded_s": w["publish_to_loaded_s_claimed"], "bytes_relayed": w["bytes_relayed_claimed"],
            "price_per_hour": w["price_per_hour"], "cost": bill.get("cost", 0.0),
        })
    rows.sort(key=lambda r: (not r["alive"], r["worker_id"]))
    return rows


def _tree(state: CoordinatorState) -> dict[str, Any] | None:
    """The current version's broadcast tree: who pulls from whom (each worker's first source),
    and whether it holds the version yet."""
    plan = state.dissemination.plan
    if plan is None:
        return None
    nodes = [{"id": ORIGIN_ID, "parent": None, "depth": 0, "holds": True, "relay": True}]
    for a in plan.assignments[:MAX_WORKER_ROWS]:
        record = state.workers.get(a.worker_id)
        nodes.append({"id": a.worker_id, "parent": a.sources[0].peer_id, "depth": a.depth,
                      "holds": record is not None and record.version >= plan.version,
                      "relay": bool(a.children) or (record is not None and bool(record.relay_address))})
    return {"version": plan.version, "mode": plan.mode, "nodes": nodes}


def _finite(value: Any) -> Any:
    """The view with every non-finite number as None: JSON has no Infinity (the required rate is
    infinite until the learner's step time is known)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
