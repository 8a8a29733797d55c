"""Capacity model against reality: predicted versus measured learner utilization for real local
runs with 1-4 workers at two staleness bounds.

For each run the model gets only numbers measured in that same run (the machine's CPU
contention changes with the number of processes): the learner's busy time per step T_train,
each worker's full-load throughput r_i = rollouts / busy seconds (lease + generate + submit),
its generation latency per lease, its weight swap time and publish-to-loaded latency. The
prediction is echo2.planner's: admissible rate r~_i = r_i (1 - T_stall / (S T_train)) with one
swap per version (T_stall = S x swap), zero for a worker whose T_dis + T_gen exceeds S T_train,
then U = min(1, sum r~_i x T_train / B). Measured U is the learner's steady share of time not
waiting for data (step 0, which waits for the workers to start, left out).

    python benchmarks/capacity.py [--steps 40] [--workers 1 2 3 4] [--staleness 2 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from echo2.config.run_dir import read_resolved
from echo2.planner import effective_throughput_rps, learner_utilization
from echo2.report.metrics import read_metrics
from echo2.report.summary import step_busy_s, summarize, train_steps

# Emulated slower workers (each idles 3x its compute after a generation), so that 1-4 workers
# span the worker-bound to learner-bound range: one CPU worker alone nearly feeds the tiny
# model's learner.
SLOWDOWN = 4.0


def run(config: str, workers: int, staleness: int, steps: int, run_dir: Path, extra: list[str]) -> list[dict]:
    args = [sys.executable, "-m", "echo2", "run", "--config", config, "--set", f"run_dir={run_dir}",
            "--set", f"workers.count={workers}", "--set", f"train.max_staleness={staleness}",
            "--set", f"train.steps={steps}", "--set", "train.eval_every=1000",
            "--set", "activation.enabled=false", "--set", f"workers.worker.slowdown={SLOWDOWN}", *extra]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"echo2 run failed ({workers} workers, S={staleness}):\n{proc.stdout[-3000:]}")
    return read_metrics(run_dir / "metrics.jsonl")


def predict(records: list[dict], staleness: int, batch: int) -> dict:
    busy_s = step_busy_s(records)
    step_time_s = statistics.mean(busy_s[s["step"]] for s in train_steps(records)[1:])
    loaded = [r for r in records if r["kind"] == "weights_loaded"]
    admissible, per_worker = 0.0, {}
    for done in (r for r in records if r["kind"] == "worker_done"):
        worker = done["worker_id"]
        rate = done["rollouts"] / done["busy_s"]
        gen_s = done["gen_s"] / max(1, done["tasks"])  # per task; a lease holds tasks_per_lease
        mine = [r for r in loaded if r["worker_id"] == worker]
        dis_s = statistics.median(r["publish_to_loaded_s"] for r in mine)
        swap_s = statistics.mean(r["swap_s"] for r in mine)
        r_eff = effective_throughput_rps(rate, staleness, step_time_s, dissemination_s=dis_s,
                                         generation_s=gen_s, stall_s=staleness * swap_s)
        admissible += r_eff
        per_worker[worker] = {"rollouts_per_s": round(rate, 1), "admissible_rps": round(r_eff, 1),
                              "dissemination_s": round(dis_s, 3), "generation_s": round(gen_s, 3)}
    return {"step_time_s": round(step_time_s, 4), "batch_rollouts": batch, "per_worker": per_worker,
            "predicted": learner_utilization(admissible, batch, step_time_s) if admissible else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--staleness", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--out", default="runs/bench-capacity")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    extra = [x for item in args.overrides for x in ("--set", item)]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for staleness in args.staleness:
        for workers in args.workers:
            run_dir = Path(args.out) / f"{stamp}-n{workers}-s{staleness}"
            records = run(args.config, workers, staleness, args.steps, run_dir, extra)
            batch = read_resolved(str(run_dir)).batch_rollouts
            model = predict(records, staleness, batch)
            measured = summarize(records)["learner_utilization_steady"]
            rows.append({"workers": workers, "max_staleness": staleness, "measured": round(measured, 3),
                         "predicted": round(model["predicted"], 3),
                         "error_points": round(100 * (model["predicted"] - measured), 1), **model})
            print(json.dumps(rows[-1]), file=sys.stderr)
    worst = max(abs(r["error_points"]) for r in rows)
    print(json.dumps({"runs": rows, "max_abs_error_points": worst, "within_10_points": worst <= 10}, indent=2))


if __name__ == "__main__":
    main()
