"""Planner timings and greedy optimality gaps; prints one JSON object.

    PYTHONPATH=src python benchmarks/planner.py

- `echo2 plan` wall time on configs/catalog/example.toml (goal: < 1 s, process start included)
- exact activation (scipy.optimize.milp) time vs catalog size (per-worker entries)
- greedy time and its gap: vs the exact optimum where that is affordable, vs the LP bound beyond
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from echo2.cli.plan_cmd import _solver_prints_to_stderr
from echo2.planner import Offer, activate_exact, activate_greedy

ROOT = Path(__file__).resolve().parents[1]


def random_offers(rng: random.Random, n: int, max_count: int) -> list[Offer]:
    # a mix like a real swarm: price roughly tracks speed, with +-50% market noise
    offers = []
    for i in range(n):
        rate = rng.choice([0.3, 0.6, 1.2, 2.0]) * rng.uniform(0.7, 1.3)
        price = rate * rng.uniform(0.6, 1.6)
        offers.append(
            Offer(
                f"w{i}", round(price, 3), round(rate, 3), rng.randint(1, max_count), relay=rng.random() > 0.3
            )
        )
    return offers


def plan_wall_s(repeats: int = 3) -> float:
    cmd = [sys.executable, "-m", "echo2", "plan", "--catalog", str(ROOT / "configs/catalog/example.toml")]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env={"PYTHONPATH": str(ROOT / "src")})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def exact_vs_greedy(n: int, max_count: int, cases: int, seed: int) -> dict:
    rng = random.Random(seed)
    gaps, exact_s, greedy_s = [], [], []
    for _ in range(cases):
        offers = random_offers(rng, n, max_count)
        required = rng.uniform(0.05, 0.9) * sum(o.rollouts_per_s * o.count for o in offers)
        exact, t_exact = timed(activate_exact, offers, required)
        greedy, t_greedy = timed(activate_greedy, offers, required)
        gaps.append(greedy.price_per_hour / exact.price_per_hour - 1)
        exact_s.append(t_exact)
        greedy_s.append(t_greedy)
    return {
        "entries": n,
        "max_count": max_count,
        "cases": cases,
        "gap_vs_optimum_mean": statistics.mean(gaps),
        "gap_vs_optimum_max": max(gaps),
        "milp_s_median": statistics.median(exact_s),
        "milp_s_max": max(exact_s),
        "greedy_s_median": statistics.median(greedy_s),
    }


def greedy_only(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    offers = random_offers(rng, n, 1)
    greedy, seconds = timed(activate_greedy, offers, 0.5 * sum(o.rollouts_per_s for o in offers))
    return {"entries": n, "greedy_s": seconds, "gap_vs_lp_bound": greedy.gap}


def main() -> None:
    with _solver_prints_to_stderr():  # HiGHS printf()s stray debug lines to stdout
        report = {
            "plan_example_wall_s": plan_wall_s(),
            "workers": [exact_vs_greedy(n, 1, 30, seed=n) for n in (20, 100, 400)],
            "classes": [exact_vs_greedy(12, 50, 30, seed=7)],
            "large": [greedy_only(n, seed=n) for n in (2000, 10000, 50000)],
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
