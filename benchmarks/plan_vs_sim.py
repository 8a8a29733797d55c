"""The planner against the simulator on the shipped scenarios; prints one JSON object.

    PYTHONPATH=src python benchmarks/plan_vs_sim.py [--steps N] > benchmarks/results/plan_vs_sim.json

For each of configs/sim/qwen3_{4b,8b,32b}.toml and each S from one below the planner's S_min
for the scenario's S up to 6: the planner's predicted learner utilization for the fleet it
provisions, the simulated utilization when that fleet is rented (activation "plan": re-decided
on preemptions), the difference in points, the workers, and rollouts/s needed against
generated. Goal: within 5 points wherever the plan is feasible. Below S_min the planner rents
nothing; the row says so and is not simulated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from load.provenance import provenance  # benchmarks/ is the script's directory

from echo2.config.sim import load_scenario
from echo2.planner.plan import make_plan
from echo2.sim.plan_check import plan_vs_sim

ROOT = Path(__file__).resolve().parents[1]
MEASURES = ("src/echo2/planner", "src/echo2/sim", "src/echo2/policy", "src/echo2/config", "configs/sim",
            "benchmarks/plan_vs_sim.py")
"""The code its results measure (benchmarks/check.py lists a result as stale when it changed)."""
SCENARIOS = ("qwen3_4b", "qwen3_8b", "qwen3_32b")
MAX_STALENESS = 6
"""ECHO-2 trained stably up to S = 6."""
GOAL_POINTS = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="learner steps per run (default: the scenario's)")
    args = parser.parse_args()
    overrides = [] if args.steps is None else [f"sim.steps={args.steps}"]
    started = time.perf_counter()
    rows = []
    for name in SCENARIOS:
        scenario = load_scenario(ROOT / "configs" / "sim" / f"{name}.toml", overrides)
        s_min = make_plan(scenario.plan_config()).s_min
        for staleness in range(max(0, s_min - 1), MAX_STALENESS + 1):
            rows.append(plan_vs_sim(scenario, staleness))
    simulated = [r for r in rows if "difference_points" in r]
    worst = max((abs(r["difference_points"]) for r in simulated), default=None)
    print(
        json.dumps(
            {
                "benchmark": "plan_vs_sim", "provenance": provenance(ROOT, sys.argv[1:]),
                "goal_points": GOAL_POINTS,
                "compared_on": "steady utilization (first step's wait left out); whole-run also given",
                "worst_difference_points": worst,
                "all_within_goal": worst is not None and worst <= GOAL_POINTS,
                "rows": rows,
                "run_s": round(time.perf_counter() - started, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
