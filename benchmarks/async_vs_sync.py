"""Synchronous (S=0) against asynchronous (S=2) GRPO on the same config, side by side.

Runs `echo2 run` for each staleness bound (alternating when --repeats > 1, so machine noise hits
both alike) and prints JSON: wall time until held-out accuracy first reaches the target,
learner utilization, rollouts dropped as stale, accuracy before/after.

    python benchmarks/async_vs_sync.py [--steps 200] [--target 0.55] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from echo2.report.metrics import read_metrics
from echo2.report.summary import summarize


def run_once(config: str, staleness: int, steps: int, run_dir: Path, extra: list[str]) -> dict:
    args = [sys.executable, "-m", "echo2", "run", "--config", config, "--set", f"run_dir={run_dir}",
            "--set", f"train.max_staleness={staleness}", "--set", f"train.steps={steps}",
            "--set", "train.eval_every=10", *extra]
    started = time.time()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"echo2 run failed (S={staleness}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"records": read_metrics(run_dir / "metrics.jsonl"), "wall_s": time.time() - started}


def time_to_target(records: list[dict], target: float) -> float | None:
    """Seconds from the learner's first publish to the first eval at or above the target."""
    start = min(r["time"] for r in records if r["kind"] == "version_published" and r["role"] == "learner")
    for r in sorted((r for r in records if r["kind"] == "eval"), key=lambda r: r["step"]):
        if r["accuracy"] >= target:
            return r["time"] - start
    return None


def result(staleness: int, run: dict, target: float) -> dict:
    summary = summarize(run["records"])
    return {
        "max_staleness": staleness,
        "time_to_target_s": time_to_target(run["records"], target),
        "learner_wall_s": summary["learner_wall_s"],
        "learner_utilization": round(summary["learner_utilization"], 4),
        "learner_utilization_steady": round(summary["learner_utilization_steady"], 4),
        "rollouts_dropped_stale": summary["rollouts_dropped_stale"],
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "staleness_hist": summary["staleness_hist"],
        "process_wall_s": round(run["wall_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--target", type=float, default=0.55, help="held-out accuracy to reach")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="runs/bench-async-vs-sync")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    extra = [x for item in args.overrides for x in ("--set", item)]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = []
    for repeat in range(args.repeats):
        for staleness in (0, 2):
            run_dir = Path(args.out) / f"{stamp}-r{repeat}-s{staleness}"
            results.append(result(staleness, run_once(args.config, staleness, args.steps, run_dir, extra), args.target))
    by_s = {s: [r for r in results if r["max_staleness"] == s] for s in (0, 2)}
    def mean(key, s):
        values = [r[key] for r in by_s[s] if r[key] is not None]
        return sum(values) / len(values) if values else None
    t0, t2 = mean("time_to_target_s", 0), mean("time_to_target_s", 2)
    print(json.dumps({
        "config": args.config, "steps": args.steps, "target_accuracy": args.target, "runs": results,
        "speedup_time_to_target_s2_over_s0": round(t0 / t2, 3) if t0 and t2 else None,
        "utilization_s0": mean("learner_utilization", 0), "utilization_s2": mean("learner_utilization", 2),
    }, indent=2))


if __name__ == "__main__":
    main()
