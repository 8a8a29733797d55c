"""Why a provisioning request is infeasible and what would fix it, in the user's terms
(config keys they can `--set`). Two failure modes: the staleness window cannot hide
dissemination + generation even for a single worker (overlap), or it can but the catalog's
admissible throughput cannot reach B / T_train (capacity, including NAT leaves without relays).
"""

from __future__ import annotations

import math

from echo2.config.catalog import PlanConfig
from echo2.planner import capacity
from echo2.planner.covering import covers
from echo2.planner.dissemination import BITS_PER_BYTE
from echo2.planner.fleet import (
    ClassPlan,
    cheapest_fleet,
    class_plans,
    fastest_fleet,
    staleness_warnings,
    with_staleness,
)

MAX_STALENESS_SEARCHED = 64
"""The fix search stops here: far past where GRPO stays stable (ECHO-2: S <= 6)."""


def diagnose(cfg: PlanConfig) -> tuple[list[str], list[str], tuple[str, ...]]:
    """(reasons, fixes, warnings) for a catalog on which no fleet keeps the learner busy."""
    rentable = [c for c in class_plans(cfg, 1) if c.available > 0]
    if not rentable:
        return ["the catalog has no workers (every count is 0)"], ["add workers: workers.NAME.count"], ()
    if not any(c.admissible_rps > 0 for c in rentable):
        reasons, fixes = _overlap(
            cfg, min(rentable, key=lambda c: (c.s_min, c.dissemination_s + c.late_s))
        )
    else:
        reasons, fixes = _capacity(cfg)
    smallest = smallest_feasible_staleness(cfg)
    if smallest is None:
        fixes.append(f"raising S alone cannot fix it (no S up to {MAX_STALENESS_SEARCHED} is feasible)")
        return reasons, fixes, ()
    fixes.insert(0, f"set workload.max_staleness={smallest} (the smallest S with a feasible plan)")
    return reasons, fixes, staleness_warnings(smallest)


def _overlap(cfg: PlanConfig, best: ClassPlan) -> tuple[list[str], list[str]]:
    work = cfg.workload
    percentile = round(100 * cfg.plan.latency_percentile)
    reason = (
        f"S={work.max_staleness} cannot hide {best.dissemination_s:.0f} s of dissemination and "
        f"{best.tail_s:.0f} s of wait and generation (p{percentile}; T_gen {best.generation_s:.0f} s)"
        + (f"; {best.swapped_tail_s:.0f} s with segment swaps (T_seg + wait + (1 - f) of the generation)"
           if best.swapped_tail_s is not None else "")
        + f" with a {work.step_time_s:.0f} s learner step: S_min={best.s_min} (fastest class: {best.name})"
    )
    fixes = []
    if work.max_staleness > 0:  # the tail holds up to one step of lease spread: a lower bound
        step_s = (best.dissemination_s + best.late_s) / work.max_staleness
        fixes.append(f"a learner step of at least {math.ceil(step_s)} s (a larger batch per step)")
    budget_s = work.max_staleness * work.step_time_s - best.late_s - work.load_time_s
    if budget_s > 0:
        gbit = cfg.workload.snapshot_bytes * BITS_PER_BYTE / budget_s / 1e9
        fixes.append(
            f"move {cfg.workload.snapshot_bytes / 1e9:.1f} GB per version in {budget_s:.0f} s: "
            f"about {gbit:.2f} Gbit/s per worker and learner uplink, or smaller (delta) updates"
        )
    else:
        fixes.append("shorter generations: the generation tail and load_time_s alone fill the window")
    return [reason], fixes


def _capacity(cfg: PlanConfig) -> tuple[list[str], list[str]]:
    base = capacity.base_throughput_rps(cfg.workload.batch_rollouts, cfg.workload.step_time_s,
                                        uninformative_share=cfg.workload.uninformative_share)
    counts = fastest_fleet(cfg)
    n = sum(counts.values())
    classes = class_plans(cfg, n)
    peak = sum(c.admissible_rps * counts.get(c.name, 0) for c in classes)
    if covers(peak, base):
        reachable = sum(w.count for w in cfg.workers.values() if w.reachable)
        reason = (
            f"with topology={cfg.broadcast.topology}, {reachable} reachable workers cannot relay "
            f"weights to enough workers behind NAT (they can only be leaves)"
        )
        if cfg.broadcast.topology == "chain":
            return [reason], [
                'set broadcast.topology="tree" (more leaf slots per relay), or add reachable workers'
            ]
        return [reason], [
            "add reachable workers, raise broadcast.fanout, or use broadcast.topology=one_to_many"
        ]
    reason = (
        f"the catalog cannot feed the learner: at most {peak:.3g} admissible rollouts/s "
        f"(with {n} workers), B/T_train = {base:.3g} needed"
    )
    outside = [c.name for c in classes if c.available and c.admissible_rps == 0]
    if outside:
        reason += f"; {', '.join(outside)} deliver rollouts staler than S"
    return [reason], _more_workers(classes, base - peak)


def _more_workers(classes: list[ClassPlan], deficit_rps: float) -> list[str]:
    useful = [c for c in classes if c.admissible_rps > 0]
    if not useful:
        return []
    best = min(useful, key=lambda c: c.price_per_hour / c.admissible_rps)
    extra = math.ceil(deficit_rps / best.admissible_rps)
    return [f"add about {extra} {best.name} workers (workers.{best.name}.count={best.available + extra})"]


def smallest_feasible_staleness(cfg: PlanConfig, limit: int = MAX_STALENESS_SEARCHED) -> int | None:
    """Smallest S > the configured one with a feasible plan (bisection: feasibility only grows
    with S, since windows widen and stall fractions shrink while latencies stay put)."""
    low, high = cfg.workload.max_staleness, limit
    if low >= high or cheapest_fleet(with_staleness(cfg, high)) is None:
        return None
    while high - low > 1:
        mid = (low + high) // 2
        if cheapest_fleet(with_staleness(cfg, mid)) is None:
            low = mid
        else:
            high = mid
    return high
