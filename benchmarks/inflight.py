"""In-flight weight updates against swaps between generations, side by side in one run of this
script: the embedded task with long completions (configs/demo.toml, the tiny model, with
task.pad_tokens: the answer counts only after at least that many dots, so every completion is
tens of tokens and a lease's generation outlasts a learner step), trained at S = 1 with workers
that swap versions in only between generations (sampling.segment_tokens = 0) and with workers
that swap at every segment boundary of a generation in flight. 2 seeds, each mode a fresh
`echo2 run` process (benchmarks/real_model_learning.py's runner and analysis), one at a time.

Per run: learner utilization, groups dropped as stale, the staleness of trained tokens (p50,
p95) and the share masked as older than S, held-out accuracy (evaluation leases on the workers,
greedy) against wall time, and the swap cost (versions loaded, seconds each, and for in-flight
swaps the prompts computed again). Per seed: the time the in-flight run took to reach the
baseline's final accuracy, over the time the baseline took to first reach it. Goals: no group
dropped for straddling versions, and that ratio at most 0.7.

    .venv/bin/python benchmarks/inflight.py                   # both modes, seeds 0 and 1
    .venv/bin/python benchmarks/inflight.py --seeds 0 --modes inflight
    .venv/bin/python benchmarks/inflight.py --reanalyse       # the results again, from the run dirs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))

import real_model_learning as rml  # noqa: E402
from load.provenance import provenance, same_code  # noqa: E402

from echo2.report.metrics import read_metrics  # noqa: E402

CONFIG = ROOT / "configs" / "demo.toml"
PAD_TOKENS = 16
SEGMENT_TOKENS = 4
STALENESS = 2
COMMON = [f"task.pad_tokens={PAD_TOKENS}", f"sampling.max_new_tokens={PAD_TOKENS + 12}", "warmstart.steps=3000",
          "warmstart.stop_at_accuracy=0.3", "warmstart.check_every=100", "train.steps=40", "train.eval_every=5",
          "train.checkpoint_every=1000", "activation.enabled=false", "workers.count=6",
          "workers.worker.tasks_per_lease=16", "workers.worker.slowdown=12",
          "workers.worker.slowdown_per_token=true"]
"""The demo with long completions: at least 16 dots before the answer (a 28-token budget; the
warm start imitates 20), a warm start that stops once training problems are 30% right (so each
seed starts with room to learn), 40 steps evaluated every 5 versions, six workers leasing one
batch (16 prompts) at a time and paced 12x slower token by token in both modes
(worker.slowdown and slowdown_per_token: emulated slower GPUs, whose generations outlast
several learner steps while they mostly sleep, so generation leaves the learner its core); no
activation (the swap rule's comparison, not the fleet's)."""
MEASURES = ("src/echo2", "configs/demo.toml", "benchmarks/inflight.py", "benchmarks/real_model_learning.py")
"""The code its results measure (benchmarks/check.py lists a result as stale when it changed)."""
MODES = {"between": ["sampling.segment_tokens=0"], "inflight": [f"sampling.segment_tokens={SEGMENT_TOKENS}"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="between,inflight")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--staleness", type=int, default=STALENESS, help="S for both modes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra KEY=VALUE for every run")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "bench-inflight"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/inflight.json"))
    parser.add_argument("--reanalyse", action="store_true", help="rebuild the results from the runs under --work-dir")
    return parser.parse_args(argv)


def prepare(seed: int, args: argparse.Namespace) -> None:
    """The seed's warm start, built (and cached) before either mode's clock starts, so neither
    run pays for it."""
    command = [sys.executable, "-m", "echo2", "prepare", "--config", str(CONFIG)]
    for item in [*COMMON, *args.overrides, f"seed={seed}", f"run_dir={Path(args.work_dir) / f'prepare-seed{seed}'}"]:
        command += ["--set", item]
    print(f"seed {seed}: warm start", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=ROOT, timeout=3600, capture_output=True)


def run(mode: str, seed: int, args: argparse.Namespace) -> dict:
    rml.CONFIGS[mode] = CONFIG  # run_one names the run after its task key: the mode here
    inner = argparse.Namespace(steps=0, overrides=[*COMMON, *MODES[mode], *args.overrides], work_dir=args.work_dir)
    rml.TARGET = 1.01  # no fixed target: the comparison reads the baseline's final accuracy
    result = rml.run_one(mode, args.staleness, "tis", seed, inner, Path(args.work_dir) / "unused.jsonl")
    return describe(mode, seed, Path(result["run_dir"]), result)


def describe(mode: str, seed: int, run_dir: Path, analysed: dict) -> dict:
    """What the results file keeps of one run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_metrics(run_dir / "metrics.jsonl")
    loads = [r for r in records if r["kind"] == "weights_loaded"]
    steps = [r for r in records if r["kind"] == "train_step"]
    return {
        "mode": mode, "seed": seed, "run_dir": str(run_dir.resolve().relative_to(ROOT)),
        "steps_trained": summary["steps"],
        "accuracy_before": analysed["accuracy_before"], "accuracy_after": analysed["accuracy_after"],
        "accuracy_after_ci95": analysed["accuracy_after_ci95"], "wall_s": analysed["wall_s"],
        "accuracy_vs_time": analysed["accuracy_vs_time"],
        "learner_utilization": analysed["learner_utilization"],
        "groups_dropped_stale": summary.get("rollouts_dropped_stale", 0),
        "groups_dropped_straddling": sum(r.get("straddling", 0) for r in records
                                         if r["kind"] == "groups_dropped" and r["reason"] == "stale"),
        "groups_trained": sum(len(r["lease_ids"]) for r in steps),
        "groups_straddling": summary.get("groups_straddling", 0),
        "staleness_hist": summary["staleness_hist"],
        "token_staleness": {k: summary.get(k) for k in ("token_staleness_hist", "token_staleness_p50",
                                                         "token_staleness_p95", "tokens_masked_stale",
                                                         "masked_token_share")},
        "swap_cost": {"versions_loaded": len(loads),
                      "swap_s_mean": round(statistics.fmean(r["swap_s"] for r in loads), 4) if loads else None,
                      "swap_s_total": round(sum(r["swap_s"] for r in loads), 2),
                      "worker_generation_s": analysed["time"]["worker_generation_s"],
                      "worker_tokens_per_s": analysed["worker_tokens_per_s"]},
        "time": analysed["time"],
        "audit": analysed["audit"],
    }


def first_reaching(run: dict, accuracy: float) -> float | None:
    """Seconds from launch to the first evaluation at or above `accuracy` (None: never)."""
    return next((e["recorded_s"] for e in run["accuracy_vs_time"] if e["accuracy"] >= accuracy), None)


def compare(runs: list[dict]) -> list[dict]:
    """Per seed with both modes: the in-flight run's time to the baseline's final accuracy over
    the baseline's own, and the drops."""
    out = []
    for seed in sorted({r["seed"] for r in runs}):
        by = {r["mode"]: r for r in runs if r["seed"] == seed}
        if set(by) != set(MODES):
            continue
        base, fast = by["between"], by["inflight"]
        target = base["accuracy_after"]
        learned = target > base["accuracy_before"]  # else the start already had it: no time to compare
        t_base, t_fast = (first_reaching(base, target), first_reaching(fast, target)) if learned else (None, None)
        out.append({"seed": seed, "baseline_final_accuracy": target, "baseline_learned": learned,
                    "baseline_time_to_it_s": t_base,
                    "inflight_time_to_it_s": t_fast,
                    "time_ratio": round(t_fast / t_base, 3) if t_fast is not None and t_base else None,
                    "groups_dropped_stale": {m: r["groups_dropped_stale"] for m, r in by.items()},
                    "groups_dropped_straddling": {m: r["groups_dropped_straddling"] for m, r in by.items()},
                    "learner_utilization": {m: r["learner_utilization"] for m, r in by.items()},
                    "accuracy_after": {m: r["accuracy_after"] for m, r in by.items()},
                    "token_staleness_p95": {m: r["token_staleness"]["token_staleness_p95"] for m, r in by.items()}})
    return out


def goals(comparison: list[dict], runs: list[dict]) -> dict:
    ratios = [c["time_ratio"] for c in comparison]
    return {"no_group_dropped_for_straddling": all(r["groups_dropped_straddling"] == 0 for r in runs
                                                   if r["mode"] == "inflight"),
            "time_ratio_by_seed": ratios,
            "time_ratio_at_most_0_7": bool(ratios) and all(r is not None and r <= 0.7 for r in ratios)}


def save(out: Path, runs: list[dict], staleness: int, argv: list[str]) -> dict:
    """Write `runs`, with the runs already in `out` only where they measured this same code
    (`same_code`: a seed run separately at the same commit); older ones are not merged."""
    made = provenance(ROOT, argv)
    earlier = json.loads(out.read_text()) if out.is_file() else {}
    kept = earlier.get("runs", []) if same_code(earlier.get("provenance"), made) else []
    mine = {(r["mode"], r["seed"]) for r in runs}
    runs = [r for r in kept if (r["mode"], r["seed"]) not in mine] + runs
    comparison = compare(runs)
    result = {"benchmark": "inflight", "provenance": made,
              "config": str(CONFIG.relative_to(ROOT)), "common_overrides": COMMON, "modes": MODES,
              "max_staleness": staleness, "comparison": comparison, "goals": goals(comparison, runs), "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result


def reanalyse(work_dir: Path) -> list[dict]:
    runs = []
    for run_dir in sorted(p for p in work_dir.iterdir() if (p / "summary.json").is_file()):
        name, seed = run_dir.name.rsplit("-seed", 1)
        mode = name.split("-", 1)[0]
        launched = json.loads((run_dir / "bench_launch.json").read_text())["launched"]
        rml.TARGET = 1.01
        runs.append(describe(mode, int(seed), run_dir, rml.analyse(run_dir, launched)))
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    if args.reanalyse:
        result = save(out, reanalyse(Path(args.work_dir)), args.staleness, argv)
    else:
        runs: list[dict] = []
        for seed in (int(s) for s in args.seeds.split(",")):
            prepare(seed, args)
            for mode in args.modes.split(","):
                runs.append(run(mode, seed, args))
                result = save(out, runs, args.staleness, argv)  # kept as each run ends
    print(json.dumps({k: result[k] for k in ("comparison", "goals")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
