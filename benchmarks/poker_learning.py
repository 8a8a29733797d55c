"""Does GRPO learn a multi-turn game end to end? Runs `echo2 run` on configs/poker_kuhn.toml (the
tiny model playing Kuhn poker against a random opponent through the chat template, rewards from
the coordinator's replay of every episode), then plays the same held-out episodes with the base
model (after its format-only warm start) and with the final checkpoint, against every opponent,
greedy and sampled at the run's temperature. Reports mean reward before and after with 95%
confidence intervals, the paired gain (the same seeds before and after) with its interval, the
run's wall time, and what the coordinator's replays cost per episode.

Goal: against the random opponent the gain's 95% interval lies above 0, over >= 500 episodes,
with the whole run (warm start included) within 10 minutes.

    .venv/bin/python benchmarks/poker_learning.py [--config FILE] [--episodes N] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S, MIN_EPISODES = 600.0, 500


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/poker_kuhn.toml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--episodes", type=int, default=1000, help="held-out episodes per opponent and policy")
    parser.add_argument("--run-dir", help="evaluate this finished run instead of starting one")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/poker_learning_kuhn.json"))
    args = parser.parse_args()
    if args.episodes < MIN_EPISODES:
        raise SystemExit(f"--episodes {args.episodes}: the goal needs at least {MIN_EPISODES}")
    run_dir, run_s = Path(args.run_dir) if args.run_dir else None, None
    if run_dir is None:
        run_dir = ROOT / "runs" / f"poker-learning-{time.strftime('%Y%m%d-%H%M%S')}"
        command = [sys.executable, "-m", "echo2", "run", "--config", args.config, "--set", f"run_dir={run_dir}"]
        for item in args.overrides:
            command += ["--set", item]
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=ROOT)
        run_s = time.perf_counter() - started
    result = {"benchmark": "poker_learning", "config": args.config, "overrides": args.overrides,
              "run_dir": str(run_dir), "run_wall_s": run_s, **evaluate(run_dir, args.episodes)}
    gain = result["greedy"]["random"]["gain"]
    result["goal"] = (f"greedy mean reward against the random opponent: gain's 95% CI above 0 over >= "
                      f"{MIN_EPISODES} episodes, run within {GOAL_S:.0f} s")
    result["goal_met"] = gain["ci95_low"] > 0 and (run_s is None or run_s <= GOAL_S)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["goal_met"] else 1


def evaluate(run_dir: Path, episodes: int) -> dict:
    import torch

    from echo2.config.run_dir import read_resolved
    from echo2.learner.checkpoint import latest_checkpoint
    from echo2.learner.eval_run import load_for_eval
    from echo2.models.env_evaluation import evaluate_episodes, mean_ci
    from echo2.report.metrics import iter_metrics
    from echo2.report.summary import summarize
    from echo2.tasks import make_task

    torch.set_num_threads(2)
    cfg = read_resolved(str(run_dir))
    task = make_task(cfg.task, cfg.seed)
    final = latest_checkpoint(run_dir / "checkpoints")
    models = {"before": load_for_eval(cfg.base_model_path, None, "cpu"), "after": load_for_eval(cfg.base_model_path,
                                                                                                final, "cpu")}
    out: dict = {"episodes_per_opponent": episodes, "checkpoint": str(final)}
    for label, temperature in (("greedy", 0.0), ("sampled", cfg.sampling.temperature)):
        torch.manual_seed(0)
        reports = {name: evaluate_episodes(model, tokenizer, task, cfg.sampling.max_new_tokens, episodes=episodes,
                                           temperature=temperature)["opponents"]
                   for name, (model, tokenizer) in models.items()}
        out[label] = {}
        for opponent in task.eval_opponents():
            before, after = reports["before"][opponent], reports["after"][opponent]
            gain, half = mean_ci([a - b for a, b in zip(after.pop("rewards"), before.pop("rewards"), strict=True)])
            out[label][opponent] = {"before": _rounded(before), "after": _rounded(after),
                                    "gain": {"mean": round(gain, 4), "ci95_low": round(gain - half, 4),
                                             "ci95_high": round(gain + half, 4)}}
    summary = summarize(iter_metrics(run_dir / "metrics.jsonl"))
    out["replay"] = summary.get("replay")
    out["learner_steps"], out["learner_wall_s"] = summary["steps"], summary["learner_wall_s"]
    prepared = run_dir / "base" / "echo2_prepared.json"
    out["warm_start_s"] = json.loads(prepared.read_text()).get("seconds") if prepared.is_file() else None
    return out


def _rounded(report: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()}


if __name__ == "__main__":
    sys.exit(main())
