"""What benchmarks/inflight.py reads from a run, and what the capacity model and the simulator
predict for it. Pure functions of a run dir's records (no processes), so they are tested on
their own (tests/unit/test_inflight_bench.py).

- `measure(run_dir)`: steady seconds per learner step from step STEADY_FROM on, the learner's
  own seconds per step (T_train), the workers' seconds per lease (T_gen) and full-load rollouts/s,
  seconds per segment, groups dropped on arrival (the workers' refused submissions) and in the
  buffer, token staleness p50 and p95, and the swaps.
- `predict_capacity(...)`: seconds per learner step for both swap rules from the capacity model
  (`planner.fleet.admissible_rps`, `planner.capacity.step_wall_s`) on the measured inputs, at
  the median latency percentile: the model then admits a class whose median lateness fits the
  window and counts the share of its groups that arrive in time (a provisioning plan asks for
  the 90th percentile, and would call a fleet that drops its long tail infeasible, not slower).
- `predict_sim(...)`: the same from `echo2 sim` (the shared data plane), with the task's
  long-tailed lengths (`sim.generation_range`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from echo2.config.catalog import PlanConfig  # noqa: E402
from echo2.config.sim import ScenarioConfig  # noqa: E402
from echo2.planner.capacity import step_wall_s  # noqa: E402
from echo2.planner.fleet import admissible_rps  # noqa: E402
from echo2.report.metrics import read_metrics  # noqa: E402
from echo2.sim.simulator import simulate  # noqa: E402

STEADY_FROM = 5
"""Learner steps before this one are the start (workers loading, the first leases): not timed."""
PREDICTION_PERCENTILE = 0.5
MODES = ("between", "inflight")


def _of(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r.get("kind") == kind]


def steady_step_s(steps: list[dict]) -> float | None:
    """Seconds per learner step from step STEADY_FROM to the last (None: too few steps)."""
    times = {s["step"]: s["time"] for s in steps}
    last = max(times, default=0)
    if STEADY_FROM not in times or last <= STEADY_FROM:
        return None
    return (times[last] - times[STEADY_FROM]) / (last - STEADY_FROM)


def measure(run_dir: Path) -> dict:
    records = read_metrics(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = sorted(_of(records, "train_step"), key=lambda s: s["step"])
    done = _of(records, "worker_done")
    leases = sum(w.get("tasks", 0) for w in done)
    gen_s, busy_s = sum(w.get("gen_s", 0.0) for w in done), sum(w.get("busy_s", 0.0) for w in done)
    rollouts, tokens = sum(w.get("rollouts", 0) for w in done), sum(w.get("tokens", 0) for w in done)
    on_arrival = sum(w.get("dropped", 0) for w in done)
    loads = _of(records, "weights_loaded")
    steady = [s for s in steps if s["step"] >= STEADY_FROM]
    return {
        "steps": len(steps), "steady_step_s": _round(steady_step_s(steps)),
        "train_s_median": _round(statistics.median(s["train_s"] for s in steady) if steady else None),
        "workers": len(done),
        "lease_generation_s_mean": _round(gen_s / leases if leases else None),
        "worker_rollouts_per_s": _round(rollouts / busy_s * 1.0 if busy_s else None),
        "tokens_per_rollout": _round(tokens / rollouts if rollouts else None),
        "groups_dropped_on_arrival": on_arrival,
        "groups_dropped_in_buffer": max(0, summary.get("rollouts_dropped_stale", 0) - on_arrival),
        "groups_straddling_trained": summary.get("groups_straddling", 0),
        "token_staleness_p50": summary.get("token_staleness_p50"),
        "token_staleness_p95": summary.get("token_staleness_p95"),
        "masked_token_share": _round(summary.get("masked_token_share")),
        "swap_s_mean": _round(statistics.fmean(r["swap_s"] for r in loads) if loads else None),
        "versions_loaded": len(loads),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def lengths_cv(lengths: list[int]) -> float:
    """The spread of generation lengths (standard deviation over mean), which the capacity model
    takes as its gamma's coefficient of variation."""
    mean = statistics.fmean(lengths)
    return statistics.pstdev(lengths) / mean


def plan_of(inputs: dict, mode: str) -> PlanConfig:
    """The live run as a one-class catalog: its workers, batch, T_train, S, T_gen and (in flight)
    T_seg, with the spread of its generation lengths."""
    workload = {"params": 1e6, "prompts_per_step": inputs["prompts_per_step"], "group_size": inputs["group_size"],
                "step_time_s": inputs["train_s"], "max_staleness": inputs["staleness"],
                "generation_time_s": inputs["generation_s"], "load_time_s": inputs["load_s"],
                "max_masked_fraction": inputs["max_masked_fraction"]}
    if mode == "inflight":
        workload["segment_s"] = inputs["segment_s"]
    return PlanConfig.model_validate({
        "learner": {"price_per_hour": 1.0, "uplink_bps": 1e10},
        "workers": {"local": {"count": inputs["workers"], "price_per_hour": 0.0, "bandwidth_bps": 1e10,
                              "rollouts_per_s": inputs["worker_rollouts_per_s"]}},
        "workload": workload, "broadcast": {"topology": "ideal", "hop_latency_s": 0.0},
        "plan": {"generation_cv": inputs["generation_cv"], "latency_percentile": PREDICTION_PERCENTILE}})


def predict_capacity(inputs: dict) -> dict:
    """Seconds per learner step for both swap rules, and in-flight over between."""
    batch = inputs["prompts_per_step"] * inputs["group_size"]
    step = {}
    for mode in MODES:
        plan = plan_of(inputs, mode)
        step[mode] = step_wall_s(admissible_rps(plan, {"local": inputs["workers"]}), batch, inputs["train_s"])
    return _with_ratio(step)


def predict_sim(inputs: dict, length_range: tuple[float, float], *, steps: int, seeds: tuple[int, ...]) -> dict:
    """Steady seconds per learner step for both swap rules from the simulator (median of seeds)."""
    step = {}
    for mode in MODES:
        values = []
        for seed in seeds:
            plan = plan_of(inputs, mode)
            scenario = ScenarioConfig.model_validate({
                "learner": plan.learner.model_dump(), "workers": {"local": {
                    **plan.workers["local"].model_dump(exclude_none=True), "tasks_per_lease": 1}},
                "workload": plan.workload.model_dump(exclude_none=True),
                "broadcast": plan.broadcast.model_dump(),
                "sim": {"steps": steps, "seed": seed, "activation": "all", "slow_start": False,
                        "generation_range": list(length_range),
                        "swap": "pause" if mode == "inflight" else "between_generations"}})
            result = simulate(scenario)
            values.append(inputs["train_s"] / result.utilization_steady if result.utilization_steady > 0
                          else math.inf)
        step[mode] = statistics.median(values)
    return _with_ratio(step)


def _with_ratio(step: dict) -> dict:
    ratio = step["inflight"] / step["between"] if math.isfinite(step["between"]) and step["between"] > 0 else None
    return {"step_s": {m: _round(v, 3) if math.isfinite(v) else None for m, v in step.items()},
            "ratio": _round(ratio, 3)}


def accuracy_guard(between: dict, inflight: dict) -> dict:
    """Held-out accuracy of both runs at one version (n problems each): the difference and
    whether it is within two standard deviations of the difference of two proportions."""
    p1, n1, p2, n2 = between["accuracy"], between["problems"], inflight["accuracy"], inflight["problems"]
    sd = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    diff = p2 - p1
    return {"between": p1, "inflight": p2, "problems": n1, "difference": round(diff, 4), "sd": round(sd, 4),
            "within_2_sd": abs(diff) <= 2 * sd if sd > 0 else diff == 0}
