"""A load run's JSON section, from what its processes left: the clients' and the learner's
merged Recorders, the learner's step log, the coordinator's metrics.jsonl records and the CPU
samples the harness took at each phase boundary. Also the mass-join recovery time."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from load.stats import Histogram, Merged

WORKER_KINDS = ("broadcast_config", "register", "heartbeat", "news_line", "version_news", "lease", "lease_served",
                "rollout", "leave")
LEARNER_KINDS = ("batch", "publish")
NOT_ERRORS = ("ok", "cut_short", "deferred")
"""Outcomes that are no failure: answered, given up by the worker itself, or a registration the
coordinator deferred with a Retry-After it then kept (counted apart: `deferred_section`)."""
WORKER_COUNTS = ("registered", "join_failed", "reregistered", "reregister_failed", "lease_granted", "lease_refused",
                 "rollout_accepted", "rollout_uninformative", "rollout_dropped",
                 "rollout_refused", "evaluation_lease_unexpected", "bad_reply")


def latency_section(merged: Merged, kinds: tuple[str, ...], phases: tuple[str, ...]) -> dict:
    return {kind: merged.histogram(kind, phases).summary() for kind in kinds
            if merged.histogram(kind, phases).n or kind in ("heartbeat", "lease", "rollout")}


def errors_section(merged: Merged, phases: tuple[str, ...]) -> dict:
    """{kind: {outcome: count}} of the requests that failed (HTTP status, timeout, connection)."""
    out: dict[str, dict[str, int]] = {}
    for (phase, kind, outcome), n in sorted(merged.outcomes.items()):
        if phase in phases and outcome not in NOT_ERRORS:
            out.setdefault(kind, {})
            out[kind][outcome] = out[kind].get(outcome, 0) + n
    return out


def deferred_section(merged: Merged, phases: tuple[str, ...]) -> dict:
    """{kind: count} of requests a busy coordinator told to come back later (503 with
    Retry-After): the registration pace, not a failure; the worker waits and asks again."""
    out: Counter[str] = Counter()
    for (phase, kind, outcome), n in merged.outcomes.items():
        if phase in phases and outcome == "deferred":
            out[kind] += n
    return dict(sorted(out.items()))


def requests_section(merged: Merged, phases: tuple[str, ...]) -> dict:
    """Requests sent per kind, and those given up by the worker itself (a held heartbeat cut
    short by a finished fetch: the real worker does the same; not an error)."""
    sent: Counter[str] = Counter()
    cut: Counter[str] = Counter()
    for (phase, kind, outcome), n in merged.outcomes.items():
        if phase in phases:
            sent[kind] += n
            if outcome == "cut_short":
                cut[kind] += n
    return {"sent": dict(sorted(sent.items())), "cut_short": dict(sorted(cut.items()))}


def top_reasons(merged: Merged, limit: int = 12) -> list[dict]:
    """The most frequent refusal and failure texts (numbers blanked), all phases."""
    rows = [{"kind": k, "outcome": o, "reason": r, "count": n} for (k, o, r), n in merged.reasons.items()
            if o not in NOT_ERRORS]
    return sorted(rows, key=lambda row: -row["count"])[:limit]


def coordinator_records(run_dir: Path) -> list[dict]:
    from echo2.report.metrics import iter_metrics

    return [r for r in iter_metrics(run_dir / "metrics.jsonl") if r.get("role") == "coordinator"]


def coordinator_section(records: list[dict], window: tuple[float, float], whole: tuple[float, float]) -> dict:
    """Evictions, expired or returned leases, stalls and scoring cut-offs in the window (and over
    the whole run, joining and leaving included)."""
    def within(span: tuple[float, float]) -> list[dict]:
        return [r for r in records if span[0] <= r["time"] <= span[1]]

    def summary(rows: list[dict]) -> dict:
        stalls = [r["stall_s"] for r in rows if r["kind"] == "coordinator_stalled"]
        over = [r for r in rows if r["kind"] == "scoring_over_budget"]
        requeued = Counter(r["reason"] for r in rows if r["kind"] == "lease_requeued")
        return {"evictions": sum(1 for r in rows if r["kind"] == "worker_lost"),
                "leases_requeued": dict(sorted(requeued.items())),
                "leases_expired": requeued.get("lease_timeout", 0),
                "stalls": {"count": len(stalls), "max_s": max(stalls, default=0.0), "total_s": round(sum(stalls), 3)},
                "scoring_over_budget": len(over),
                "workers_refused_for_slow_scoring": len({r["worker_id"] for r in over if r.get("refused")}),
                "versions_published": sum(1 for r in rows if r["kind"] == "version_published"),
                "batches_assigned": sum(1 for r in rows if r["kind"] == "batch_assigned")}

    out = summary(within(window))
    out["whole_run"] = summary(within(whole))
    stats = [r for r in within(window) if r["kind"] == "coordinator_stats"]
    if stats:
        last = stats[-1]
        out["last_stats"] = {k: last.get(k) for k in ("workers_alive", "workers_active", "queued", "leased",
                                                      "buffered", "learner_step", "version")}
    return out


def learner_steps(steps_path: Path) -> list[float]:
    if not steps_path.is_file():
        return []
    return [json.loads(line)["time"] for line in steps_path.read_text().splitlines() if line.strip()]


def steps_per_min(step_times: list[float], window: tuple[float, float]) -> float:
    span_s = window[1] - window[0]
    return round(sum(1 for t in step_times if window[0] <= t <= window[1]) * 60.0 / span_s, 2) if span_s > 0 else 0.0


def cpu_section(samples: dict[str, dict[str, float]], names: list[str], window: tuple[str, str],
                span_s: float) -> dict:
    """CPU seconds per wall second of each process (tree: children included) between two
    boundaries' samples."""
    first, last = samples.get(window[0], {}), samples.get(window[1], {})
    return {name: round((last.get(name, 0.0) - first.get(name, 0.0)) / span_s, 3) for name in names
            if name in first and name in last and span_s > 0}


def lag_section(merged: Merged, phases: tuple[str, ...]) -> dict:
    hist: Histogram = merged.histogram("loop_lag", phases)
    summary = hist.summary()
    return {"p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"], "max_ms": summary["max_ms"],
            "ticks": summary["count"]}


def worker_counts(merged: Merged, phases: tuple[str, ...]) -> dict:
    return {what: merged.count(what, phases) for what in WORKER_COUNTS if merged.count(what, phases)}


def recovery_s(step_times: list[float], joined_at: float, end: float, *, before_per_min: float,
               window_s: float, tolerance: float = 0.05) -> tuple[float | None, float | None]:
    """Seconds from a mass join until the learner is back at full pace for good: the earliest
    time t (on a 1 s grid, from the join) after which every trailing `window_s` window until
    `end` has steps/min within `tolerance` of `before_per_min` (a window may reach back before
    the join: an unharmed pace recovers at 0 s). None if it never is. Also the slowest trailing
    window after the join, in steps/min."""
    if before_per_min <= 0:
        return None, None
    grid = [joined_at + i for i in range(int(end - joined_at) + 1)]
    rates = [sum(1 for s in step_times if t - window_s < s <= t) * 60.0 / window_s for t in grid]
    floor = (1.0 - tolerance) * before_per_min
    recovered = None
    for t, rate in zip(reversed(grid), reversed(rates), strict=True):
        if rate < floor:
            break
        recovered = t
    return (None if recovered is None else round(recovered - joined_at, 1)), (round(min(rates), 2) if rates else None)
