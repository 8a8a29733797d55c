"""Does a verifiers environment learn as well as echo2's native path, and does a tool
environment teach the model to use its tool? SmolLM2-135M-Instruct, held-out accuracy greedy on
200 problems with 95% intervals, 2 seeds. Prints JSON.

    python benchmarks/env_learning.py run --path native --seed 0      # one run (minutes)
    python benchmarks/env_learning.py run --path verifiers --seed 0
    python benchmarks/env_learning.py run --path tool --seed 0
    python benchmarks/env_learning.py report > benchmarks/results/env_learning.json
    python benchmarks/env_learning.py report --paths tool > benchmarks/results/env_learning_tool.json

- native: configs/smollm2_addition.toml, echo2's `math` task on one-digit addition rows;
- verifiers: configs/verifiers_addition.toml, the verifiers addition environment on the same
  rows, the same held-out 200 (both read the same split files) and the same budget;
- tool: configs/verifiers_calculator.toml, two-digit addition with a calculator tool.

Both addition paths evaluate on the learner every `EVAL_EVERY` steps. The time to 0.95 is the
learner's wall time from the end of its first evaluation to the end of the first one at 0.95 or
more, less the evaluations in between (the same measuring for both). Goal: the verifiers path
reaches 0.95 within 1.2x the native path's time; on the tool environment, a gain whose 95%
interval excludes zero."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from load.measured import changed_code  # noqa: E402

WORK = ROOT / "runs" / "env_learning"
RESULTS = WORK / "results"
ROWS = ROOT / "configs" / "data" / "addition_1digit.jsonl"
HELD_OUT = 200
EVAL_EVERY = 2
TARGET, TIME_RATIO_GOAL = 0.95, 1.2
PATHS = {
    "native": ("configs/smollm2_addition.toml", 20),
    "verifiers": ("configs/verifiers_addition.toml", 20),
    "tool": ("configs/verifiers_calculator.toml", 20),
}
"""Path -> its config and its learner steps."""
RUN_TIMEOUT_S, STOP_GRACE_S = 4 * 3600, 120
"""A run's bound: the tool path's 20 steps and two evaluations took about 85 minutes here (a
learner step of 160-220 s); an hour stopped one at its last evaluation."""
MEASURES = ("src/echo2", "!src/echo2/sim", "!src/echo2/tasks/addition.py", "!src/echo2/launch/ssh_*",
            "!src/echo2/launch/sky*", "!src/echo2/launch/remote_fleet.py", "!src/echo2/rollout/vllm_*",
            "configs/smollm2_addition.toml",
            "configs/verifiers_addition.toml", "configs/verifiers_calculator.toml", "configs/data",
            "benchmarks/env_learning.py")
"""The code its results measure (benchmarks/check.py lists a result as stale when it changed): all
of echo2 but the simulator, the demo's addition task and the remote machine providers, which no
run here uses."""


def split_rows() -> tuple[Path, Path]:
    """The held-out rows and the training rows, one split for both paths."""
    rows = [line for line in ROWS.read_text().splitlines() if line.strip()]
    random.Random("env_learning").shuffle(rows)
    WORK.mkdir(parents=True, exist_ok=True)
    held, train = WORK / "heldout.jsonl", WORK / "train.jsonl"
    held.write_text("\n".join(rows[:HELD_OUT]) + "\n")
    train.write_text("\n".join(rows[HELD_OUT:]) + "\n")
    return held, train


def overrides(path: str, seed: int, run_dir: Path) -> list[str]:
    config, steps = PATHS[path]
    common = [f"run_dir=\"{run_dir}\"", f"seed={seed}", f"train.steps={steps}", "evaluation.where=\"learner\"",
              "report.plots=false", "report.tensorboard=false"]
    if path == "tool":
        return [*common, f"train.eval_every={steps}"]
    held, train = split_rows()
    common += [f"train.eval_every={EVAL_EVERY}", f"task.eval_size={HELD_OUT}"]
    if path == "native":
        return [*common, f"task.dataset=\"{train}\"", f"task.eval_split=\"{held}\""]
    files = f"[\"{held}\", \"{train}\"]"
    return [*common, f"task.args={{data_files = {files}, instruction = \"Answer with the number only.\"}}"]


def one_run(path: str, seed: int) -> dict:
    run_dir = WORK / f"{path}_s{seed}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [sys.executable, "-m", "echo2", "run", "--config", str(ROOT / PATHS[path][0])]
    for item in overrides(path, seed, run_dir):
        command += ["--set", item]
    started = time.time()
    with open(WORK / f"{path}_s{seed}.log", "wb") as log:
        returncode = run_stopping_on_timeout(command, log, f"{path} seed {seed}")
    if returncode != 0:
        raise SystemExit(f"{path} seed {seed} failed ({returncode}): see {WORK / f'{path}_s{seed}.log'}")
    return {"path": path, "seed": seed, "wall_s": round(time.time() - started, 1), "command": command,
            **measured(run_dir)}


def run_stopping_on_timeout(command: list[str], log, name: str) -> int:
    """`echo2 run`, given RUN_TIMEOUT_S; past it, SIGTERM (it stops its coordinator, learner and
    workers by PID), then SIGKILL after STOP_GRACE_S. subprocess.run's timeout sends SIGKILL at
    once, which left the run's children training on without it."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        return proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_GRACE_S)
        raise SystemExit(f"{name}: no end after {RUN_TIMEOUT_S} s; stopped it") from None


def measured(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = sorted((r for r in rows if r["kind"] == "eval" and r.get("role") == "learner"), key=lambda r: r["step"])
    summary = json.loads((run_dir / "summary.json").read_text())
    first, last = evals[0], evals[-1]
    curve, spent_s, reached_s = [], 0.0, None
    for r in evals:
        if r is not first:
            spent_s += r["eval_s"]
        train_s = r["time"] - first["time"] - spent_s
        curve.append({"step": r["step"], "accuracy": r["accuracy"], "train_s": round(train_s, 1),
                      **{k: r[k] for k in ("tool_call_rate", "tokens_per_episode") if k in r}})
        if reached_s is None and r["accuracy"] >= TARGET:
            reached_s = round(train_s, 1)
    return {"accuracy_before": interval(first["accuracy"], first["problems"]),
            "accuracy_after": interval(last["accuracy"], last["problems"]),
            "seconds_to_target": reached_s, "curve": curve, "steps": summary["steps"],
            "learner_wall_s": summary.get("learner_wall_s"),
            "tool_call_rate": {"before": first.get("tool_call_rate"), "after": last.get("tool_call_rate")},
            "tokens_per_episode": {"before": first.get("tokens_per_episode"), "after": last.get("tokens_per_episode")}}


def interval(accuracy: float, n: int) -> dict:
    """The accuracy and its 95% Wilson interval over n problems."""
    z = 1.96
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return {"accuracy": accuracy, "n": n, "ci95": [round(centre - half, 4), round(centre + half, 4)]}


def gain(before: dict, after: dict) -> dict:
    """The difference of two accuracies on n problems each, with its 95% interval (unpaired)."""
    p1, p2, n1, n2 = before["accuracy"], after["accuracy"], before["n"], after["n"]
    half = 1.96 * math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return {"gain": round(p2 - p1, 4), "ci95": [round(p2 - p1 - half, 4), round(p2 - p1 + half, 4)]}


def provenance(command: list[str]) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    import torch
    import transformers

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "src", "benchmarks",
                                                                   "configs")),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": {"cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
            "load_average": list(os.getloadavg()), "command": command}


def same_measured_code(first: str, second: str) -> bool:
    """Whether two commits hold the same code in MEASURES (benchmarks/check.py's rule for staleness:
    docstrings and comments aside)."""
    return changed_code(ROOT, MEASURES, first, second) == []


def runs_of(paths: list[str]) -> list[dict]:
    """The saved runs of `paths`, all of one measured code: at one commit, or at commits that
    differ only outside MEASURES (a report never mixes what it measures)."""
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    runs = [r for r in runs if r["path"] in paths]
    commits = sorted({r["provenance"]["commit"] for r in runs})
    if any(not same_measured_code(commits[0], other) for other in commits[1:]):
        raise SystemExit(f"{RESULTS} holds runs of {', '.join(paths)} from commits "
                         f"{', '.join(c[:7] for c in commits)}, whose measured code differs: rerun them at one "
                         "commit, or report fewer paths with --paths")
    return runs


def report(paths: list[str]) -> dict:
    runs = runs_of(paths)
    by = {(r["path"], r["seed"]): r for r in runs}
    pairs = []
    for seed in sorted({s for p, s in by if p == "native" and ("verifiers", s) in by}):
        native, verifiers = by["native", seed]["seconds_to_target"], by["verifiers", seed]["seconds_to_target"]
        ratio = None if native is None or verifiers is None else round(verifiers / native, 3)
        pairs.append({"seed": seed, "native_s": native, "verifiers_s": verifiers, "ratio": ratio,
                      "goal_met": ratio is not None and ratio <= TIME_RATIO_GOAL})
    tools = []
    for seed in sorted(s for p, s in by if p == "tool"):
        run = by["tool", seed]
        g = gain(run["accuracy_before"], run["accuracy_after"])
        tools.append({"seed": seed, **g, "goal_met": g["ci95"][0] > 0, "tool_call_rate": run["tool_call_rate"],
                      "tokens_per_episode": run["tokens_per_episode"]})
    return {"benchmark": "env_learning", **provenance([sys.executable, *sys.argv]),
            "goal": {"verifiers_time_to_target_within": TIME_RATIO_GOAL, "target_accuracy": TARGET,
                     "tool_gain_interval_excludes_zero": True},
            "addition_pairs": pairs, "tool": tools, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run")
    run.add_argument("--path", choices=sorted(PATHS), required=True)
    run.add_argument("--seed", type=int, default=0)
    chosen = actions.add_parser("report")
    chosen.add_argument("--paths", nargs="+", choices=sorted(PATHS), default=sorted(PATHS),
                        help="the paths to report (all by default); their runs must share one commit")
    args = parser.parse_args()
    if args.action == "report":
        print(json.dumps(report(args.paths), indent=2))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    measuring = provenance([sys.executable, *sys.argv])  # before the run: the code it ran, not a later HEAD
    result = {**one_run(args.path, args.seed), "provenance": measuring}
    (RESULTS / f"{args.path}_s{args.seed}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
