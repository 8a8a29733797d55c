"""GRPO on a real pretrained instruct model on this machine: SmolLM2-135M-Instruct (fetched with
`echo2 models fetch`) trained with `echo2 run` on configs/smollm2_addition.toml and
configs/smollm2_basic_arithmetic.toml, side by side:

- tasks: one-digit addition ("What is a + b?", the JSONL this script writes; 20 steps) and
  reasoning-gym basic_arithmetic ("Calculate 2 + 5.", one-digit terms, the bare number the only
  right answer; 30 steps at lr 2e-5, as its config says);
- staleness bounds S = 0, 1, 2; objectives (grpo.loss) tis and clip; seeds 0 and 1.

Each run is a fresh `echo2 run` process; its wall clock starts when the process is launched
(base model copy, process start-up and the first rollouts included). Held-out evaluation runs
on the workers at every version they can (evaluation leases, 200 problems, greedy), so accuracy
is timed to the step: `time_to_target_s` is when the first evaluation at or above the target
accuracy was recorded, counted from the launch. Per run it reports accuracy before and after
with 95% intervals (Wilson) and the paired gain's interval on the same problems, accuracy and
batch reward against wall time (for comparison with another trainer on the same model, prompts
and budget), learner tokens/s (prompt and completion apart), worker tokens/s, and where the
time went (learner compute, waiting, publishing, evaluation, broadcast, staleness).

    .venv/bin/python benchmarks/real_model_learning.py                       # the whole grid (~2 h)
    .venv/bin/python benchmarks/real_model_learning.py --tasks addition --staleness 1 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from echo2.report.metrics import read_metrics  # noqa: E402

TARGET = 0.95
CONFIGS = {  # the same run settings, two tasks
    "addition": ROOT / "configs" / "smollm2_addition.toml",  # with the JSONL below as its dataset
    "basic_arithmetic": ROOT / "configs" / "smollm2_basic_arithmetic.toml",
}


def write_addition_data(path: Path, rows: int = 2000, seed: int = 0) -> Path:
    """One-digit addition as questions with answers: configs/data/addition_1digit.jsonl is this."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for _ in range(rows):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            handle.write(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="addition,basic_arithmetic")
    parser.add_argument("--staleness", default="0,1,2")
    parser.add_argument("--losses", default="tis", help="grpo.loss values, e.g. tis,clip")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=0, help="learner steps of every run (0: the task's config)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="more --set for every run")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "bench-real"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/real_model_learning.json"))
    return parser.parse_args(argv)


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(centre - half, 4), round(centre + half, 4)]


def paired_gain(before: str, after: str, z: float = 1.96) -> dict:
    """after - before on the same problems: mean difference and its normal 95% interval."""
    diffs = [int(a) - int(b) for a, b in zip(after, before, strict=True)]
    mean = statistics.fmean(diffs)
    sd = statistics.pstdev(diffs)
    half = z * sd / math.sqrt(len(diffs))
    return {"gain": round(mean, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)]}


def run_one(task: str, staleness: int, loss: str, seed: int, args: argparse.Namespace, data: Path) -> dict:
    name = f"{task}-S{staleness}-{loss}-seed{seed}"
    run_dir = Path(args.work_dir) / name
    steps = [f"train.steps={args.steps}"] if args.steps else []
    overrides = [f"run_dir={run_dir}", f"seed={seed}", *steps, f"train.max_staleness={staleness}",
                 f"grpo.loss={loss}", "report.plots=false", *([f"task.dataset={data}"] if task == "addition" else []),
                 *args.overrides]
    command = [sys.executable, "-m", "echo2", "run", "--config", str(CONFIGS[task])]
    for item in overrides:
        command += ["--set", item]
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    launched = time.time()
    run_dir.mkdir(parents=True)
    (run_dir / "bench_launch.json").write_text(json.dumps({"launched": launched}))  # for --reanalyse
    print(f"{name}: started", file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    result = {"task": task, "staleness": staleness, "loss": loss, "seed": seed, "run_dir": str(run_dir),
              "steps": json.loads((run_dir / "summary.json").read_text())["steps"], **analyse(run_dir, launched)}
    print(f"{name}: {json.dumps({k: result[k] for k in ('accuracy_before', 'accuracy_after', 'time_to_target_s')})}",
          file=sys.stderr, flush=True)
    return result


def analyse(run_dir: Path, launched: float) -> dict:
    records = read_metrics(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    published = {r["version"]: r["time"] - launched for r in records
                 if r["kind"] == "version_published" and r["role"] == "learner"}
    evals = sorted((r for r in records if r["kind"] == "eval" and r["role"] == "coordinator"), key=lambda r: r["step"])
    steps = sorted((r for r in records if r["kind"] == "train_step"), key=lambda r: r["step"])
    first, last = evals[0], evals[-1]
    reached = next((e for e in evals if e["accuracy"] >= TARGET), None)
    workers = [r for r in records if r["kind"] == "worker_done"]
    return {
        "accuracy_before": first["accuracy"], "accuracy_before_ci95": wilson(first["correct"], first["problems"]),
        "accuracy_after": last["accuracy"], "accuracy_after_ci95": wilson(last["correct"], last["problems"]),
        "evaluated_versions": [first["step"], last["step"]], "problems": last["problems"],
        "paired_gain": paired_gain(first["correct_mask"], last["correct_mask"]),
        "time_to_target_s": round(reached["time"] - launched, 1) if reached else None,
        "version_reaching_target": reached["step"] if reached else None,
        "version_reaching_target_published_s": round(published[reached["step"]], 1) if reached else None,
        "wall_s": round(max(r["time"] for r in records) - launched, 1),
        "accuracy_vs_time": [{"version": e["step"], "accuracy": e["accuracy"],
                              "recorded_s": round(e["time"] - launched, 1),
                              "published_s": round(published.get(e["step"], math.nan), 1)} for e in evals],
        "reward_vs_time": [{"step": s["step"], "reward": round(s["reward_mean"], 4),
                            "t_s": round(s["time"] - launched, 1)}
                           for s in steps],
        "learner_tokens_per_s": summary.get("learner_tokens_per_s"),
        "worker_tokens_per_s": summary.get("tokens_per_s"),
        "time": _where_the_time_went(steps, evals, workers, summary, launched),
        "staleness_hist": summary["staleness_hist"],
        "learner_utilization": round(summary["learner_utilization"], 4),
        "audit": {"groups_checked": summary["audit"].get("groups_audited"),
                  "failed": summary["audit"].get("groups_failed"),
                  "max_honest_diff": summary["audit"].get("max_passed_diff_by_worker")},
    }


def _where_the_time_went(steps: list[dict], evals: list[dict], workers: list[dict], summary: dict,
                         launched: float) -> dict:
    prompt = sum(s.get("prompt_tokens_computed", 0) for s in steps)
    completion = sum(s.get("completion_tokens_computed", 0) for s in steps)
    return {
        "first_step_s": round(steps[0]["time"] - launched, 1),
        "learner_train_s": round(sum(s["train_s"] for s in steps), 1),
        "learner_wait_s": round(sum(s["wait_s"] for s in steps), 1),
        "learner_publish_s": round(sum(s["publish_s"] for s in steps), 1),
        "learner_prompt_token_share": round(prompt / (prompt + completion), 3) if prompt + completion else None,
        "worker_generation_s": round(sum(w.get("gen_s", 0.0) for w in workers), 1),
        "worker_evaluation_s": round(sum(w.get("eval_s", 0.0) for w in workers), 1),
        "evaluations": len(evals),
        "evaluation_wall_s_mean": round(statistics.fmean(e["wall_s"] for e in evals), 1) if evals else None,
        "publish_to_loaded_s_p50": {w: v["p50"] for w, v in summary.get("publish_to_loaded_s", {}).items()},
        "staleness_mean": round(sum(int(k) * v for k, v in summary["staleness_hist"].items())
                                / max(1, sum(summary["staleness_hist"].values())), 3),
    }


def aggregate(runs: list[dict]) -> list[dict]:
    """Per task, objective and S: the seeds' means, and every seed's headline."""
    keys = sorted({(r["task"], r["loss"], r["staleness"]) for r in runs})
    out = []
    for task, loss, staleness in keys:
        group = [r for r in runs if (r["task"], r["loss"], r["staleness"]) == (task, loss, staleness)]
        reached = [r["time_to_target_s"] for r in group if r["time_to_target_s"] is not None]
        out.append({
            "task": task, "loss": loss, "staleness": staleness, "seeds": [r["seed"] for r in group],
            "accuracy_before_mean": round(statistics.fmean(r["accuracy_before"] for r in group), 4),
            "accuracy_after_mean": round(statistics.fmean(r["accuracy_after"] for r in group), 4),
            "paired_gain_by_seed": [r["paired_gain"] for r in group],
            "time_to_target_s_by_seed": [r["time_to_target_s"] for r in group],
            "time_to_target_s_mean": round(statistics.fmean(reached), 1) if len(reached) == len(group) else None,
            "staleness_mean": round(statistics.fmean(r["time"]["staleness_mean"] for r in group), 3),
            "learner_utilization_mean": round(statistics.fmean(r["learner_utilization"] for r in group), 4),
            "wall_s_mean": round(statistics.fmean(r["wall_s"] for r in group), 1),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = write_addition_data(Path(args.work_dir) / "addition_1digit.jsonl")
    subprocess.run([sys.executable, "-m", "echo2", "models", "fetch", "smollm2-135m-instruct", "--json"], check=True,
                   cwd=ROOT, capture_output=True, timeout=1800)
    out = Path(args.out)
    for task in args.tasks.split(","):
        for loss in args.losses.split(","):
            for staleness in (int(s) for s in args.staleness.split(",")):
                for seed in (int(s) for s in args.seeds.split(",")):
                    save(out, run_one(task, staleness, loss, seed, args, data), args)  # kept as each run ends
    print(json.dumps(json.loads(out.read_text())["summary"], indent=2))
    return 0


def save(out: Path, run: dict, args: argparse.Namespace) -> None:
    """Add (or replace) one run in the results file and recompute the summary."""
    runs = json.loads(out.read_text())["runs"] if out.is_file() else []
    key = (run["task"], run["loss"], run["staleness"], run["seed"])
    runs = [r for r in runs if (r["task"], r["loss"], r["staleness"], r["seed"]) != key] + [run]
    result = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized), 134.5M parameters",
              "machine": f"{os.cpu_count()} CPU cores, one learner thread beside two 1-thread HF workers",
              "configs": {task: str(path.relative_to(ROOT)) for task, path in CONFIGS.items()},
              "target_accuracy": TARGET,
              "extra_overrides": args.overrides, "summary": aggregate(runs), "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
