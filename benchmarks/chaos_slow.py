"""Chaos, the slow-answer scenario (run by chaos.py): a real `echo2 run` on a math-verify task
while a worker sends nothing but answers math-verify takes seconds to compare
(tests/reliability/slow_answer_worker.py). The task is the demo's 2-digit addition as a `math`
task (a local JSONL, answers compared by math-verify), so the run's scoring is the path a GSM8K
run takes. Reported: whether the run survived, the slow worker's completions cut off at
`coordinator.scoring.timeout_s` and whether it was refused, honest workers lost or evicted (goal:
0), the coordinator's longest event-loop stall and the slowest answer to a request sent every
0.25 s meanwhile (goal: under 1 s), and the rollout accounting (0 lost, 0 trained twice)."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from pathlib import Path

from tests.integration.runs import coordinator_url, records, to_toml, wait_for
from tests.reliability.accounting import accounting

from echo2.config.base import read_toml

SLOW_ID = "slow-answers"


def write_dataset(path: Path, rows: int = 4000) -> Path:
    """2-digit additions as a math dataset: question "37+45=", answer "82" (seeded: the same file
    every run)."""
    rng = random.Random(0)
    lines = []
    for _ in range(rows):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_config(demo_config: str, base: Path, steps: int) -> Path:
    """The demo's config with the addition problems as a math task: completions are
    `\\boxed{82}`, and the slow answers (up to 20 tokens) fit in max_new_tokens."""
    data = read_toml(demo_config)
    # one path for every run, so the warm start's cache (keyed by the config) is reused
    data_dir = Path(__file__).resolve().parents[1] / "runs" / "chaos-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    data["task"] = {"name": "math", "dataset": str(write_dataset(data_dir / "addition.jsonl")), "instruction": "",
                    "eval_size": 100}
    data["sampling"]["max_new_tokens"] = 24
    # what this run shows does not depend on how well the base model adds: a short warm start
    # (about a minute) that teaches the \boxed{} format
    data["warmstart"]["steps"] = 200
    data["train"].update({"steps": steps, "eval_every": steps, "checkpoint_every": steps})
    data["run_dir"] = str(base / "slow")
    path = base / "slow.toml"
    path.write_text(to_toml(data))
    return path


class Prober(threading.Thread):
    """Asks the coordinator for something cheap every 0.25 s and keeps the slowest answer: what a
    heartbeat sent while a slow answer is scored would wait."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.stop = threading.Event()
        self.latencies_s: list[float] = []
        self.failed_at: list[float] = []
        """Wall-clock times (as metrics.jsonl's) of requests that got no answer."""

    def run(self) -> None:
        request = urllib.request.Request(self.url + "/v1/broadcast_config",
                                         headers={"Authorization": f"Bearer {self.token}"})
        while not self.stop.wait(0.25):
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=10) as reply:
                    reply.read()
                self.latencies_s.append(time.perf_counter() - started)
            except OSError:
                self.failed_at.append(time.time())


def slow_answer_run(demo_config: str, base: Path, steps: int, *, start, stop, token: str) -> dict:
    """`start(args, log, module, env)` and `stop(proc)` are chaos.py's process helpers."""
    config = write_config(demo_config, base, steps)
    run_dir = base / "slow"
    run = start(["run", "--config", str(config), "--set", "coordinator.heartbeat_interval_s=0.5",
                 "--set", "coordinator.worker_timeout_s=3"], base / "slow.log")
    slow = None
    prober = None
    try:
        # the first run of this config warm-starts its base model (cached for later runs)
        url = wait_for(lambda: coordinator_url(run_dir), 1800, "the coordinator", alive=run)
        slow = start(["--coordinator", url, "--metrics", str(run_dir / "metrics.jsonl"), "--set",
                      f"worker_id={SLOW_ID}"], base / "slow-worker.log", module="tests.reliability.slow_answer_worker")
        prober = Prober(url, token)
        prober.start()
        code = run.wait(timeout=3600)
        if code != 0:
            raise RuntimeError(f"the slow-answer run failed: see {base / 'slow.log'}")
    finally:
        if prober is not None:
            prober.stop.set()
            prober.join(timeout=30)
        for proc in (run, slow):
            if proc is not None:
                stop(proc)
    return outcome(run_dir, steps, prober)


def outcome(run_dir: Path, steps: int, prober: Prober) -> dict:
    max_staleness = read_toml(run_dir.parent / "slow.toml")["train"]["max_staleness"]
    books = accounting(run_dir, max_staleness)
    over = records(run_dir, "scoring_over_budget")
    honest_lost = [r["worker_id"] for r in records(run_dir, "worker_lost") if r["worker_id"] != SLOW_ID]
    stalls = [r["stall_s"] for r in records(run_dir, "coordinator_stalled")]
    slowest_s = max(prober.latencies_s, default=None)
    # the prober runs until the run has exited: count what failed while it was still training
    trained_until = max((r["time"] for r in records(run_dir, "train_step")), default=0.0)
    failures = sum(1 for t in prober.failed_at if t <= trained_until)
    result = {
        "survived": books["steps_trained"] == steps,
        "slow_completions_cut_off": sum(1 for r in over if r["worker_id"] == SLOW_ID),
        "honest_completions_cut_off": sum(1 for r in over if r["worker_id"] != SLOW_ID),
        "slow_worker_groups_trained": sum(r["groups_by_worker"].get(SLOW_ID, 0)
                                          for r in records(run_dir, "train_step")),
        "honest_workers_lost": honest_lost,
        "coordinator_stalls": len(stalls), "longest_stall_s": max(stalls, default=0.0),
        "probe_requests": len(prober.latencies_s), "probe_failures_while_training": failures,
        "slowest_probe_answer_s": round(slowest_s, 3) if slowest_s is not None else None,
        **{k: books[k] for k in ("prompts_handed_out", "prompts_trained", "rollouts_lost", "duplicates",
                                 "max_staleness", "steps_trained")},
    }
    result["goal_met"] = (result["survived"] and not honest_lost and result["slow_completions_cut_off"] > 0
                          and result["honest_completions_cut_off"] == 0 and books["rollouts_lost"] == 0
                          and books["duplicates"] == 0 and failures == 0
                          and slowest_s is not None and slowest_s < 1.0)
    return result
