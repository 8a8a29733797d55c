"""The ssh fleet's bill: the same run over hosts reached by SSH (real sshds on loopback, root),
once with online activation (the controller releases the workers it does not need, and acquires
them again on demand) and once with every host held for the whole run. Prints JSON.

    python benchmarks/fleet_ssh.py run --mode online --seed 0     # one run (a few minutes)
    python benchmarks/fleet_ssh.py run --mode held --seed 0
    python benchmarks/fleet_ssh.py report > benchmarks/results/fleet_ssh.json   # again: rebuilt from the runs

The hosts are priced and paced as classes of configs/catalog/example.toml: each host's price is
its class's, and its worker is slowed (worker.slowdown) so that the workers' speeds keep the
classes' tokens/s proportions. Together they offer more than the learner needs. Every run records
its provenance; the report pairs only runs of one commit with a clean tree, and rebuilds the
result from the run dirs (`report` again after a crash loses nothing). Each run is
configs/demo.toml's job (the tiny model, 2-digit addition) with the workers on the hosts instead
of local processes. For each run: what the fleet billed (billed
seconds x price, from acquire to release, boot included, from the run's ledger) per learner step
and per trained group, learner utilization and held-out accuracy; the report pairs the modes seed
by seed and states the goal (online: at least 30% lower billed $/step, learner utilization within
5 points).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks.load.provenance import provenance  # noqa: E402
from tests.integration.runs import to_toml  # noqa: E402
from tests.sshd import running_sshd, sshd_unavailable_reason  # noqa: E402

from echo2.config.catalog import load_plan_config  # noqa: E402
from echo2.config.inventory import load_inventory  # noqa: E402
from echo2.config.sim import ScenarioConfig  # noqa: E402
from echo2.launch.ssh_client import SshClient  # noqa: E402
from echo2.launch.ssh_host import ensure_installed  # noqa: E402
from echo2.launch.wheel import coordinator_release  # noqa: E402
from echo2.report.metrics import read_metrics  # noqa: E402
from echo2.sim.simulator import simulate  # noqa: E402

CATALOG = ROOT / "configs" / "catalog" / "example.toml"
CONFIG = ROOT / "configs" / "demo.toml"
WORK = ROOT / "runs" / "fleet_ssh"
RESULTS = WORK / "results"
HOSTS = [("h100", "h100_spot"), ("a100", "a100_spot"), ("l40s", "l40s_spot"), ("rtx4090-a", "rtx4090_dc"),
         ("rtx4090-b", "rtx4090_dc")]
STEPS = 100
PROFILE_STEPS = 10
"""Learner steps per segment of the replayed uninformative share (sim.workload_profile)."""
MODEL_LOADED = re.compile(r"model loaded from \S+ in ([0-9.]+) s")
MEASURES = ("src/echo2/policy", "src/echo2/launch", "src/echo2/sim", "src/echo2/report/fleet_ledger.py",
            "src/echo2/coordinator/desks/fleet.py", "src/echo2/coordinator/desks/learner.py", "src/echo2/config/sim.py",
            "src/echo2/config/activation.py", "src/echo2/config/inventory.py", "src/echo2/config/worker.py",
            "configs/demo.toml", "configs/catalog/example.toml", "benchmarks/fleet_ssh.py")
SCALE_DOWN_AFTER_S, RELEASE_AFTER_S = 30.0, 15.0
"""A machine here boots in 5-15 s (SSH, then the worker's imports and model load, each a process on
a loaded 2-core box): a worker is released only after idling longer than a boot, and a cheaper set
replaces a covering one only after a few boots' time (with 5 and 10 s, the first try switched sets
every 10-20 s and starved the learner during each replacement's boot: 27% saving, 12 points of
utilization lost)."""
FASTEST_SLOWDOWN = 3.0
"""worker.slowdown of the fastest class (the others' keep the catalog's tokens/s proportions),
paced by CPU time (worker.slowdown_clock = "cpu"): the five workers share one core, and at 1
(wall clock) a worker's speed moved as the controller acquired and released the others, so its
measured rate did too and the controller flapped (three hosts acquired 3 times each in one run).
At 3 the five need about 0.7 of the core, and each keeps its class's pace however many run."""
LEARNER_SLOWDOWN = 9.0
"""learner.slowdown (also CPU-clocked): the tiny model's learner paced so that the five hosts
together offer about twice the rollouts it needs on either seed. The need depends on the base
model: dynamic sampling drops a group whose completions are all right, and seed 1's warm-started
model (0.82 held-out at the start, against seed 0's 0.44) has half of its groups dropped, so it
needs twice the rollouts per step. At 5, seed 1 needed about all five hosts (online billed 4% less
per step than held) and seed 0 a third of them (26% less)."""
RUN_TIMEOUT_S = 900
LEARNER_CORES = 1
"""Cores for the learner's side (coordinator, learner, launcher); the hosts' sshds, and so the
workers they start, get the rest. Rented machines do not share the learner's CPU: on one shared
box, every worker the controller activated slowed the learner, so demand fell as the fleet grew
and rose as it shrank, and the controller chased its own shadow (one host acquired 3 times in a
run)."""
SAVING_GOAL, UTILIZATION_POINTS = 0.30, 0.05


def host_classes() -> list[dict]:
    """Each host: its class's price, and a slowdown that keeps the classes' tokens/s proportions."""
    catalog = load_plan_config(CATALOG).workers
    fastest = max(catalog[c].tokens_per_s for _, c in HOSTS)
    return [{"name": name, "worker_class": cls, "price_per_hour": catalog[cls].price_per_hour,
             "worker": {"slowdown": round(FASTEST_SLOWDOWN * fastest / catalog[cls].tokens_per_s, 3),
                        "slowdown_clock": "cpu", "torch_threads": 1}} for name, cls in HOSTS]


def write_inventory(path: Path, sshds: list, work: Path) -> Path:
    hosts = [{**entry, "address": sshd.address, "port": sshd.port, "key_file": str(sshd.user_key),
              "known_hosts_file": str(sshd.known_hosts), "python": sys.executable,
              "work_dir": str(work / entry["name"]), "min_free_mb": 1}
             for entry, sshd in zip(host_classes(), sshds, strict=True)]
    path.write_text(to_toml({"hosts": hosts}))
    return path


def preinstall(inventory: Path) -> None:
    """Install this echo2 on every host before the runs, so neither mode pays the first install."""
    release = coordinator_release(WORK / "cache")
    for host in load_inventory(inventory).hosts:
        ensure_installed(SshClient(host), release)


def one_run(mode: str, seed: int, steps: int) -> dict:
    reason = sshd_unavailable_reason()
    if reason:
        raise SystemExit(f"fleet_ssh needs real sshds: {reason}")
    name = f"{mode}_s{seed}"
    run_dir = WORK / name
    subprocess.run(["rm", "-rf", str(run_dir), str(WORK / "sshd")], check=True)  # fresh keys for fresh sshds
    learner_cores, host_cores = split_cores()
    with contextlib.ExitStack() as stack:
        os.sched_setaffinity(0, host_cores)  # the sshds (and every worker they start) inherit it
        sshds = [stack.enter_context(running_sshd(WORK / "sshd" / h)) for h, _ in HOSTS]
        os.sched_setaffinity(0, learner_cores)  # and `echo2 run` this
        for sshd in sshds:
            sshd.trust()
        inventory = write_inventory(WORK / "hosts.toml", sshds, WORK / "hosts")
        preinstall(inventory)
        overrides = [f"run_dir=\"{run_dir}\"", f"cache_dir=\"{WORK / 'cache'}\"", f"seed={seed}",
                     f"train.steps={steps}", f"train.eval_every={steps}", "train.checkpoint_every=100000",
                     "report.plots=false", "report.tensorboard=false", f"activation.release_after_s={RELEASE_AFTER_S}",
                     f"activation.scale_down_after_s={SCALE_DOWN_AFTER_S}",
                     f"learner.slowdown={LEARNER_SLOWDOWN}", "learner.slowdown_clock=\"cpu\"",
                     f"activation.enabled={'true' if mode == 'online' else 'false'}"]
        args = [sys.executable, "-m", "echo2", "run", "--config", str(CONFIG), "--provider", "ssh", "--inventory",
                str(inventory), *[a for o in overrides for a in ("--set", o)]]
        started = time.time()
        with open(WORK / f"{name}.log", "wb") as log:
            done = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S,
                                  env={**os.environ, "COLUMNS": "160"})
        wall_s = time.time() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}): see {WORK / f'{name}.log'}")
    return {**measured(mode, seed, run_dir, wall_s),
            "cores": {"learner": sorted(learner_cores), "hosts": sorted(host_cores)}}


def run_provenance(argv: list[str]) -> dict:
    """This run's provenance; a dirty tree is refused, as the report pairs clean runs only."""
    made = provenance(ROOT, argv)
    if made["git_dirty"]:
        raise SystemExit("fleet_ssh: the tree has uncommitted changes outside benchmarks/results: "
                         "commit them (or run in a worktree at a commit) so the run says what it measured")
    return made


def split_cores() -> tuple[set[int], set[int]]:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= LEARNER_CORES:
        raise SystemExit(f"fleet_ssh needs more than {LEARNER_CORES} core(s): the hosts get their own")
    return set(cores[:LEARNER_CORES]), set(cores[LEARNER_CORES:])


def measured(mode: str, seed: int, run_dir: Path, wall_s: float) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    fleet = summary["fleet"]
    return {
        "mode": mode, "seed": seed, "steps": summary["steps"], "wall_s": round(wall_s, 1),
        "billed_usd": fleet["billed_usd"], "billed_machine_s": fleet["billed_s"],
        "billed_usd_per_step": fleet["billed_usd_per_step"], "billed_usd_per_group": fleet["billed_usd_per_group"],
        "groups_trained": fleet["groups_trained"],
        "learner_utilization": summary["learner_utilization"],
        "learner_utilization_steady": summary["learner_utilization_steady"],
        "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
        "billed_by_worker": {w: {"class": b["worker_class"], "billed_s": round(b["billed_s"], 1),
                                 "billed_usd": b["billed_usd"], "acquires": b["acquires"]}
                             for w, b in fleet["billed_by_worker"].items()},
        "released": summary["fleet"]["released"], "acquired": summary["fleet"]["acquired"],
        "boot_s": summary["fleet"]["rejoin_s"],
    }


def sim_scenario(online_dir: Path, activation: str, seed: int, workload_dir: Path | None = None) -> ScenarioConfig:
    """The same fleet for `echo2 sim`: each host's rollouts/s as the online run's controller
    measured it (median of its estimates over the run), and from the run being predicted
    (`workload_dir`, default the online run): each host's boot time (acquire to registration: its
    first, which installs the wheel, and the median of later ones) and model load after
    registering (`engine_starts`), the share of trained groups the audit checked (a worker's rate
    counts once two of its groups passed), with the hosts' prices and the run's activation
    settings. The learner's step times and the share of scored groups dropped as uninformative
    are replayed by step (`workload_profile`): both drift as the policy learns, and the
    controller's demand with them; and the learner's pace differs between runs (its core also runs
    the coordinator and the launcher, busier under online activation: seed 1's online learner took
    3.5 s a step, its held one 2.6 s), which the bill per step follows and the simulator cannot
    know, so each mode is predicted from its own run's workload."""
    run_dir = workload_dir or online_dir
    cfg = json.loads((run_dir / "config.json").read_text())
    rows = read_metrics(run_dir / "metrics.jsonl")
    counters = [r for r in rows if r["kind"] == "coordinator_final"][-1]["counters"]
    steps = [r for r in rows if r["kind"] == "train_step" and r["step"] >= 1]
    estimates: dict[str, list[float]] = {}
    for r in read_metrics(online_dir / "metrics.jsonl"):
        if r["kind"] == "activation" and r["role"] == "coordinator":
            for worker_id, rate in (r.get("estimates_rps") or {}).items():
                estimates.setdefault(worker_id, []).append(rate)
    audited = sum(r["groups_audited"] for r in rows if r["kind"] == "audit")
    boots: dict[str, list[float]] = {}
    for r in rows:
        if r["kind"] == "worker_rejoined":
            boots.setdefault(r["worker_id"], []).append(r["rejoin_s"])
    workers = {}
    for entry in host_classes():
        worker_id = f"{entry['name']}-0"
        first, *again = boots[worker_id]  # a host's first acquire installs the wheel; later ones reuse it
        workers[entry["name"]] = {
            "count": 1, "price_per_hour": entry["price_per_hour"], "bandwidth_bps": 1e10,
            "rollouts_per_s": statistics.median(estimates[worker_id]),
            # every acquire boots (the first one too), billed from the acquire
            "start_delay_s": first, "boot_s": statistics.median(again or [first]),
            "engine_start_s": statistics.median(engine_starts(run_dir, entry["name"], worker_id)),
            "tasks_per_lease": cfg["workers"]["worker"]["tasks_per_lease"],
        }
    a = cfg["activation"]
    step_s = [r["train_s"] + r["publish_s"] for r in steps]
    profile = workload_profile(rows)
    return ScenarioConfig.model_validate({
        "name": f"fleet_ssh_{activation}",
        "learner": {"price_per_hour": cfg["learner"]["price_per_hour"], "uplink_bps": 1e12},
        "workers": workers,
        "workload": {"params": 1e6, "prompts_per_step": cfg["grpo"]["prompts_per_step"],
                     "uninformative_share": counters["dropped_uninformative"] / max(1, counters["scored"]),
                     "group_size": cfg["sampling"]["group_size"], "step_time_s": statistics.mean(step_s),
                     "max_staleness": cfg["train"]["max_staleness"], "generation_time_s": 0.0},
        "broadcast": {"topology": "ideal", "hop_latency_s": 0.0},
        "activation": {"provider": "ssh",  # the measured run's: the same FleetSync rule, simulated machines
                       **{k: a[k] for k in ("control_period_s", "headroom", "margin", "ewma_alpha",
                                            "scale_down_after_s", "min_samples", "probation_slots",
                                            "probation_timeout_s", "release_after_s", "max_worker_share")}},
        # a simulated run that has not finished in 10 times the real one's wall time has stalled;
        # the run had no [activation] catalog, so the simulated controller prices by measured rates too
        "sim": {"steps": cfg["train"]["steps"], "seed": seed, "activation": activation, "online_pricing": "measured",
                "max_sim_s": 10 * (steps[-1]["time"] - rows[0]["time"]),
                # the run's audit: a worker's rate counted once 2 of its groups passed
                "audit_share": min(1.0, audited / max(1, counters["trained"])),
                "step_time_cv": 0.0, "workload_profile": profile},  # every step's own time
    })


def engine_starts(run_dir: Path, host: str, worker_id: str) -> list[float]:
    """Seconds each start of the worker took to load its model after registering, from its log
    on the host ("model loaded from ... in 11.2 s"): five first starts together on the hosts'
    one core took 11 to 12 s, a later one alone 3 to 7 s."""
    logs = sorted((WORK / "hosts" / host / "runs").glob(f"{run_dir.name}-*/{worker_id}.log"))
    found = [float(m.group(1)) for log in logs for m in MODEL_LOADED.finditer(log.read_text())]
    if not found:
        raise SystemExit(f"fleet_ssh: no 'model loaded' line in {worker_id}'s log under {WORK / 'hosts' / host}")
    return found


def workload_profile(rows: list[dict]) -> list[dict]:
    """The run's workload by learner step: each step's own time (the controller's demand estimate
    follows them: seed 0's first steps took 1.5 s against 2.9 s on average, and its controller
    kept the dearest hosts until its estimate caught up) and, per PROFILE_STEPS steps, the share
    of scored groups dropped as uninformative (a group is dropped at the learner step it arrived
    in; a single step's 16 groups say too little)."""
    steps = [r for r in rows if r["kind"] == "train_step"]
    dropped: dict[int, int] = {}
    for r in rows:
        if r["kind"] == "groups_dropped" and r["reason"] == "uninformative":
            segment = r["step"] // PROFILE_STEPS
            dropped[segment] = dropped.get(segment, 0) + len(r["prompt_indices"])
    trained: dict[int, int] = {}
    for r in steps:
        trained[r["step"] // PROFILE_STEPS] = trained.get(r["step"] // PROFILE_STEPS, 0) + len(r["prompt_indices"])
    return [{"from_step": r["step"], "step_time_s": r["train_s"] + r["publish_s"],
             "uninformative_share": dropped.get(segment, 0) / max(1, trained[segment] + dropped.get(segment, 0))}
            for r in steps for segment in [r["step"] // PROFILE_STEPS]]


def sim_prediction(online_dir: Path, held_dir: Path, seed: int) -> dict:
    """The simulator's billed $/step for the same fleet, online activation against every host
    active for the whole run (each with its own run's workload), and the saving it predicts."""
    per_step, finished, scenarios = {}, {}, {}
    for activation, run_dir in (("online", online_dir), ("all", held_dir)):
        scenario = sim_scenario(online_dir, activation, seed, workload_dir=run_dir)
        simulated = simulate(scenario)
        per_step[activation], finished[activation] = simulated.billed_usd_per_step, simulated.finished
        scenarios[activation] = scenario.model_dump(mode="json", exclude_unset=True)  # loads again as given
    both = all(finished.values())
    return {"billed_usd_per_step_online": per_step["online"], "billed_usd_per_step_held": per_step["all"],
            "finished": finished,  # a simulated run that stalled predicts nothing
            "scenarios": scenarios,  # `echo2 sim` reruns either without the run dirs
            "saving_per_step": round(1 - per_step["online"] / per_step["all"], 4) if both else None}


def same_commit_runs() -> list[dict]:
    """The runs under RESULTS, all of one commit with a clean tree (a result never mixes commits)."""
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    commits = {(r.get("provenance") or {}).get("git_commit") for r in runs}
    if len(commits) != 1 or None in commits or any(r["provenance"]["git_dirty"] for r in runs):
        raise SystemExit(f"fleet_ssh report: the runs in {RESULTS} are of commits {sorted(map(str, commits))}: "
                         "rerun them at one commit (or move the older ones away)")
    return runs


def report(argv: list[str]) -> dict:
    runs = same_commit_runs()
    by = {(r["mode"], r["seed"]): r for r in runs}
    pairs = []
    for seed in sorted({s for m, s in by if m == "online" and ("held", s) in by}):
        online, held = by["online", seed], by["held", seed]
        saving = 1 - online["billed_usd_per_step"] / held["billed_usd_per_step"]
        points = online["learner_utilization"] - held["learner_utilization"]
        predicted = sim_prediction(WORK / f"online_s{seed}", WORK / f"held_s{seed}", seed)
        # the bill per second of run: what the saving would be if both runs took the same time
        rate_saving = 1 - (online["billed_usd"] / online["wall_s"]) / (held["billed_usd"] / held["wall_s"])
        pairs.append({"seed": seed, "saving_per_step": round(saving, 4), "sim_predicted": predicted,
                      "wall_s": {"online": online["wall_s"], "held": held["wall_s"]},
                      "saving_per_wall_second": round(rate_saving, 4),
                      "sim_minus_measured_points": (None if predicted["saving_per_step"] is None
                                                    else round(predicted["saving_per_step"] - saving, 4)),
                      "saving_per_group": round(1 - online["billed_usd_per_group"] / held["billed_usd_per_group"], 4),
                      "utilization_points": round(points, 4),
                      "goal_met": saving >= SAVING_GOAL and abs(points) <= UTILIZATION_POINTS})
    reported = provenance(ROOT, argv)
    made = {**runs[0]["provenance"], "command": reported["command"],
            # the simulator's predictions are computed at the report's commit
            "report_git_commit": reported["git_commit"], "report_git_dirty": reported["git_dirty"],
            "run_commands": sorted(r["provenance"]["command"] for r in runs)}
    return {"benchmark": "fleet_ssh", "provenance": made, "hosts": host_classes(), "steps": runs[0]["steps"],
            "learner_slowdown": LEARNER_SLOWDOWN, "learner_slowdown_clock": "cpu",
            "goal": {"saving_per_step_at_least": SAVING_GOAL, "utilization_within_points": UTILIZATION_POINTS},
            "pairs": pairs, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run")
    run.add_argument("--mode", choices=["online", "held"], required=True)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=STEPS)
    actions.add_parser("report")
    args = parser.parse_args()
    if args.action == "report":
        print(json.dumps(report(sys.argv[1:]), indent=2))
        return
    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    made = run_provenance(sys.argv[1:])
    result = {**one_run(args.mode, args.seed, args.steps), "provenance": made}
    (RESULTS / f"{args.mode}_s{args.seed}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
