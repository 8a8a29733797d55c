"""Views of a running run. `snapshot` is the coordinator's live state (`GET /v1/state`, the
run's last `coordinator_final` record) and `stats_event` its gauges once per control period;
`run_view`, for the dashboard (`/dashboard/state.json`) and Prometheus (`/metrics`), joins
the snapshot with the run's history (`RunHistory`). Both read it at request time, so there is one source of truth and no
gauge to keep in step with the state.

Per-worker publish-to-loaded time and bytes relayed are what the worker's heartbeats say
(display only: nothing is decided on them); tokens/s, versions, leases and cost are the
coordinator's own."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from echo2.coordinator.http.history import RunHistory
from echo2.coordinator.parts.registry import WorkerRecord
from echo2.coordinator.records.events import CoordinatorStats
from echo2.protocol.broadcast import ORIGIN_ID

if TYPE_CHECKING:
    from echo2.coordinator.state import CoordinatorState

MAX_WORKER_ROWS = 500
"""Workers listed (live ones first): a flood of registrations must not make every poll of the
dashboard megabytes long."""


def snapshot(state: CoordinatorState) -> dict[str, Any]:
    controller = state.controller
    controller.account(state.clock())  # bill up to now, not to the last control tick
    return {
        "learner_step": state.groups.learner_step,
        "version": state.versions.current,
        "queued": len(state.leases_book.queue),
        "leased": len(state.leases_book.leases),
        "buffered": len(state.groups.buffer),
        "counters": asdict(state.counters),
        "cost": controller.snapshot(),
        "audit": state.audit.snapshot(),
        "evaluations": state.evaluation.snapshot() if state.evaluation is not None else None,
        "workers": {w.worker_id: _worker_state(state, w) for w in state.registry.workers.values()},
    }


def _worker_state(state: CoordinatorState, w: WorkerRecord) -> dict[str, Any]:
    busy_s = w.measured_busy_s(state.clock())
    return {
        "version": w.version,
        "alive": w.alive,
        "active": state.controller.is_active(w.worker_id),
        "price_per_hour": w.price_per_hour,
        "leases": w.leases_held,
        "rollouts": w.rollouts,
        "tokens": w.tokens,
        "tokens_per_s": w.tokens / w.gen_time_s if w.gen_time_s > 0 else 0.0,
        "rollouts_per_s_measured": w.rollouts / busy_s if busy_s > 0 else None,
        "rollouts_per_s_claimed": w.claimed_rollouts / w.claimed_busy_s if w.claimed_busy_s > 0 else None,
        "bytes_relayed_claimed": w.claimed_bytes_relayed,
        "publish_to_loaded_s_claimed": w.claimed_dissemination_s,
    }


def stats_event(state: CoordinatorState) -> CoordinatorStats:
    """The run's gauges right after a control decision (which billed up to now): queue depth,
    active workers, dollars spent so far (metric sinks, end-of-run plots)."""
    workers = state.registry.workers.values()
    return CoordinatorStats(
        learner_step=state.groups.learner_step, version=state.versions.current, queued=len(state.leases_book.queue),
        leased=len(state.leases_book.leases), buffered=len(state.groups.buffer),
        workers_alive=sum(1 for w in workers if w.alive),
        workers_active=sum(1 for w in workers if state.controller.is_active(w.worker_id)),
        cost_total=state.controller.total_cost(), price_per_hour=state.controller.price_per_hour_now(),
    )


def run_view(state: CoordinatorState, history: RunHistory) -> dict[str, Any]:
    snap = snapshot(state)
    workers = _worker_rows(snap)
    return _finite({
        "time": time.time(),
        "learner_step": snap["learner_step"],
        "version": snap["version"],
        "max_staleness": state.cfg.train.max_staleness,
        "queued": snap["queued"],
        "leased": snap["leased"],
        "buffered": snap["buffered"],
        "counters": snap["counters"],
        "uninformative_share": _share(snap["counters"]),
        "learner_utilization": history.learner_utilization(),
        "curves": {"reward": history.reward.shown(), "accuracy": history.accuracy.shown(),
                   "utilization": history.utilization.shown()},
        "staleness_hist": {str(k): v for k, v in sorted(history.staleness_trained.items())},
        "token_staleness_hist": {str(k): v for k, v in sorted(history.token_staleness_trained.items())},
        "tokens_masked_stale": history.tokens_masked_stale,
        "masked_token_share": _masked_share(history),
        "workers": workers[:MAX_WORKER_ROWS],
        "workers_total": len(workers),
        "workers_live": sum(1 for w in workers if w["alive"]),
        "workers_active": sum(1 for w in workers if w["status"] == "active"),
        # the controller's billing rule: a rented machine costs the same idle, a released one nothing
        "cost": {"per_hour": state.controller.price_per_hour_now(), "total": snap["cost"]["cost_total"]},
        "required_rps": snap["cost"]["required_rps"],
        # the machines a remote provider rented, from acquire to release, boot included
        "fleet_bill": {k: history.fleet_bill[k] for k in ("billed_usd", "billed_s", "held_at_end")
                       if k in history.fleet_bill},
        "decisions": list(reversed(history.decisions)),
        "broadcast": _tree(state),
    })


def _masked_share(history: RunHistory) -> float | None:
    """The model's tokens masked as older than S, as a share of those the learner was given."""
    given = history.tokens_masked_stale + sum(history.token_staleness_trained.values())
    return history.tokens_masked_stale / given if given else None


def _share(counters: dict[str, int]) -> float | None:
    """Scored groups dropped as uninformative, as a share (None before any was scored)."""
    return counters["dropped_uninformative"] / counters["scored"] if counters["scored"] else None


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
    plan = state.versions.dissemination.plan
    if plan is None:
        return None
    nodes = [{"id": ORIGIN_ID, "parent": None, "depth": 0, "holds": True, "relay": True}]
    for a in plan.assignments[:MAX_WORKER_ROWS]:
        record = state.registry.workers.get(a.worker_id)
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
