"""How fast `echo2.sim` runs: the goal is 1,000 workers x 500 learner steps in under 60 s on one
core, and how run time grows with workers and steps. Also the event core against SimPy (the
reason for a plain heap). Pinned to one core; prints JSON.

    PYTHONPATH=src python benchmarks/sim_perf.py [--quick]

Workload: the Qwen3-8B scenario with every class scaled to N/5 workers, all rented
(activation "all", so the fleet really is N workers, with churn), pipelined chain unless noted.
Timings on a shared machine are noisy: compare ratios within one run of this script.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from echo2.config.sim import load_scenario  # noqa: E402
from echo2.sim.simulator import simulate  # noqa: E402

SCENARIO = ROOT / "configs" / "sim" / "qwen3_8b.toml"
CLASSES = ("rtx4090_dc", "rtx4090_home", "l40s_spot", "a100_spot", "h100_spot")
GOAL_S = 60.0


def timed_run(workers: int, steps: int, *extra: str) -> dict:
    sets = [
        "sim.activation=all",
        f"sim.steps={steps}",
        *(f"workers.{c}.count={workers // 5}" for c in CLASSES),
    ]
    scenario = load_scenario(SCENARIO, sets + list(extra))
    started = time.perf_counter()
    result = simulate(scenario)
    wall_s = time.perf_counter() - started
    return {
        "workers": workers,
        "steps": steps,
        "options": list(extra),
        "wall_s": round(wall_s, 3),
        "events": result.events,
        "events_per_s": round(result.events / wall_s),
        "steps_done": result.steps_done,
        "utilization": round(result.utilization, 3),
        "simulated_hours": round(result.wall_s / 3600, 1),
    }


def slope(rows: list[dict], key: str) -> float:
    """Exponent k of wall_s ~ key^k (least squares in log-log)."""
    xs = [math.log(r[key]) for r in rows]
    ys = [math.log(r["wall_s"]) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def event_core(n_events: int = 200_000) -> dict:
    """Seconds per event: a SimPy timeout versus a heap push/pop with a callback."""
    import simpy

    env = simpy.Environment()

    def process(i):
        for _ in range(n_events // 1000):
            yield env.timeout(1.0 + i * 1e-3)

    for i in range(1000):
        env.process(process(i))
    started = time.perf_counter()
    env.run()
    simpy_s = time.perf_counter() - started

    heap: list = []
    seq = 0

    def tick(now, i, k):
        nonlocal seq
        if k < n_events // 1000:
            seq += 1
            heapq.heappush(heap, (now + 1.0 + i * 1e-3, seq, tick, (i, k + 1)))

    for i in range(1000):
        seq += 1
        heapq.heappush(heap, (0.0, seq, tick, (i, 0)))
    started = time.perf_counter()
    while heap:
        now, _, callback, args = heapq.heappop(heap)
        callback(now, *args)
    heap_s = time.perf_counter() - started
    return {
        "events": n_events,
        "simpy_us_per_event": simpy_s / n_events * 1e6,
        "heap_us_per_event": heap_s / n_events * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 1,000 x 500 goal")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the goal says
    goal = timed_run(1000, 500)
    out: dict = {"goal": {**goal, "limit_s": GOAL_S, "met": goal["wall_s"] < GOAL_S}}
    if not args.quick:
        by_workers = [timed_run(n, 500) for n in (125, 250, 500, 1000, 2000)]
        by_steps = [timed_run(1000, s) for s in (125, 250, 500, 1000)]
        out["by_workers"] = by_workers
        out["by_steps"] = by_steps
        out["growth_exponent"] = {
            "workers": round(slope(by_workers, "workers"), 2),
            "steps": round(slope(by_steps, "steps"), 2),
        }
        out["topologies_1000x500"] = [
            timed_run(1000, 500, f"broadcast.topology={t}") for t in ("tree", "one_to_many", "ideal")
        ]
        out["plan_activation_1000_available"] = timed_run(1000, 500, "sim.activation=plan")
        out["event_core"] = event_core()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
