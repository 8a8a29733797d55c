"""How the real coordinator holds up under N simulated workers.

For each N in --workers: a real `echo2 coordinator` process (the run config: --config, the
demo by default, with the benchmark's overrides below and --set), pinned to ONE core (its
scoring processes inherit the pinning); a fake learner (benchmarks/load/fake_learner.py: the
real learner's requests, real signed manifests, a sleep for each step) and client processes of
simulated workers (benchmarks/load/sim_worker.py: the real worker protocol over loopback, a
sleep for each generation and fetch), pinned to the other cores, the clients niced
(--client-nice) so that the learner, on its own machine in a real run, is not queued behind
them. The 100-worker case (the reference, --reference-workers) is always measured in the same
invocation, and each case's learner pace is given as a ratio to it.

Prints JSON (and writes benchmarks/results/coordinator_load.json with --save, or --out FILE):
per case, p50/p99 latency per request kind, errors by HTTP status and by timeout or connection
failure, the coordinator's evictions, expired leases, stalls and CPU (its process and its
children, per second), learner steps per minute and the ratio to the reference, the client
processes' own CPU and event-loop lag; with --mass-join, how long until the learner is back at
full pace after N workers register within one second, and whether any honest worker was
refused for slow scoring. Progress goes to stderr, one line per phase. Run dirs are kept under
runs/coordinator_load/.

    python benchmarks/coordinator_load.py --workers 100,300 --duration-s 60
    python benchmarks/coordinator_load.py --workers 1000 --mass-join --save

Benchmark overrides (recorded in the JSON): warmstart.steps=0 (the weights do not matter: the
workers are simulated), evaluation.where=learner (no evaluation leases; the fake learner
evaluates nothing), train.steps=1000000 (the run never ends by itself)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from load.provenance import provenance  # noqa: E402
from load.scenarios import CASE_RAW, CaseSettings, case_from_run_dir, progress, run_case  # noqa: E402

BENCH_OVERRIDES = ("warmstart.steps=0", "evaluation.where=learner", "train.steps=1000000")
RESULT = ROOT / "benchmarks" / "results" / "coordinator_load.json"
MASS_JOIN_RESULT = ROOT / "benchmarks" / "results" / "coordinator_load_mass_join.json"
MEASURES = ("src/echo2/coordinator", "!src/echo2/coordinator/scoring/agent_replay.py", "src/echo2/policy",
            "src/echo2/protocol", "src/echo2/broadcast/signing.py", "src/echo2/config", "benchmarks/load",
            "benchmarks/coordinator_load.py", "configs/demo.toml")
"""The code its results measure: a change to any of it since a result's commit makes the
result stale (benchmarks/check.py; `!` excludes a path)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="100,1000,3000,10000", help="N per case, comma-separated")
    p.add_argument("--duration-s", type=float, default=60.0, help="measured time per case")
    p.add_argument("--warmup-s", type=float, default=20.0, help="after every worker joined, before measuring")
    p.add_argument("--ramp-s", type=float, default=None,
                   help="joins spread over this long (default: N at the coordinator's 100 a second, at least 5 s)")
    p.add_argument("--leave-s", type=float, default=None,
                   help="leaves spread over this long after the measured time (default: N at the coordinator's 100 "
                        "joins a second, at least 5 s; 0: every worker at once)")
    p.add_argument("--mass-join", action="store_true", help="the mass-join scenario instead of the steady one")
    p.add_argument("--base-workers", type=int, default=100, help="mass join: the fleet running before the join")
    p.add_argument("--before-s", type=float, default=30.0, help="mass join: the pace measured before the join")
    p.add_argument("--reference-workers", type=int, default=100, help="the case ratios are given against")
    p.add_argument("--train-s", type=float, default=1.0,
                   help="the fake learner's step: about one version a second (the demo's training alone measured "
                        "0.25-0.38 s a step: --train-s 0.3 publishes about twice as often)")
    p.add_argument("--gen-s", default="0.3,1.0", help="simulated generation time per lease: MIN,MAX seconds")
    p.add_argument("--fetch-s", default="0.1,0.3", help="simulated version fetch after its news: MIN,MAX seconds")
    p.add_argument("--tasks-per-lease", type=int, default=2)
    p.add_argument("--correct-fraction", type=float, default=0.5, help="share of completions that are right")
    p.add_argument("--workers-per-client", type=int, default=2000, help="simulated workers per client process")
    p.add_argument("--workers-per-address", type=int, default=1, help="workers sharing one loopback source address")
    p.add_argument("--coordinator-cores", default="0")
    p.add_argument("--client-cores", default="1", help="the fake learner's and the clients' cores")
    p.add_argument("--client-nice", type=int, default=5,
                   help="niceness of the client processes: they stand for remote machines, so the fake learner, "
                        "which shares their core here, runs first when both are ready (0: equal)")
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.toml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run config field for the coordinator (repeatable)")
    p.add_argument("--save", action="store_true", help=f"also write {RESULT.relative_to(ROOT)} (with --mass-join: "
                                                       f"{MASS_JOIN_RESULT.relative_to(ROOT)})")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--rebuild", metavar="RUN_ROOT", help="make the JSON again from an earlier invocation's run dirs "
                                                          "(runs/coordinator_load/STAMP) instead of running")
    return p.parse_args(argv)


def _cores(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out |= set(range(int(low), int(high or low) + 1))
    return frozenset(out)


def _pair(text: str) -> list[float]:
    low, high = (float(x) for x in text.split(","))
    return [low, high]


def case_settings(args: argparse.Namespace, runs_root: Path) -> CaseSettings:
    sim = {"gen_s": _pair(args.gen_s), "fetch_s": _pair(args.fetch_s), "tasks_per_lease": args.tasks_per_lease,
           "correct_fraction": args.correct_fraction}
    return CaseSettings(config=args.config, overrides=(*BENCH_OVERRIDES, *args.overrides), duration_s=args.duration_s,
                        warmup_s=args.warmup_s, ramp_s=args.ramp_s, leave_s=args.leave_s, before_s=args.before_s,
                        base_workers=args.base_workers, train_s=args.train_s, sim=sim,
                        workers_per_client=args.workers_per_client, workers_per_address=args.workers_per_address,
                        coordinator_cores=_cores(args.coordinator_cores), client_cores=_cores(args.client_cores),
                        runs_root=runs_root, client_nice=args.client_nice)


def cases(args: argparse.Namespace) -> list[int]:
    """The N to run, the reference first (measured in this invocation whatever --workers says)."""
    asked = [int(x) for x in args.workers.split(",") if x.strip()]
    return [args.reference_workers] + [n for n in asked if n != args.reference_workers]


def run_all(args: argparse.Namespace, argv: list[str]) -> dict:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs_root = ROOT / "runs" / "coordinator_load" / stamp
    settings = case_settings(args, runs_root)
    os.sched_setaffinity(0, settings.client_cores)  # the harness (mostly asleep) keeps off the coordinator's core
    result = {"benchmark": "coordinator_load", "provenance": provenance(ROOT, argv),
              "settings": _settings_json(args, settings), "cases": []}
    scenario = "mass_join" if args.mass_join else "steady"
    for n in cases(args):
        progress(f"{scenario} N={n}: starting (run dir {runs_root / f'{scenario}-n{n}'})")
        try:
            section = run_case(settings, scenario, n, runs_root / f"{scenario}-n{n}")
        except KeyboardInterrupt:  # its processes are stopped already (run_case's finally): report what ran
            progress(f"{scenario} N={n}: interrupted; every process it started is stopped")
            result["cases"].append({"scenario": scenario, "workers": n, "error": "interrupted"})
            break
        except Exception as exc:  # noqa: BLE001  one broken case is reported; the others still run
            progress(f"{scenario} N={n}: FAILED: {exc}")
            section = {"scenario": scenario, "workers": n, "error": str(exc)[-3000:]}
        result["cases"].append(section)
        progress(f"{scenario} N={n}: {_one_line(section)}")
        _finish(result, args.reference_workers)
        (runs_root / "result.json").write_text(json.dumps(result, indent=2))  # kept case by case
    _finish(result, args.reference_workers)
    result["provenance"]["load_average_end"] = list(os.getloadavg())
    return result


def rebuild(args: argparse.Namespace) -> dict:
    """The JSON of an earlier invocation, its cases' sections made again from their run dirs."""
    root = Path(args.rebuild)
    result = json.loads((root / "result.json").read_text())
    for index, case in enumerate(result["cases"]):
        run_dir = Path(case.get("run_dir") or root / f"{case['scenario']}-n{case['workers']}")
        if (run_dir / CASE_RAW).is_file():
            result["cases"][index] = case_from_run_dir(run_dir)
    _finish(result, result["settings"]["reference_workers"])
    result["provenance"]["rebuilt"] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)}
    return result


def _finish(result: dict, reference: int) -> None:
    _add_ratios(result["cases"], reference)
    result["table"] = [_row(c) for c in result["cases"]]


def _settings_json(args: argparse.Namespace, settings: CaseSettings) -> dict:
    config = Path(args.config).resolve()
    return {"config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT)
            else args.config, "overrides": list(settings.overrides), "benchmark_overrides": list(BENCH_OVERRIDES),
            "duration_s": args.duration_s, "warmup_s": args.warmup_s, "ramp_s": args.ramp_s, "leave_s": args.leave_s,
            "train_s": args.train_s, "simulated_worker": settings.sim, "workers_per_client": args.workers_per_client,
            "workers_per_address": args.workers_per_address, "coordinator_cores": sorted(settings.coordinator_cores),
            "client_cores": sorted(settings.client_cores), "client_nice": settings.client_nice,
            "reference_workers": args.reference_workers,
            "mass_join": {"base_workers": args.base_workers, "before_s": args.before_s} if args.mass_join else None,
            "notes": ["latency percentiles are over answered requests (any status); timeouts and connection errors "
                      "are counted under errors only",
                      "heartbeat: latency (answered at once); news_line: the time to open a worker's news line; "
                      "version_news: publish (learner clock) to the news line carrying it to the worker",
                      "lease: raw latency, including the coordinator holding a refused lease up to its wait_s (5 s); "
                      "lease_served: the same less the time held waiting for room (the X-Echo2-Held-S header)",
                      "batch: the learner's long poll, including the wait for rollouts",
                      "simulated workers advertise relay addresses that nobody serves and fetch no bytes",
                      "every worker has its own loopback source address unless workers_per_address > 1",
                      "grpo.drop_uninformative_groups stays as configured (on in the demo): correct_fraction of the "
                      "completions are the right sum, so few groups score alike (worker_counts.rollout_uninformative)"]}


def _add_ratios(sections: list[dict], reference: int) -> None:
    ref = next((c for c in sections if c.get("workers") == reference and "learner" in c), None)
    pace = ref["learner"]["steps_per_min"] if ref else None
    for c in sections:
        if "learner" in c:
            c["learner"]["ratio_vs_reference"] = round(c["learner"]["steps_per_min"] / pace, 3) if pace else None


def _row(c: dict) -> dict:
    if "error" in c:
        return {"workers": c["workers"], "error": c["error"][:200]}
    lat, errors = c["latency_ms"], c["errors"]
    return {"workers": c["workers"], "heartbeat_p50_ms": lat["heartbeat"]["p50_ms"],
            "heartbeat_p99_ms": lat["heartbeat"]["p99_ms"], "lease_p99_ms": lat["lease"]["p99_ms"],
            "lease_served_p99_ms": lat.get("lease_served", {}).get("p99_ms"),
            "rollout_p99_ms": lat["rollout"]["p99_ms"],
            "errors": sum(n for kind in errors.values() for n in kind.values()),
            "registrations_deferred": c.get("deferred", {}).get("register", 0),
            "leases_expired": c["coordinator"]["leases_expired"],
            "version_news_p99_ms": lat.get("version_news", {}).get("p99_ms"),
            "evictions": c["coordinator"]["evictions"], "stalls": c["coordinator"]["stalls"]["count"],
            "stall_max_s": c["coordinator"]["stalls"]["max_s"],
            "coordinator_cpu_s_per_s": c["coordinator"]["cpu_s_per_s"],
            "steps_per_min": c["learner"]["steps_per_min"],
            "ratio_vs_reference": c["learner"].get("ratio_vs_reference"),
            "client_cpu_s_per_s": c["clients"]["cpu_s_per_s"],
            "client_lag_p99_ms": c["clients"]["loop_lag_ms"]["p99_ms"],
            "client_lag_max_ms": c["clients"]["loop_lag_ms"]["max_ms"],
            "others_on_coordinator_cores_s_per_s": c.get("others_on_coordinator_cores_s_per_s"),
            "others_on_client_cores_s_per_s": c.get("others_on_client_cores_s_per_s"),
            **({"recovery_s": c["mass_join"]["recovery_s"]} if "mass_join" in c else {})}


def _one_line(c: dict) -> str:
    if "error" in c:
        return "failed"
    try:
        r = _row(c)
    except (KeyError, TypeError) as exc:  # a report bug must not lose the cases still to run
        return f"(no summary: {exc!r})"
    return (f"heartbeat p50/p99 {r['heartbeat_p50_ms']}/{r['heartbeat_p99_ms']} ms, lease p99 {r['lease_p99_ms']} ms "
            f"(served {r['lease_served_p99_ms']} ms), "
            f"rollout p99 {r['rollout_p99_ms']} ms, news p99 {r['version_news_p99_ms']} ms, errors {r['errors']} "
            f"(registrations deferred {r['registrations_deferred']}), evictions {r['evictions']}, stalls "
            f"{r['stalls']}, coordinator CPU {r['coordinator_cpu_s_per_s']}, {r['steps_per_min']} steps/min, clients "
            f"CPU {r['client_cpu_s_per_s']} lag p99 {r['client_lag_p99_ms']} ms; other processes on the coordinator's "
            f"core {r['others_on_coordinator_cores_s_per_s']} CPU s/s")


def saved_path(args: argparse.Namespace) -> Path:
    """Where --save writes: each scenario its own file, so a mass join never replaces the steady cases."""
    return MASS_JOIN_RESULT if args.mass_join else RESULT


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    # Ctrl-C, and a plain `kill`, stop the case in progress through its cleanup (whatever the
    # shell that started us did with SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    result = rebuild(args) if args.rebuild else run_all(args, argv)
    text = json.dumps(result, indent=2)
    print(text)
    for path in ([saved_path(args)] if args.save else []) + ([Path(args.out)] if args.out else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        progress(f"written to {path}")
    return 0 if all("error" not in c for c in result["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
