"""Does GRPO learn a reasoning-gym task end to end? Runs `echo2 run` on
configs/basic_arithmetic.toml (the embedded tiny model, basic_arithmetic through the chat
template) and reports held-out accuracy before and after, the learner's wall time for the RL
steps (the warm start, which stands in for a pretrained model and is cached, is timed apart),
and the goal: at least +10 points within 5 minutes.

    .venv/bin/python benchmarks/task_learning.py [--config FILE] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_POINTS, GOAL_S = 0.10, 300.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/basic_arithmetic.toml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/task_learning_basic_arithmetic.json"))
    args = parser.parse_args()
    run_dir = ROOT / "runs" / f"task-learning-{time.strftime('%Y%m%d-%H%M%S')}"
    command = [sys.executable, "-m", "echo2", "run", "--config", args.config, "--set", f"run_dir={run_dir}"]
    for item in args.overrides:
        command += ["--set", item]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    total_s = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    prepared = json.loads((run_dir / "base" / "echo2_prepared.json").read_text())
    gain = summary["accuracy_after"] - summary["accuracy_before"]
    result = {
        "benchmark": "task_learning", "config": args.config, "overrides": args.overrides, "run_dir": str(run_dir),
        "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
        "gain_points": round(100 * gain, 1), "steps": summary["steps"],
        "learner_wall_s": summary["learner_wall_s"], "eval_s_total": summary["eval_s_total"],
        "warm_start_s": prepared.get("seconds"), "total_wall_s": total_s,
        "learner_utilization_steady": summary["learner_utilization_steady"],
        "goal": f">= +{100 * GOAL_POINTS:.0f} points within {GOAL_S:.0f} s of RL",
        "goal_met": gain >= GOAL_POINTS and summary["learner_wall_s"] <= GOAL_S,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
