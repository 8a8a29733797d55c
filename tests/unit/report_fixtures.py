"""A synthetic run with what the metric sinks and the end-of-run plots read beyond the summary's
records: losses, the coordinator's periodic stats (queue, workers, dollars) and sample
completions, in a run dir with its config.json, as `echo2 run` leaves it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.metrics_fixtures import synthetic_run, write_run

from echo2.config.run import RunConfig
from echo2.config.run_dir import write_resolved


def report_run(steps: int = 12, workers: int = 3) -> list[dict]:
    out: list[dict] = []
    for record in synthetic_run(steps, workers=workers):
        if record["kind"] == "train_step":
            step = record["step"]
            record = {**record, "loss": 0.5 - 0.01 * step, "mismatch_kl": 0.001 * step, "clip_frac": 0.1,
                      "ratio_max": 1.5, "entropy": 2.0, "grad_norm": 0.7, "tokens": 100}
            out.append(record)
            out.append({"time": record["time"], "role": "coordinator", "kind": "coordinator_stats",
                        "learner_step": step, "version": step, "queued": 40 - step, "leased": 8, "buffered": 5,
                        "workers_alive": workers, "workers_active": 2, "cost_total": 0.01 * step,
                        "price_per_hour": 3.5})
            if step % 5 == 0:
                out.append({"time": record["time"], "role": "learner", "kind": "samples", "step": step,
                            "samples": [{"prompt": "3+4=", "completion": f"7|{step}\nend", "reward": 1.0,
                                         "worker_id": "w0", "version": step}]})
        else:
            out.append(record)
    return out


def write_report_run(run_dir: Path, records: list[dict], **report) -> RunConfig:
    steps = next(r["steps"] for r in records if r["kind"] == "learner_done")
    cfg = RunConfig.model_validate({"run_dir": str(run_dir), "train": {"steps": steps}, "report": report})
    write_resolved(cfg)
    write_run(run_dir / "metrics.jsonl", records, segment_bytes=1 << 20)
    return cfg
