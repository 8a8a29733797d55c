"""One load case, start to finish: a run dir with the prepared base model, the real coordinator
(pinned to its cores), the fake learner and the client processes (pinned to the others), the
phases of the case on the wall clock, CPU sampled at each phase boundary, every process stopped
by PID however the case ends, and its JSON section built from what they left.

Two scenarios:
- steady: N workers join over `ramp_s`, `warmup_s` to settle, then `duration_s` measured;
- mass_join: a fleet of `base_workers` joins and settles, the learner's pace is measured for
  `before_s`, then N more workers register within one second, and `duration_s` is measured
  after (the recovery time: until steps/min is back within 5% of before, for good)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from load import processes as procs
from load import report
from load.stats import Merged, cores_busy_s, tree_cpu_s

BENCH = Path(__file__).resolve().parents[1]
CASE_RAW = "case_raw.json"
"""What a case's run dir keeps of the harness's own view (the plan, CPU samples, exit statuses)."""
CLIENT_START_S = 4.0
"""Time given the client processes to start (Python, aiohttp, pydantic) before the first join."""


@dataclass(frozen=True)
class CaseSettings:
    config: str
    overrides: tuple[str, ...]
    duration_s: float
    warmup_s: float
    ramp_s: float | None  # None: N / 100 s, within [5, 30]
    leave_s: float | None  # None: every worker leaves at the pace the coordinator admits joins
    before_s: float
    base_workers: int
    train_s: float
    sim: dict  # SimSettings fields but url/join_token
    workers_per_client: int
    workers_per_address: int
    coordinator_cores: frozenset[int]
    client_cores: frozenset[int]
    runs_root: Path
    client_nice: int = 0
    """Niceness of the client processes. They stand for remote machines and share a core with the
    fake learner here: niced, the learner runs first when both are ready, as it would on its own
    machine, and the clients' own lag stays visible in their loop-lag figures."""


@dataclass
class Plan:
    scenario: str
    workers: int
    phases: list[tuple[str, float]]
    join_at: list[float]
    leave_at: float
    window: tuple[float, float]
    before: tuple[float, float] | None = None
    notes: dict = field(default_factory=dict)
    leave_s: float = 0.0
    """The workers leave one after another over this long from `leave_at`, in the order they
    joined (0: all at once)."""

    @property
    def last_leave_at(self) -> float:
        return self.leave_at + self.leave_s

    def leave_times(self) -> list[float]:
        n = len(self.join_at)
        return [self.leave_at + self.leave_s * i / n for i in range(n)]


JOINS_PER_S = 100.0
"""The joins the default ramp spreads a fleet over: coordinator.registrations_per_s's default (a
faster ramp is deferred by the coordinator, and the case would measure workers still joining)."""


def ramp_s(settings: CaseSettings, n: int) -> float:
    return settings.ramp_s if settings.ramp_s is not None else max(5.0, n / JOINS_PER_S)


def leave_s(settings: CaseSettings, n: int) -> float:
    """A fleet leaves at the pace it was admitted (JOINS_PER_S): the teardown is not what a case
    measures. `--leave-s 0` measures a fleet leaving at once."""
    return settings.leave_s if settings.leave_s is not None else max(5.0, n / JOINS_PER_S)


def plan_case(settings: CaseSettings, scenario: str, n: int, now: float) -> Plan:
    t0 = now + CLIENT_START_S
    if scenario == "steady":
        ramp = ramp_s(settings, n)
        measure = t0 + ramp + settings.warmup_s
        end = measure + settings.duration_s
        leaving = leave_s(settings, n)
        return Plan(scenario, n, [("join", t0), ("measure", measure), ("leave", end)],
                    [t0 + ramp * i / n for i in range(n)], end, (measure, end),
                    notes={"ramp_s": ramp, "leave_s": leaving}, leave_s=leaving)
    base = settings.base_workers
    ramp = ramp_s(settings, base)
    before = t0 + ramp + settings.warmup_s
    mass = before + settings.before_s
    end = mass + settings.duration_s
    join_at = [t0 + ramp * i / base for i in range(base)] + [mass + i / n for i in range(n)]
    leaving = leave_s(settings, base + n)
    return Plan(scenario, n, [("join", t0), ("before", before), ("after", mass), ("leave", end)], join_at, end,
                (mass, end), before=(before, mass), leave_s=leaving,
                notes={"ramp_s": ramp, "leave_s": leaving, "base_workers": base, "mass_join_at": mass})


def source_ip(address_index: int) -> str:
    """A loopback address of its own per worker (or per `workers_per_address`), as workers on
    different hosts have: the coordinator's per-address registration limit sees each apart."""
    return f"127.{100 + address_index // 65024}.{(address_index // 254) % 256}.{1 + address_index % 254}"


def prepare_run_dir(settings: CaseSettings, run_dir: Path) -> dict:
    """The resolved config and the base model in `run_dir` (`echo2 prepare`: copied from
    runs/.cache once built there). Returns the resolved config."""
    argv = [sys.executable, "-m", "echo2", "prepare", "--config", settings.config]
    for override in (f"run_dir={run_dir}", *settings.overrides):
        argv += ["--set", override]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"echo2 prepare failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads((run_dir / "config.json").read_text())


def progress(line: str) -> None:
    print(f"[coordinator_load {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def run_case(settings: CaseSettings, scenario: str, n: int, run_dir: Path) -> dict:
    """One case's JSON section; every process it started is stopped before it returns."""
    cfg = prepare_run_dir(settings, run_dir)
    tokens = {"ECHO2_AUTH_TOKEN": secrets.token_hex(16), "ECHO2_LEARNER_TOKEN": secrets.token_hex(16),
              "ECHO2_OPERATOR_TOKEN": secrets.token_hex(16)}
    started: list[procs.Started] = []
    try:
        coordinator = procs.start("coordinator", [sys.executable, "-m", "echo2", "coordinator", "--run-dir",
                                                  str(run_dir)], cores=set(settings.coordinator_cores),
                                  log_path=run_dir / "logs" / "coordinator.log", env=tokens)
        started.append(coordinator)
        url = procs.wait_for_coordinator(run_dir, coordinator)
        progress(f"{scenario} N={n}: coordinator pid {coordinator.pid} at {url} (cores "
                 f"{sorted(settings.coordinator_cores)})")
        plan = plan_case(settings, scenario, n, time.time())
        plan.notes["coordinator_cores"] = sorted(settings.coordinator_cores)
        plan.notes["client_cores"] = sorted(settings.client_cores)
        started.insert(0, _start_learner(settings, cfg, run_dir, url=url, tokens=tokens, plan=plan))
        clients = _start_clients(settings, run_dir, url, tokens=tokens, plan=plan)
        started[:0] = clients
        samples = _walk_phases(plan, started, coordinator)
        _wait_clients(clients, plan.last_leave_at + 30.0)
        progress(f"{scenario} N={n}: clients done; stopping the learner and the coordinator")
    finally:
        exits = procs.stop_all(started)
    raw = {"plan": asdict(plan), "samples": samples, "clients": [c.name for c in clients], "exits": exits}
    (run_dir / CASE_RAW).write_text(json.dumps(raw))
    return case_from_run_dir(run_dir)


def case_from_run_dir(run_dir: Path) -> dict:
    """A case's JSON section from what its run left in `run_dir` (its CASE_RAW file, the
    clients' and the learner's results, the coordinator's metrics): the report can be made
    again, e.g. after the report itself changed."""
    raw = json.loads((run_dir / CASE_RAW).read_text())
    plan = raw["plan"]
    plan = Plan(**{**plan, "phases": [tuple(p) for p in plan["phases"]], "window": tuple(plan["window"]),
                   "before": tuple(plan["before"]) if plan["before"] else None})
    cfg = json.loads((run_dir / "config.json").read_text())
    return _case_report(plan, run_dir, cfg, samples=raw["samples"], clients=raw["clients"], exits=raw["exits"])


def _start_learner(settings: CaseSettings, cfg: dict, run_dir: Path, *, url: str, tokens: dict,
                   plan: Plan) -> procs.Started:
    learner_cfg = {"url": url, "learner_token": tokens["ECHO2_LEARNER_TOKEN"], "phases": plan.phases,
                   "payload": str(run_dir / "base" / "model.safetensors"), "train_s": settings.train_s,
                   "chunk_bytes": cfg["broadcast"]["chunk_bytes"], "checkpoint_every": cfg["train"]["checkpoint_every"],
                   "steps_path": str(run_dir / "fake_learner_steps.jsonl"), "out": str(run_dir / "fake_learner.json")}
    path = run_dir / "fake_learner_config.json"
    path.write_text(json.dumps(learner_cfg))
    return procs.start("learner", [sys.executable, str(BENCH / "load" / "fake_learner.py"), str(path)],
                       cores=set(settings.client_cores), log_path=run_dir / "logs" / "learner.log")


def _start_clients(settings: CaseSettings, run_dir: Path, url: str, *, tokens: dict,
                   plan: Plan) -> list[procs.Started]:
    per = settings.workers_per_client
    everyone = [[i, f"sim{i:05d}", source_ip(i // settings.workers_per_address), at, leave_at]
                for i, (at, leave_at) in enumerate(zip(plan.join_at, plan.leave_times(), strict=True))]
    out = []
    for k in range(0, len(everyone), per):
        client_cfg = {"url": url, "join_token": tokens["ECHO2_AUTH_TOKEN"], "phases": plan.phases,
                      "tokenizer": str(run_dir / "base" / "tokenizer.json"),
                      "settings": settings.sim, "workers": everyone[k:k + per],
                      "out": str(run_dir / "clients" / f"client{k // per}.json")}
        path = run_dir / "clients" / f"client{k // per}_config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(client_cfg))
        out.append(procs.start(f"client{k // per}", [sys.executable, str(BENCH / "load" / "client.py"), str(path)],
                               cores=set(settings.client_cores), log_path=run_dir / "logs" / f"client{k // per}.log",
                               nice=settings.client_nice))
    progress(f"{plan.scenario} N={plan.workers}: {len(out)} client process(es) started; "
             f"{len(plan.join_at)} workers join from +{CLIENT_START_S:.0f} s")
    return out


def _walk_phases(plan: Plan, started: list[procs.Started], coordinator: procs.Started) -> dict[str, dict[str, float]]:
    """Sleep to each phase boundary (and the end), sampling every process's CPU there; one
    progress line per phase."""
    samples: dict[str, dict[str, float]] = {}
    boundaries = plan.phases[1:] + [("end", plan.last_leave_at + 0.001)]
    for name, at in boundaries:
        time.sleep(max(0.0, at - time.time()))
        if coordinator.proc.poll() is not None:
            raise RuntimeError(f"the coordinator exited ({coordinator.proc.returncode}):\n{coordinator.log_tail()}")
        procs.note_helpers(coordinator)
        samples[name] = {p.name: tree_cpu_s(p.pid) for p in started} | cores_busy_s()
        samples[name]["_loadavg_1m"] = os.getloadavg()[0]
        progress(f"{plan.scenario} N={plan.workers}: phase '{name}' (load average {os.getloadavg()[0]:.2f})")
    return samples


def _wait_clients(clients: list[procs.Started], deadline: float) -> None:
    for client in clients:
        try:
            client.proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            progress(f"{client.name} (pid {client.pid}) still running past its leave deadline: stopping it")


def _merged(paths: list[Path]) -> tuple[Merged, list[dict]]:
    merged, raw = Merged(), []
    for path in paths:
        if path.is_file():
            data = json.loads(path.read_text())
            merged.add(data["recorder"])
            raw.append(data)
    return merged, raw


def _case_report(plan: Plan, run_dir: Path, cfg: dict, *, samples: dict, clients: list[str], exits: dict) -> dict:
    from load.case_report import case_section

    workers, client_raw = _merged([run_dir / "clients" / f"{name}.json" for name in clients])
    learner, _ = _merged([run_dir / "fake_learner.json"])
    return case_section(plan=plan, run_dir=run_dir, cfg=cfg, samples=samples, workers=workers, learner=learner,
                        client_raw=client_raw, client_names=clients, exits=exits,
                        records=report.coordinator_records(run_dir),
                        step_times=report.learner_steps(run_dir / "fake_learner_steps.jsonl"))
