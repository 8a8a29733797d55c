"""The run summary, computed from `metrics.jsonl` alone (so tests and humans read the same
numbers): accuracy before/after, learner utilization, staleness, drops, worker throughput and
weight publish-to-loaded latency."""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import quantiles
from typing import Any


def _of(records: list[dict], kind: str, role: str | None = None) -> list[dict]:
    return [r for r in records if r["kind"] == kind and (role is None or r["role"] == role)]


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "max": 0.0, "n": 0}
    if len(values) == 1:
        return {"p50": values[0], "p95": values[0], "max": values[0], "n": 1}
    cuts = quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94], "max": max(values), "n": len(values)}


def utilization(steps: list[dict]) -> float:
    """Share of the learner's step-loop time not spent waiting for data."""
    busy = sum(s["train_s"] + s["publish_s"] + s.get("checkpoint_s", 0.0) for s in steps)
    wait = sum(s["wait_s"] for s in steps)
    return busy / (busy + wait) if busy + wait > 0 else 0.0


def summarize(records: list[dict]) -> dict[str, Any]:
    # a resumed learner re-logs the steps it replays from its checkpoint: the last record wins
    steps = sorted({r["step"]: r for r in _of(records, "train_step", "learner")}.values(), key=lambda r: r["step"])
    evals = sorted(_of(records, "eval", "learner"), key=lambda r: r["step"])
    hist: Counter[int] = Counter()
    for s in steps:
        hist.update({int(k): v for k, v in s["staleness_hist"].items()})
    final = _of(records, "coordinator_final")
    counters = final[-1]["counters"] if final else {}
    workers = final[-1]["workers"] if final else {}
    return {
        "steps": len(steps),
        "accuracy_before": evals[0]["accuracy"] if evals else None,
        "accuracy_after": evals[-1]["accuracy"] if evals else None,
        "learner_utilization": utilization(steps),
        # the first step also waits for workers to load the model: report steady state apart
        "learner_utilization_steady": utilization(steps[1:]),
        "learner_wall_s": (steps[-1]["time"] - steps[0]["time"] + steps[0]["wait_s"]) if steps else 0.0,
        "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
        "max_staleness_trained": max(hist) if hist else None,
        "rollouts_dropped_stale": counters.get("dropped_stale", 0),
        "leases_requeued": counters.get("leases_expired", 0),
        "workers_lost": counters.get("workers_lost", 0),
        "tokens_per_s": {w: round(v["tokens_per_s"], 1) for w, v in sorted(workers.items())},
        "publish_to_loaded_s": _latency_by_worker(records),
        **_cost(final[-1].get("cost") if final else None, len(steps)),
        "activation_decisions": _decisions(records),
    }


def _decisions(records: list[dict]) -> list[dict]:
    """Activation changes while the learner trained (re-plans as workers leave at shutdown are
    not decisions about the run)."""
    done = [r["time"] for r in _of(records, "learner_done")]
    end = done[-1] if done else float("inf")
    start = min((r["time"] for r in records), default=0.0)
    return [
        {"t_s": round(r["time"] - start, 1), "active": r["active"],
         "reason": f"{r['trigger']}: {r['reason']}" if r.get("trigger") else r["reason"]}
        for r in _of(records, "activation") if r["time"] <= end and r.get("changed", True)
    ]


def _cost(cost: dict | None, steps: int) -> dict[str, Any]:
    if not cost:
        return {"cost_total": None, "cost_per_step": None, "cost_by_worker": {}}
    return {
        "cost_total": cost["cost_total"],
        "cost_learner": cost["cost_learner"],
        "cost_per_step": cost["cost_total"] / steps if steps else None,
        "cost_by_worker": {w: {"cost": v["cost"], "active_s": v["active_s"], "price_per_hour": v["price_per_hour"]}
                           for w, v in cost["workers"].items()},
    }


def _latency_by_worker(records: list[dict]) -> dict[str, dict[str, float]]:
    by_worker: dict[str, list[float]] = defaultdict(list)
    for r in _of(records, "weights_loaded"):
        by_worker[r["worker_id"]].append(r["publish_to_loaded_s"])
    return {w: percentiles(v) for w, v in sorted(by_worker.items())}
