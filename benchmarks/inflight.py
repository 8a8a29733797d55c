"""In-flight weight updates against swaps between generations, where generations are long and
their lengths have a long tail: the tiny model on the embedded task writing the answer and then
dots, as many as its warm start imitated, drawn log-uniform per problem (task.pad_range, so
completions of tens to hundreds of tokens, one prompt a lease), six workers paced token by
token, at one S. Each seed runs both swap rules, one fresh `echo2 run` at a time, alternated
(between, inflight, between, inflight, ...: ABAB).

Per run (benchmarks/inflight_model.py reads it): steady seconds per learner step from step 5 on,
groups dropped on arrival and in the buffer, token staleness p50 and p95, the masked share, and
the measured T_train, T_gen, rollouts/s and T_seg. Afterwards, held-out accuracy of both runs'
checkpoints at the same fixed versions on 500 problems (greedy, `echo2 eval`: not timed). Per
seed: in-flight over between in steady seconds per step, beside the capacity model's and the
simulator's predictions on that seed's measured inputs.

Goal 1: the baseline drops at least one group on arrival, in-flight none, on every seed.
Goal 2: the ratio at most 0.75 and within 15% of the capacity model's prediction, with accuracy
at the fixed versions within 2 standard deviations.

    .venv/bin/python benchmarks/inflight.py                   # 3 seeds, both modes (chunks of minutes)
    .venv/bin/python benchmarks/inflight.py --seeds 0 --modes between
    .venv/bin/python benchmarks/inflight.py --reanalyse       # the result again, from the run dirs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))

import inflight_model as model  # noqa: E402
from load.provenance import provenance  # noqa: E402

CONFIG = ROOT / "configs" / "demo.toml"
PAD_RANGE = (16, 160)
PROMPTS, GROUP, WORKERS, STALENESS, SEGMENT_TOKENS, MAX_MASKED = 4, 8, 6, 2, 8, 1.0
STEPS, FIXED_VERSIONS, EVAL_PROBLEMS = 30, (15, 30), 500
COMMON = [f"task.pad_range=[{PAD_RANGE[0]}, {PAD_RANGE[1]}]",
          f"sampling.max_new_tokens={PAD_RANGE[1] + 8}", f"sampling.group_size={GROUP}",
          "warmstart.steps=1500", "warmstart.batch_size=16", "warmstart.stop_at_accuracy=0.3",
          "warmstart.check_every=100", f"grpo.prompts_per_step={PROMPTS}", f"train.steps={STEPS}",
          "train.eval_every=1000", f"train.checkpoint_every={FIXED_VERSIONS[0]}", f"train.max_staleness={STALENESS}",
          f"train.max_masked_fraction={MAX_MASKED}", "activation.enabled=false", f"workers.count={WORKERS}",
          "workers.worker.tasks_per_lease=1", "workers.worker.slowdown=8", "workers.worker.slowdown_per_token=true",
          "report.plots=false", "report.tensorboard=false"]
"""The demo with long-tailed completions (the answer, then the dots the warm start imitated,
16-160 drawn log-uniform per problem), 4 prompts a step in groups of 8, S = 2, in-flight
groups trained while any of their tokens is fresh (f = 1), six workers leasing one prompt at a
time and paced 8x slower token by token in both modes (emulated slower GPUs: generation leaves
the learner its core), checkpoints at the fixed versions, no in-run evaluation and no activation
(the swap rule's comparison, not the fleet's)."""
MODES = {"between": ["sampling.segment_tokens=0"], "inflight": [f"sampling.segment_tokens={SEGMENT_TOKENS}"]}
MEASURES = ("src/echo2", "configs/demo.toml", "benchmarks/inflight.py", "benchmarks/inflight_model.py")
"""The code its results measure (benchmarks/check.py lists a result as stale when it changed)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="between,inflight")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra KEY=VALUE for every run")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "bench-inflight"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/inflight.json"))
    parser.add_argument("--reanalyse", action="store_true", help="rebuild the result from the runs under --work-dir")
    return parser.parse_args(argv)


def echo2(*args: str, overrides: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "echo2", *args]
    for item in overrides:
        command += ["--set", item]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=True)


def run_dir_of(work_dir: Path, mode: str, seed: int) -> Path:
    return work_dir / f"{mode}-seed{seed}"


def run(mode: str, seed: int, args: argparse.Namespace) -> None:
    """One `echo2 run`, then its checkpoints evaluated at the fixed versions (not timed). The
    seed's warm start is prepared first (cached, keyed by its settings), so no run pays for it."""
    work = Path(args.work_dir)
    common = [*COMMON, *args.overrides, f"seed={seed}"]
    print(f"seed {seed}: warm start (cached after the first)", file=sys.stderr, flush=True)
    echo2("prepare", "--config", str(CONFIG), overrides=[*common, f"run_dir={work / f'prepare-seed{seed}'}"],
          timeout_s=3600)
    run_dir = run_dir_of(work, mode, seed)
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    started = time.time()
    echo2("run", "--config", str(CONFIG), overrides=[*common, *MODES[mode], f"run_dir={run_dir}"], timeout_s=900)
    print(f"{mode} seed {seed}: {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    accuracy = {}
    for version in FIXED_VERSIONS:
        done = echo2("eval", "--checkpoint", str(run_dir / "checkpoints" / f"step_{version}"), "--json",
                     overrides=[f"task.eval_size={EVAL_PROBLEMS}"], timeout_s=1800)
        result = json.loads(done.stdout)
        accuracy[str(version)] = {"accuracy": result["pass_at_k"]["1"], "problems": result["problems"]}
    (run_dir / "bench_accuracy.json").write_text(json.dumps(accuracy))


def inputs_of(between: dict, lengths_cv: float) -> dict:
    """The capacity model's and the simulator's inputs, measured in the seed's baseline run."""
    per_token_s = between["lease_generation_s_mean"] / between["tokens_per_rollout"]
    return {"prompts_per_step": PROMPTS, "group_size": GROUP, "staleness": STALENESS, "workers": WORKERS,
            "max_masked_fraction": MAX_MASKED, "train_s": between["train_s_median"],
            "generation_s": between["lease_generation_s_mean"], "generation_cv": round(lengths_cv, 4),
            "worker_rollouts_per_s": between["worker_rollouts_per_s"], "load_s": between["swap_s_mean"] or 0.0,
            "segment_s": round(per_token_s * SEGMENT_TOKENS, 4)}


def completion_lengths(seed: int) -> list[int]:
    """The reference completion's length for each first operand (the task's own rule)."""
    from echo2.config.run import load_run_config
    from echo2.tasks.registry import make_task

    cfg = load_run_config(CONFIG, [*COMMON, f"seed={seed}"])
    task = make_task(cfg.task, seed)
    problems = [task.train_problem(i) for i in range(2000)]
    return [len(task.reference_completion(p)) for p in problems]


def compare(seed: int, runs: dict[str, dict]) -> dict:
    between, inflight = runs["between"], runs["inflight"]
    lengths = completion_lengths(seed)
    inputs = inputs_of(between, model.lengths_cv(lengths))
    measured = (inflight["steady_step_s"] / between["steady_step_s"]
                if inflight["steady_step_s"] and between["steady_step_s"] else None)
    capacity = model.predict_capacity(inputs)
    sim = model.predict_sim(inputs, (min(lengths), max(lengths)), steps=STEPS * 4, seeds=(0, 1, 2))
    guard = {v: model.accuracy_guard(between["accuracy"][v], inflight["accuracy"][v]) for v in between["accuracy"]}
    return {"seed": seed, "inputs": inputs, "ratio_measured": model._round(measured, 3),
            "ratio_capacity_model": capacity["ratio"], "ratio_simulator": sim["ratio"],
            "step_s": {"measured": {m: r["steady_step_s"] for m, r in runs.items()},
                       "capacity_model": capacity["step_s"], "simulator": sim["step_s"]},
            "groups_dropped_on_arrival": {m: r["groups_dropped_on_arrival"] for m, r in runs.items()},
            "token_staleness_p50": {m: r["token_staleness_p50"] for m, r in runs.items()},
            "token_staleness_p95": {m: r["token_staleness_p95"] for m, r in runs.items()},
            "accuracy_at_fixed_versions": guard}


def goals(comparisons: list[dict]) -> dict:
    ratios = [c["ratio_measured"] for c in comparisons]
    predicted = [c["ratio_capacity_model"] for c in comparisons]
    within = [r is not None and p is not None and abs(r - p) <= 0.15 * p
              for r, p in zip(ratios, predicted, strict=True)]
    return {"goal_1_between_drops_on_arrival_inflight_none": bool(comparisons) and all(
                c["groups_dropped_on_arrival"]["between"] >= 1 and c["groups_dropped_on_arrival"]["inflight"] == 0
                for c in comparisons),
            "ratio_measured_median": round(statistics.median(ratios), 3) if None not in ratios and ratios else None,
            "ratio_capacity_model_median": statistics.median(predicted) if None not in predicted and predicted
            else None,
            "goal_2_ratio_at_most_0_75": bool(ratios) and all(r is not None and r <= 0.75 for r in ratios),
            "goal_2_within_15_percent_of_capacity_model": bool(within) and all(within),
            "capacity_model_predicts_at_most_0_65": bool(predicted) and all(p is not None and p <= 0.65
                                                                            for p in predicted),
            "accuracy_within_2_sd": all(g["within_2_sd"] for c in comparisons
                                        for g in c["accuracy_at_fixed_versions"].values())}


def collect(work_dir: Path) -> dict[int, dict[str, dict]]:
    """Every finished run under `work_dir`, measured: {seed: {mode: run}}."""
    out: dict[int, dict[str, dict]] = {}
    for run_dir in sorted(p for p in work_dir.glob("*-seed*") if (p / "bench_accuracy.json").is_file()):
        mode, seed = run_dir.name.rsplit("-seed", 1)
        measured = model.measure(run_dir)
        measured["accuracy"] = json.loads((run_dir / "bench_accuracy.json").read_text())
        out.setdefault(int(seed), {})[mode] = measured
    return out


def save(out: Path, work_dir: Path, argv: list[str]) -> dict:
    runs = collect(work_dir)
    comparisons = [compare(seed, by) for seed, by in sorted(runs.items()) if set(by) == set(MODES)]
    result = {"benchmark": "inflight", "provenance": provenance(ROOT, argv), "config": str(CONFIG.relative_to(ROOT)),
              "common_overrides": COMMON, "modes": MODES, "fixed_versions": list(FIXED_VERSIONS),
              "comparisons": comparisons, "goals": goals(comparisons),
              "runs": {str(s): by for s, by in sorted(runs.items())}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not args.reanalyse:
        modes = args.modes.split(",")
        for seed in (int(s) for s in args.seeds.split(",")):
            for mode in modes:  # alternated: each seed's pair back to back, in the same order
                run(mode, seed, args)
    result = save(Path(args.out), Path(args.work_dir), argv)
    print(json.dumps({k: result[k] for k in ("comparisons", "goals")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
