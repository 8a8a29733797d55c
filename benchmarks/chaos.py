"""Chaos: a real `echo2 run` while faults are injected on a schedule, next to a clean run of the
same config. Faults: a worker SIGKILLed, another SIGKILLed just as a version starts to spread
(its relay dies mid-broadcast), a relay that corrupts every chunk it serves, a worker returning
tokens it never sampled (the liar: random tokens, caught by the log-prob comparison), a worker
choosing its tokens and reporting their true log-probs (the chooser: caught by the seeded
sampler's check), and a flood of bad requests from another address. Then a second run, the
slow-answer scenario (chaos_slow.py): a worker sending answers math-verify takes seconds over, on
the same problems as a math-verify task. Prints JSON:

- faults injected, and whether the run survived them (every step trained, exit 0);
- bad requests sent, rejected, and any accepted (must be 0) or answered with a 5xx (0);
- rollouts lost (prompts handed out that were neither trained, dropped as stale, nor still
  queued or buffered at the end: must be 0) and duplicates (prompts trained twice: 0);
- the largest staleness trained (<= S);
- the rollout audit: whether the liar and the chooser were quarantined (or, credited nothing
  once their groups failed, idled by the controller before a second failure), how many of their
  groups reached a batch and how many were trained (goal: each quarantined or none of its
  groups trained), and the honest groups audited and failed (the false-positive count);
- held-out accuracy of the chaos run against the clean one (goal: within 3 points);
- `slow_answers`: the slow-answer run's outcome (chaos_slow.py: its completions cut off, no
  honest worker lost, the coordinator answering within 1 s throughout, nothing lost).

    .venv/bin/python benchmarks/chaos.py [--config configs/demo.toml] [--steps 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the adversaries live with the reliability tests
sys.path.insert(0, str(ROOT / "benchmarks"))

from chaos_slow import slow_answer_run  # noqa: E402
from tests.integration.runs import coordinator_url, last_step, records, wait_for  # noqa: E402
from tests.reliability.accounting import accounting  # noqa: E402
from tests.reliability.flood import flood  # noqa: E402

TOKEN = "chaos-join-token-0123456789"


HOSTILE = (("liar", "tests.reliability.lying_worker", {}),
           ("chooser", "tests.reliability.lying_worker", {"ECHO2_LIE": "choose"}),
           ("corrupter", "tests.reliability.corrupting_worker", {}))
LIARS = ("liar", "chooser")


def _start(args: list[str], log: Path, module: str = "echo2", env_extra: dict | None = None) -> subprocess.Popen:
    handle = open(log, "ab")
    env = {**os.environ, "ECHO2_AUTH_TOKEN": TOKEN, **(env_extra or {})}
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    handle.close()
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _run_args(config: str, run_dir: Path, steps: int) -> list[str]:
    return ["run", "--config", config, "--set", f"run_dir={run_dir}", "--set", f"train.steps={steps}",
            "--set", "coordinator.heartbeat_interval_s=0.5", "--set", "coordinator.worker_timeout_s=3"]


def clean_run(config: str, run_dir: Path, steps: int) -> dict:
    proc = _start(_run_args(config, run_dir, steps), run_dir.parent / f"{run_dir.name}.log")
    if proc.wait(timeout=3600) != 0:
        raise RuntimeError(f"the clean run failed: see {run_dir.parent / (run_dir.name + '.log')}")
    return json.loads((run_dir / "summary.json").read_text())


class Flood(threading.Thread):
    def __init__(self, url: str, duration_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.duration_s = url, duration_s
        self.result: dict = {}
        self.stop = threading.Event()

    def run(self) -> None:
        self.result = asyncio.run(flood(self.url, TOKEN, self.duration_s, stop=self.stop))


def chaos_run(config: str, run_dir: Path, steps: int) -> dict:
    logs = run_dir.parent
    faults: dict[str, int] = {}
    run = _start(_run_args(config, run_dir, steps), logs / f"{run_dir.name}.log")
    hostile: list[subprocess.Popen] = []
    try:
        url = wait_for(lambda: coordinator_url(run_dir), 600, "the coordinator", alive=run)
        metrics = str(run_dir / "metrics.jsonl")
        for name, module, env in HOSTILE:
            # the adversary modules are `echo2 worker` themselves: they take its arguments
            hostile.append(_start(["--coordinator", url, "--metrics", metrics, "--set", f"worker_id={name}"],
                                  logs / f"{run_dir.name}-{name}.log", module=module, env_extra=env))
        faults["lying_worker"] = faults["token_choosing_worker"] = faults["corrupting_relay"] = 1
        flooder = Flood(url, duration_s=24 * 3600)  # stopped when the run ends
        flooder.start()
        wait_for(lambda: (run_dir / "pids.json").is_file(), 600, "the workers to start", alive=run)
        pids = json.loads((run_dir / "pids.json").read_text())
        wait_for(lambda: last_step(run_dir) >= steps // 10, 1800, f"step {steps // 10}", alive=run)
        os.kill(pids["worker-0"], signal.SIGKILL)
        faults["worker_kill"] = 1
        wait_for(lambda: last_step(run_dir) >= steps // 3, 1800, f"step {steps // 3}", alive=run)
        published = len(records(run_dir, "version_published"))
        wait_for(lambda: len(records(run_dir, "version_published")) > published, 600, "a new version", alive=run)
        os.kill(pids["worker-1"], signal.SIGKILL)  # mid-broadcast: its children fail over
        faults["worker_kill_during_broadcast"] = 1
        code = run.wait(timeout=3600)
        flooder.stop.set()
        flooder.join(timeout=30)
        if code != 0:
            raise RuntimeError(f"the chaos run failed: see {logs / (run_dir.name + '.log')}")
        faults["request_flood"] = 1
        liar, chooser, corrupter = hostile
        codes = {"liar": liar.poll(), "chooser": chooser.poll()}  # quarantined workers exit by themselves
        _stop(corrupter)  # kept out of the broadcast, but its rollouts are honest: it runs to the end
        return {"faults": faults, "flood": flooder.result, "liar_exit_codes": codes}
    finally:
        for proc in [run, *hostile]:
            _stop(proc)


def audit_outcome(run_dir: Path) -> dict:
    audits = records(run_dir, "audit")
    honest = [s for a in audits for w, s in a["by_worker"].items() if w not in LIARS]
    out = {name: _liar_outcome(run_dir, audits, name) for name in LIARS}
    return {**out,
            "honest_groups_audited": sum(s["audited"] for s in honest),
            "honest_groups_failed": sum(s["failed"] for s in honest),
            "honest_max_mean_abs_logprob_diff": max((s["max_passed_diff"] for s in honest), default=None),
            "corrupt_relay_reports": sum(1 for r in records(run_dir, "bad_peer") if r.get("peer_id") == "corrupter"
                                         and r.get("role") == "coordinator")}


def _liar_outcome(run_dir: Path, audits: list[dict], name: str) -> dict:
    quarantined = [q for q in records(run_dir, "worker_quarantined") if q["worker_id"] == name]
    cut_at = quarantined[0]["time"] if quarantined else float("inf")
    mine = [a["by_worker"][name] for a in audits if name in a["by_worker"]]
    trained = records(run_dir, "train_step")
    trained_groups = sum(r["groups_by_worker"].get(name, 0) for r in trained)
    # a worker whose audited groups failed is also credited nothing (policy.credit) and idled by
    # the controller: it may then never reach flags_to_quarantine, and none of its groups trains
    return {"quarantined": bool(quarantined), "reason": quarantined[0]["reason"] if quarantined else None,
            "neutralised": bool(quarantined) or trained_groups == 0,
            "groups_audited_before_quarantine": sum(s["audited"] for s in mine),
            "groups_failed": sum(s["failed"] for s in mine),
            "groups_trained": trained_groups,
            "batches_assigned_before_quarantine": len([r for r in records(run_dir, "batch_assigned")
                                                       if r["time"] <= cut_at])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/demo.toml"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--slow-steps", type=int, default=40, help="steps of the slow-answer run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/chaos_cpu.json"))
    args = parser.parse_args()
    from echo2.config.run import load_run_config

    max_staleness = load_run_config(args.config).train.max_staleness
    base = ROOT / "runs" / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}"
    base.mkdir(parents=True)
    started = time.perf_counter()
    clean = clean_run(args.config, base / "clean", args.steps)
    clean_s = time.perf_counter() - started
    injected = chaos_run(args.config, base / "chaos", args.steps)
    chaos_summary = json.loads((base / "chaos" / "summary.json").read_text())
    books = accounting(base / "chaos", max_staleness)
    result = {
        "benchmark": "chaos", "config": args.config, "steps": args.steps, "run_dirs": str(base),
        "faults_injected": injected["faults"],
        "survived": books["steps_trained"] == args.steps,
        "liar_exit_codes": injected["liar_exit_codes"],
        "bad_requests": injected["flood"],
        **books,
        "audit": audit_outcome(base / "chaos"),
        "accuracy_before": chaos_summary["accuracy_before"],
        "accuracy_after_chaos": chaos_summary["accuracy_after"],
        "accuracy_after_clean": clean["accuracy_after"],
        "learner_wall_s_chaos": chaos_summary["learner_wall_s"], "learner_wall_s_clean": clean["learner_wall_s"],
        "clean_run_s": clean_s,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")  # kept should the slow-answer run fail
    result["slow_answers"] = slow_answer_run(args.config, base, args.slow_steps, start=_start, stop=_stop,
                                             token=TOKEN)
    result["goal_met"] = (result["slow_answers"]["goal_met"] and result["survived"]
                          and books["rollouts_lost"] == 0 and books["duplicates"] == 0
                          and books["max_staleness"] <= max_staleness
                          and result["bad_requests"].get("accepted", 0) == 0
                          and result["bad_requests"].get("server_errors", 0) == 0
                          and all(result["audit"][name]["neutralised"] for name in LIARS)
                          and result["audit"]["honest_groups_failed"] == 0
                          and abs(result["accuracy_after_chaos"] - result["accuracy_after_clean"]) <= 0.03)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
