"""The provisioning plan behind `echo2 plan`: from a catalog and a workload to the cheapest
fleet that keeps the learner busy (found by fleet.py; when there is none, diagnose.py says why
and what fixes it), its cost, and the centralized baseline's cost.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from echo2.config.catalog import PlanConfig
from echo2.planner import capacity, cost
from echo2.planner.diagnose import diagnose
from echo2.planner.fleet import (
    ClassPlan,
    cheapest_fleet,
    class_plans,
    fastest_fleet,
    slowest_chosen_bps,
    staleness_warnings,
)


@dataclass(frozen=True)
class Baseline:
    """Centralized co-located run on the learner's GPUs (generate, then train)."""

    step_wall_s: float
    price_per_hour: float
    cost_per_step: float
    cost_per_rollout: float


@dataclass(frozen=True)
class Plan:
    feasible: bool
    model: str
    batch_rollouts: int
    step_time_s: float
    max_staleness: int
    topology: str
    snapshot_bytes: float
    uninformative_share: float
    """d: share of scored groups dropped as uninformative (workload.uninformative_share)."""
    base_rps: float
    """B / ((1 - d) T_train): B / T_train with d = 0."""
    required_rps: float
    """R_required: base_rps inflated by the chosen set's per-version stall."""
    s_min: int
    """Smallest S whose window hides T_dis + T_gen for every chosen class (with segment swaps,
    T_dis + T_seg + (1 - f) T_gen: capacity.min_staleness)."""
    segment_s: float | None
    """T_seg of in-flight weight updates (workload.segment_s); None: no swaps mid-generation."""
    masked_share: float
    """Expected share of trained tokens older than S, masked out of the loss (the chosen
    classes' largest; 0 without segment swaps)."""
    n_workers: int
    classes: tuple[ClassPlan, ...]
    rollouts_per_s: float
    admissible_rps: float
    utilization: float
    dissemination_s: float
    step_wall_s: float
    learner_price_per_hour: float
    fleet_price_per_hour: float
    total_price_per_hour: float
    cost_per_step: float
    cost_per_rollout: float
    baseline: Baseline | None
    saving_fraction: float | None
    method: str
    gap: float
    reasons: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready: infinities become null; `chosen` maps class name to workers activated."""
        data = dataclasses.asdict(self)
        data["chosen"] = {c.name: c.chosen for c in self.classes if c.chosen}
        return _json_safe(data)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def make_plan(cfg: PlanConfig) -> Plan:
    """Cheapest feasible fleet, or (infeasible) every admissible worker plus why and what fixes it."""
    found = cheapest_fleet(cfg)
    if found is not None:
        return assemble(cfg, found.counts, method=found.method, gap=found.gap, reasons=(), fixes=(),
                        warnings=staleness_warnings(cfg.workload.max_staleness))
    reasons, fixes, warnings = diagnose(cfg)
    return assemble(cfg, fastest_fleet(cfg), method="fastest-fleet", gap=math.inf, reasons=reasons,
                    fixes=fixes, warnings=warnings)


def assemble(
    cfg: PlanConfig, counts: dict[str, int], *, method: str, gap: float, reasons, fixes, warnings
) -> Plan:
    """All the plan's numbers for the set `counts`, with latencies at its real size."""
    work = cfg.workload
    n = sum(counts.values())
    floor_bps = slowest_chosen_bps(cfg, counts)
    classes = tuple(
        dataclasses.replace(c, chosen=counts.get(c.name, 0)) for c in class_plans(cfg, max(1, n), floor_bps)
    )
    chosen = [c for c in classes if c.chosen]
    gross = sum(c.rollouts_per_s * c.chosen for c in chosen)
    admissible = sum(c.admissible_rps * c.chosen for c in chosen)
    d = work.uninformative_share
    step_s = capacity.step_wall_s(admissible, work.batch_rollouts, work.step_time_s, uninformative_share=d)
    fleet_price = sum(c.price_per_hour * c.chosen for c in chosen)
    total_price = fleet_price + cfg.learner.price_per_hour
    step_cost = cost.cost_per_step(total_price, step_s) if math.isfinite(step_s) else math.inf
    baseline = centralized_baseline(cfg)
    return Plan(
        feasible=not reasons,
        model=work.model,
        batch_rollouts=cfg.workload.batch_rollouts,
        step_time_s=work.step_time_s,
        max_staleness=work.max_staleness,
        topology=cfg.broadcast.topology,
        snapshot_bytes=cfg.workload.snapshot_bytes,
        uninformative_share=d,
        base_rps=capacity.base_throughput_rps(cfg.workload.batch_rollouts, work.step_time_s, uninformative_share=d),
        required_rps=_required_rps(cfg, chosen),
        s_min=_s_min(classes, chosen),
        segment_s=work.segment_s,
        masked_share=max((c.masked_share for c in chosen), default=0.0),
        n_workers=n,
        classes=classes,
        rollouts_per_s=gross,
        admissible_rps=admissible,
        utilization=capacity.learner_utilization(admissible, work.batch_rollouts, work.step_time_s,
                                                 uninformative_share=d),
        dissemination_s=max((c.dissemination_s for c in chosen), default=0.0),
        step_wall_s=step_s,
        learner_price_per_hour=cfg.learner.price_per_hour,
        fleet_price_per_hour=fleet_price,
        total_price_per_hour=total_price,
        cost_per_step=step_cost,
        cost_per_rollout=cost.cost_per_rollout(step_cost, cfg.workload.batch_rollouts),
        baseline=baseline,
        saving_fraction=_saving(step_cost, baseline),
        method=method,
        gap=gap,
        reasons=tuple(reasons),
        fixes=tuple(fixes),
        warnings=tuple(warnings),
    )


def _required_rps(cfg: PlanConfig, chosen: list[ClassPlan]) -> float:
    """R_required of the chosen set: its largest per-version stall, its most frequent swaps."""
    work = cfg.workload
    interval = min((c.swap_interval_s for c in chosen), default=None)
    return capacity.required_throughput_rps(
        batch_rollouts=work.batch_rollouts,
        step_time_s=work.step_time_s,
        staleness=work.max_staleness,
        stall_s=max((c.stall_s for c in chosen), default=work.load_time_s),
        swap_interval_s=interval if interval is not None else work.step_time_s,
        uninformative_share=work.uninformative_share,
    )


def _s_min(classes: tuple[ClassPlan, ...], chosen: list[ClassPlan]) -> int:
    """S_min of the chosen set; with none chosen, of the class that gets there soonest."""
    if chosen:
        return max(c.s_min for c in chosen)
    return min((c.s_min for c in classes), default=0)


def centralized_baseline(cfg: PlanConfig) -> Baseline | None:
    rate = cfg.learner_rps()
    if rate is None:
        return None
    work = cfg.workload
    # it generates the refills too: B / (1 - d) rollouts a step
    generated = capacity.rollouts_generated_per_step(work.batch_rollouts, work.uninformative_share)
    step_s = cost.centralized_step_s(work.step_time_s, generated, rate, work.generation_time_s)
    step_cost = cost.cost_per_step(cfg.learner.price_per_hour, step_s)
    return Baseline(
        step_s, cfg.learner.price_per_hour, step_cost, cost.cost_per_rollout(step_cost, cfg.workload.batch_rollouts)
    )


def _saving(step_cost: float, baseline: Baseline | None) -> float | None:
    if baseline is None or not math.isfinite(step_cost):
        return None
    return cost.saving_fraction(step_cost, baseline.cost_per_step)
