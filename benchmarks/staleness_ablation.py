"""The staleness ablation, in real runs: `echo2 run` on the demo task (configs/demo.toml: the
tiny model learning 2-digit addition) at each staleness bound S, several seeds each, every
offered worker running (activation off) so generation outpaces the learner and the groups it
trains on really are up to S versions old. Per S it reports final held-out accuracy (mean and
sd over seeds), the staleness actually trained on, the behaviour-vs-learner mismatch KL and the
clip fraction, next to the paper's finding: stable up to S = 6, unstable at S = 11.

    .venv/bin/python benchmarks/staleness_ablation.py                 # S in 0,1,2,4,6,8,11 x 3 seeds
    .venv/bin/python benchmarks/staleness_ablation.py --values 0,6 --seeds 0 --steps 60

Each finished run is written to the output at once and skipped when the script runs again, so
an interrupted ablation resumes where it stopped (`--fresh` starts over).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from echo2.report.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
PAPER = "ECHO-2 (paper): training is stable up to S = 6 and can become unstable at S = 11"
# a run counts as unstable when it ends this far below its best held-out accuracy, or NaN
UNSTABLE_DROP_POINTS = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/demo.toml"))
    parser.add_argument("--values", default="0,1,2,4,6,8,11", help="staleness bounds S, comma-separated")
    parser.add_argument("--seeds", default="0,1,2", help="run seeds (each has its own warm start, cached)")
    parser.add_argument("--steps", type=int, default=150, help="learner steps per run")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra KEY=VALUE for every run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/staleness_ablation.json"))
    parser.add_argument("--fresh", action="store_true", help="ignore runs already in --out")
    args = parser.parse_args()
    values, seeds = _ints(args.values, "--values"), _ints(args.seeds, "--seeds")
    out = Path(args.out)
    done = [] if args.fresh or not out.is_file() else json.loads(out.read_text()).get("runs", [])
    runs = [r for r in done if r["steps"] == args.steps and r["overrides"] == args.overrides]
    todo = [(s, seed) for s in values for seed in seeds
            if not any(r["max_staleness"] == s and r["seed"] == seed for r in runs)]
    for n, (s, seed) in enumerate(todo, 1):
        print(f"[{n}/{len(todo)}] S={s} seed={seed}: running {args.steps} steps", file=sys.stderr, flush=True)
        runs.append(one_run(args, s, seed))
        last = runs[-1]
        print(f"[{n}/{len(todo)}] S={s} seed={seed}: accuracy {last['accuracy_before']:.3f} -> "
              f"{last['accuracy_after']:.3f}, staleness trained mean {last['staleness_mean']:.2f} "
              f"max {last['staleness_max']}, {last['wall_s']:.0f} s", file=sys.stderr, flush=True)
        _write(out, args, values, seeds, runs)
    result = _write(out, args, values, seeds, runs)
    print(json.dumps(result["by_staleness"], indent=2))
    return 0


def one_run(args, s: int, seed: int) -> dict:
    run_dir = ROOT / "runs" / f"staleness-S{s}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    sets = [f"run_dir={run_dir}", f"seed={seed}", f"train.max_staleness={s}", f"train.steps={args.steps}",
            "activation.enabled=false", f"train.checkpoint_every={args.steps}", *args.overrides]
    command = [sys.executable, "-m", "echo2", "run", "--config", args.config]
    for item in sets:
        command += ["--set", item]
    started = time.perf_counter()
    with open(ROOT / "runs" / f"{run_dir.name}.log", "w") as log:
        subprocess.run(command, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if r.get("kind") == "train_step" and not r.get("skipped")]
    evals = [r["accuracy"] for r in records if r.get("kind") == "eval"]
    ages = [int(age) for r in steps for age, n in r["staleness_hist"].items() for _ in range(n)]
    return {
        "max_staleness": s, "seed": seed, "steps": args.steps, "overrides": args.overrides, "run_dir": str(run_dir),
        "wall_s": time.perf_counter() - started,
        "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
        "accuracy_best": max(evals, default=summary["accuracy_after"]),
        "staleness_mean": statistics.fmean(ages) if ages else 0.0, "staleness_max": max(ages, default=0),
        "mismatch_kl_mean": _mean(r.get("mismatch_kl") for r in steps),
        "clip_frac_mean": _mean(r.get("clip_frac") for r in steps),
        "grad_norm_max": max((r["grad_norm"] for r in steps), default=0.0),
        "steps_skipped": summary["steps_skipped"], "rollouts_dropped_stale": summary["rollouts_dropped_stale"],
        "learner_utilization_steady": summary["learner_utilization_steady"],
    }


def by_staleness(runs: list[dict]) -> list[dict]:
    rows = []
    for s in sorted({r["max_staleness"] for r in runs}):
        group = [r for r in runs if r["max_staleness"] == s]
        final = [r["accuracy_after"] for r in group]
        gains = [100 * (r["accuracy_after"] - r["accuracy_before"]) for r in group]
        unstable = [r["seed"] for r in group if _unstable(r)]
        rows.append({
            "max_staleness": s, "seeds": len(group),
            "accuracy_after_mean": statistics.fmean(final),
            "accuracy_after_sd": statistics.stdev(final) if len(final) > 1 else 0.0,
            "accuracy_before_mean": statistics.fmean(r["accuracy_before"] for r in group),
            # seeds start from different warm starts: the gain is the comparison across S
            "gain_points_mean": statistics.fmean(gains),
            "gain_points_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
            "staleness_trained_mean": statistics.fmean(r["staleness_mean"] for r in group),
            "staleness_trained_max": max(r["staleness_max"] for r in group),
            "mismatch_kl_mean": _mean(r["mismatch_kl_mean"] for r in group),
            "clip_frac_mean": _mean(r["clip_frac_mean"] for r in group),
            "unstable_seeds": unstable,
        })
    return rows


def _unstable(run: dict) -> bool:
    final = run["accuracy_after"]
    return math.isnan(final) or 100 * (run["accuracy_best"] - final) > UNSTABLE_DROP_POINTS


def _write(out: Path, args, values: list[int], seeds: list[int], runs: list[dict]) -> dict:
    rows = by_staleness(runs)
    result = {
        "benchmark": "staleness_ablation", "config": args.config, "steps": args.steps, "values": values,
        "seeds": seeds, "paper": PAPER,
        "unstable_rule": (f"final held-out accuracy more than {UNSTABLE_DROP_POINTS:g} points below the run's best, "
                          "or NaN"),
        "by_staleness": rows, "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)  # a crash mid-write never loses the runs already done
    return result


def _mean(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{flag}={text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not values or min(values) < 0:
        raise SystemExit(f"{flag}={text!r}: expected non-negative integers, e.g. 0,1,2")
    return values


if __name__ == "__main__":
    sys.exit(main())
