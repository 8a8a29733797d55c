"""What one simulated run reports: the learner's utilization (computed as the real run summary
does), throughput, staleness, dissemination latency, fleet and churn, and cost against the
centralized baseline of `echo2.planner.cost` for the same number of steps."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from echo2.config.sim import ScenarioConfig
from echo2.planner.capacity import rollouts_generated_per_step
from echo2.planner.cost import SECONDS_PER_HOUR, centralized_step_s, saving_fraction


@dataclass(frozen=True)
class CentralizedRun:
    """The baseline run, centralized and co-located on the learner's GPUs (generate the batch,
    then train), over the simulated run's steps (echo2.planner.plan.Baseline is one step of it)."""

    step_s: float
    wall_s: float
    cost: float


@dataclass
class SimResult:
    scenario: str
    model: str
    steps_requested: int
    steps_done: int
    finished: bool
    """False when the horizon passed or no worker could ever feed the learner."""
    wall_s: float
    utilization: float
    """The learner's busy share, as the real summary's `learner_utilization` (report.summary)."""
    utilization_steady: float
    """Excluding step 0, which waits for the first version to reach the workers."""
    first_wait_s: float
    """The learner's wait for step 0's batch (worker start-up and the first version)."""
    uninformative_share: float
    """workload.uninformative_share: the share of admitted groups drawn uninformative."""
    rollouts_generated: int
    rollouts_per_s: float
    """Every rollout workers generated (dropped ones included) per second of learner wall time."""
    trained_rollouts_per_s: float
    groups: dict[str, int]
    staleness_hist: dict[str, int]
    segment_s: float | None
    """workload.segment_s: T_seg of in-flight weight updates (None: no swaps mid-generation)."""
    tokens: dict
    """Trained groups' tokens per staleness (masked ones left out, as the learner's
    token_staleness_hist), its p50 and p95, and the tokens masked as older than S with their
    share of all the trained groups' tokens (`token_staleness`)."""
    rounds: int
    round_latency_s: dict[str, float]
    """Publish until the last worker of a round holds the version (transfer only)."""
    publish_to_loaded_s: dict[str, float]
    """Per worker and version: publish until the worker has swapped it in."""
    fleet: dict[str, int]
    """Workers rented at the start, per class."""
    worker_hours: dict[str, float]
    preemptions: int
    controller_switches: int
    """Activation decisions that changed the active set (mode "plan")."""
    fleet_time_h: dict[str, float]
    """Worker-hours active (rented, leasing), idle (rented, billed, no leases) and released or
    never rented (billing nothing), summed over every worker of the scenario."""
    releases: int
    acquires: int
    """Machines handed back to, and taken again from, the fleet provider by the controller."""
    learner_cost: float
    fleet_cost: float
    """What the workers' machines billed: each one's price x the time from its acquire to its
    release (or loss), boot included, as a real run's fleet ledger bills it (its `billed_usd`)."""
    billed_s: float
    """Machine-seconds billed, boot included (the real summary's fleet `billed_s`)."""
    billed_usd_per_step: float | None
    """fleet_cost per learner step done (None: no step)."""
    billed_usd_per_group: float | None
    """fleet_cost per trained group (None: none trained)."""
    total_cost: float
    cost_per_step: float
    baseline: CentralizedRun | None
    saving_fraction: float | None
    plan: dict = field(default_factory=dict)
    """`echo2 plan`'s prediction for the same scenario (empty when activation = "all")."""
    per_worker: list[dict] = field(default_factory=list)
    events: int = 0
    run_s: float = 0.0
    """Real seconds the simulation took."""

    def as_run_summary(self) -> dict:
        """The quantities a real run's summary.json reports, under its keys (report/summary.py,
        report/finish.py `fleet_bill`), so a measured run and its simulation compare key by key."""
        return {"steps": self.steps_done, "learner_utilization": self.utilization,
                "learner_utilization_steady": self.utilization_steady,
                "fleet": {"billed_usd": self.fleet_cost, "billed_s": self.billed_s,
                          "billed_usd_per_step": self.billed_usd_per_step,
                          "billed_usd_per_group": self.billed_usd_per_group,
                          "groups_trained": self.groups["trained"]}}

    def to_dict(self, per_worker: bool = False) -> dict:
        data = dataclasses.asdict(self)
        if not per_worker:
            data.pop("per_worker")
        return _json_safe(data)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0, "n": 0}
    arr = np.asarray(values)
    return {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "max": float(arr.max()),
        "n": len(values),
    }


def token_staleness(hist: Counter[int], masked: int) -> dict:
    """The run summary's token staleness keys (report.summary), from the simulated counts."""
    trained = sum(hist.values())
    return {"token_staleness_hist": {str(k): hist[k] for k in sorted(hist)},
            "token_staleness_p50": _percentile(hist, 0.50), "token_staleness_p95": _percentile(hist, 0.95),
            "tokens_masked_stale": masked,
            "masked_token_share": masked / (masked + trained) if masked + trained else None}


def _percentile(hist: Counter[int], q: float) -> int | None:
    """The smallest staleness with at least a share q of the tokens at or below it."""
    total, seen = sum(hist.values()), 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= q * total:
            return value
    return None


def centralized_baseline(scenario: ScenarioConfig, steps: int) -> CentralizedRun | None:
    """The planner's synchronous baseline, T_central = T_train + max(B / r_L, T_gen), for
    `steps` steps on the learner's GPUs alone; None without a learner rollout rate."""
    rate = scenario.plan_config().learner_rps()
    if rate is None:
        return None
    work = scenario.workload
    generated = rollouts_generated_per_step(work.batch_rollouts, work.uninformative_share)  # refills included
    step_s = centralized_step_s(work.step_time_s, generated, rate, work.generation_time_s)
    wall_s = step_s * steps
    return CentralizedRun(step_s, wall_s, scenario.learner.price_per_hour * wall_s / SECONDS_PER_HOUR)


def saving(total_cost: float, baseline: CentralizedRun | None) -> float | None:
    """None without a baseline, or when no step was trained (a starved run: nothing to compare)."""
    if baseline is None or not math.isfinite(total_cost) or baseline.cost <= 0:
        return None
    return saving_fraction(total_cost, baseline.cost)


def fleet_bill(workers, steps: int, groups_trained: int) -> dict[str, float | None]:
    """What the workers' machines billed, each from its acquire to its release or loss, boot
    included (sim/fleet.py keeps `billed_s`), in all, per learner step and per trained group."""
    billed_usd = sum(w.price_per_hour * w.billed_s for w in workers) / SECONDS_PER_HOUR
    return {"fleet_cost": billed_usd, "billed_s": sum(w.billed_s for w in workers),
            "billed_usd_per_step": billed_usd / steps if steps else None,
            "billed_usd_per_group": billed_usd / groups_trained if groups_trained else None}


def fleet_time_h(workers, wall_s: float) -> dict[str, float]:
    """Active, idle and not-held worker-hours over the run's `wall_s` (see SimResult)."""
    active = sum(w.active_s for w in workers) / SECONDS_PER_HOUR
    idle = sum(w.idle_s for w in workers) / SECONDS_PER_HOUR
    released = max(0.0, len(workers) * wall_s / SECONDS_PER_HOUR - active - idle)
    return {"active": active, "idle": idle, "released": released}


def worker_hours(classes: list[str], billed_s: list[float]) -> dict[str, float]:
    hours: Counter[str] = Counter()
    for cls, seconds in zip(classes, billed_s, strict=True):
        hours[cls] += seconds / SECONDS_PER_HOUR
    return dict(hours)
