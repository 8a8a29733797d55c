"""`echo2 run`: prepare the base model, start coordinator, workers and learner as child
processes, show progress, stop exactly our children when the learner finishes, on Ctrl-C or
when a child the run cannot do without crashes, and print the summary."""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from echo2.config.run import RunConfig
from echo2.config.run_dir import write_resolved
from echo2.config.task import trusted_workers_only
from echo2.config.tls import TLSConfig
from echo2.coordinator.parts.credentials import OPERATOR, TRUSTED, key_file, read_secret
from echo2.launch.children import Child, start_child, stop_children
from echo2.launch.fleet import FleetProvider, FleetSync, LocalFleet, StaticFleet
from echo2.launch.progress import RunProgress
from echo2.launch.remote_fleet import REMOTE_PROVIDERS, FleetLoop, make_remote_fleet
from echo2.protocol.trusted import TRUSTED_TOKEN_VARIABLE
from echo2.report.finish import finish_run
from echo2.report.metrics import MetricsTail, MetricsWriter
from echo2.report.render import render_summary
from echo2.report.sink_factory import make_sinks
from echo2.report.sinks import SinkFeeder

# the coordinator binds within a second or two even on a loaded box; a minute means it is broken
COORDINATOR_START_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.5


class RunFailed(Exception):
    def __init__(self, message: str, child: Child | None = None) -> None:
        super().__init__(message)
        self.child = child


def run_local(cfg: RunConfig, console: Console) -> int:
    from echo2.learner.base_model import prepare_base_model
    from echo2.models.sources import check_model_source
    from echo2.tasks import make_task

    check_model_source(cfg.model)  # a missing path or an unreachable hub: one line, before anything starts
    task = make_task(cfg.task, cfg.seed)
    task.check()  # bad data is an error now, before any process starts
    cfg.evaluation.on_workers(task.kind != "single")  # so is evaluation where it cannot run
    if trusted_workers_only(cfg.task) and cfg.activation.provider in REMOTE_PROVIDERS:
        raise ValueError(f"task.trust = 'worker-trusted' with activation.provider = {cfg.activation.provider!r}: "
                         "the trusted-worker token is handed to this machine's workers only; start the rented "
                         "machines' workers with `echo2 worker` and $ECHO2_TRUSTED_TOKEN (docs/operations.md), or "
                         "use a replayable environment")
    write_resolved(cfg)
    prepare_base_model(cfg, log=console.print)
    tokens = _role_tokens(cfg)
    children: list[Child] = []
    # the metric sinks mirror what the launcher reads anyway; a bad [report] setting fails here
    tail = MetricsTail(cfg.run_path / "metrics.jsonl")
    sinks = SinkFeeder(make_sinks(cfg), warn=lambda line: console.print(f"[yellow]{line}[/]"))
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill launcher` stops the children too
    signal.signal(signal.SIGINT, _raise_interrupt)
    fleet: FleetSync | None = None
    try:
        fleet = _start_roles(cfg, tokens, children, warn=lambda line: console.print(f"[yellow]{line}[/]"))
        console.print(_dashboard_line(cfg), soft_wrap=True)  # a URL and a path: never wrapped
        _watch(cfg, children, fleet=fleet, console=console, tail=tail, sinks=sinks)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the run's processes[/]")
        return 130
    except RunFailed as exc:
        console.print(f"[red]run failed: {exc}[/]")
        if exc.child is not None:
            console.print(f"[red]last lines of {exc.child.log_path}:[/]\n{exc.child.log_tail()}")
        return 1
    finally:
        # workers first (they return their leases), then the learner, then the coordinator,
        # which writes the final counters once everyone has left
        _close_remote_fleet(fleet, console)
        for role in ("worker-", "learner", "coordinator"):
            stop_children([c for c in children if c.name.startswith(role)])
        sinks.feed(tail.read_new())  # what the roles wrote as they stopped (the final counters)
        sinks.close()
    summary = finish_run(cfg.run_path, plots=cfg.report.plots)
    render_summary(summary, console)
    console.print(f"metrics: {cfg.run_path / 'metrics.jsonl'}   summary: {cfg.run_path / 'summary.json'}")
    if cfg.report.tensorboard:
        console.print(f"tensorboard --logdir {cfg.run_path / 'tensorboard'}")
    return 0


# while a child is being started and recorded, a stop request waits (see _spawn)
_SPAWNING = {"depth": 0, "pending": False}


def _raise_interrupt(signum, frame) -> None:
    if _SPAWNING["depth"]:
        _SPAWNING["pending"] = True
        return
    raise KeyboardInterrupt


def _role_tokens(cfg: RunConfig) -> dict[str, str]:
    """One secret per role, from the environment where set, else fresh for this run (the
    operator's: from the run dir's key file, as a standalone coordinator keeps it; a
    worker-trusted environment's trusted-worker token likewise, which this machine's workers get)."""
    tokens = {
        "ECHO2_AUTH_TOKEN": cfg.coordinator.auth_token or os.environ.get("ECHO2_AUTH_TOKEN") or secrets.token_hex(16),
        "ECHO2_LEARNER_TOKEN": os.environ.get("ECHO2_LEARNER_TOKEN") or secrets.token_hex(16),
        # kept in the run dir (mode 0600) unless set: the operator logs in to the dashboard with it
        "ECHO2_OPERATOR_TOKEN": read_secret("OPERATOR_TOKEN", key_file(cfg.run_path, OPERATOR), create=True),
    }
    if trusted_workers_only(cfg.task):
        tokens[TRUSTED_TOKEN_VARIABLE] = read_secret("TRUSTED_TOKEN", key_file(cfg.run_path, TRUSTED), create=True)
    return tokens


def _dashboard_line(cfg: RunConfig) -> str:
    url = json.loads((cfg.run_path / "coordinator.json").read_text())["url"]
    where = ("$ECHO2_OPERATOR_TOKEN" if os.environ.get("ECHO2_OPERATOR_TOKEN")
             else os.environ.get("ECHO2_OPERATOR_TOKEN_FILE") or key_file(cfg.run_path, OPERATOR))
    return f"dashboard: {url}/ (log in with the operator token in {where}); Prometheus: {url}/metrics"


def _start_roles(cfg: RunConfig, tokens: dict[str, str], children: list[Child], *,
                 warn: Callable[[str], None]) -> FleetSync:
    """Each child gets the secrets of its role only: workers the join token, the learner its own
    and the join token (workers present it at its origin), the coordinator all three. With a
    remote provider ("ssh", "skypilot") no local worker starts: the provider starts the workers
    on its machines as the controller chooses them."""
    run_dir, logs = str(cfg.run_path), cfg.run_path / "logs"
    started_wall_s = time.time()  # a resumed run's metrics hold the last run's decisions too
    (cfg.run_path / "coordinator.json").unlink(missing_ok=True)
    worker_env = {key: tokens[key] for key in ("ECHO2_AUTH_TOKEN", TRUSTED_TOKEN_VARIABLE) if key in tokens}
    learner_env = {**worker_env, "ECHO2_LEARNER_TOKEN": tokens["ECHO2_LEARNER_TOKEN"]}
    coordinator = _spawn(children, "coordinator", ["coordinator", "--run-dir", run_dir], logs=logs,
                         env=tokens)
    url = _wait_for_coordinator(cfg.run_path, coordinator)
    metrics = str(cfg.run_path / "metrics.jsonl")
    index_of = _worker_indices(cfg)
    activation = cfg.activation

    def start_worker(worker_id: str) -> Child:
        index = index_of[worker_id]
        args = ["worker", "--coordinator", url, "--metrics", metrics, *_worker_overrides(cfg, index)]
        child = _spawn(children, f"worker-{index}", args, logs=logs, env=worker_env)
        _write_pids(cfg, children)  # an acquired worker is a new process
        return child

    on_demand = cfg.workers_started_on_demand()  # the coordinator's first decision acquires them
    remote = activation.provider in REMOTE_PROVIDERS
    workers = {worker_id: start_worker(worker_id) for worker_id in index_of
               if worker_id not in on_demand and not remote}
    _spawn(children, "learner", ["learner", "--run-dir", run_dir, "--coordinator", url], logs=logs,
           env=learner_env, ranks=cfg.learner.ranks)
    _write_pids(cfg, children)
    if remote:
        provider: FleetProvider = make_remote_fleet(cfg, coordinator_url=url, auth_token=tokens["ECHO2_AUTH_TOKEN"],
                                                    warn=warn)
    elif activation.provider == "local":
        provider = LocalFleet(workers, start_worker,
                                             MetricsWriter(cfg.run_path / "metrics.jsonl", "launcher"),
                                             not_started=on_demand)
    else:
        provider = StaticFleet(set(workers))
    return FleetSync(provider, activation.release_after_s, since=started_wall_s)


def _close_remote_fleet(fleet: FleetSync | None, console: Console) -> None:
    """Release every machine a remote provider holds (its ledger's); say which could not be."""
    close = getattr(fleet.provider, "close", None) if fleet is not None else None
    if close is None:
        return
    for line in close(reason="shutdown"):
        console.print(f"[red]still held, may still bill: {line}; `echo2 fleet down --all --run-dir ...` tries "
                      "again[/]")


def _worker_indices(cfg: RunConfig) -> dict[str, int]:
    """Worker id -> index of the local worker (its child is `worker-{index}`)."""
    return {cfg.workers.worker_config(i).worker_id: i for i in range(cfg.workers.count)}


def _write_pids(cfg: RunConfig, children: list[Child]) -> None:
    """Each role's current process (a later one of the same name, an acquired worker, wins)."""
    (cfg.run_path / "pids.json").write_text(json.dumps({c.name: c.pid for c in children}))


def _spawn(children: list[Child], name: str, args: list[str], *, logs: Path, env: dict[str, str],
           ranks: int = 1) -> Child:
    """Start a child and record it before a stop request (SIGTERM, Ctrl-C) is acted on: one
    arriving after the fork but before the child is on the list would leave an orphan behind.
    (Not by blocking the signals: a blocked mask is inherited through exec, so the children
    would ignore SIGTERM.)"""
    _SPAWNING["depth"] += 1
    try:
        child = start_child(name, args, logs, env=env, ranks=ranks)
        children.append(child)
    finally:
        _SPAWNING["depth"] -= 1
    if _SPAWNING["pending"] and not _SPAWNING["depth"]:
        _SPAWNING["pending"] = False
        raise KeyboardInterrupt
    return child


def _worker_overrides(cfg: RunConfig, index: int) -> list[str]:
    worker = cfg.workers.worker_config(index)
    fields = worker.model_dump()
    fields.pop("auth_token")  # secrets travel in the environment
    if worker.tls == TLSConfig():  # on one machine the run's certificate serves the relays too
        fields["tls"] = cfg.tls.model_dump()
    return [arg for key, value in _flatten(fields) for arg in ("--set", f"{key}={json.dumps(value)}")]


def _flatten(fields: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Dotted keys for nested tables (`vllm.max_num_seqs`); JSON scalars are valid TOML values,
    and None (TOML has no null) is every optional field's default, so it is left out."""
    out: list[tuple[str, object]] = []
    for key, value in fields.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        elif value is not None:
            out.append((f"{prefix}{key}", value))
    return out


def _wait_for_coordinator(run_path: Path, child: Child) -> str:
    deadline = time.monotonic() + COORDINATOR_START_TIMEOUT_S
    path = run_path / "coordinator.json"
    while time.monotonic() < deadline:
        if child.exit_code() is not None:
            raise RunFailed(f"coordinator exited with code {child.exit_code()} at start", child)
        if path.is_file():
            return json.loads(path.read_text())["url"]
        time.sleep(0.1)
    raise RunFailed(f"coordinator did not start within {COORDINATOR_START_TIMEOUT_S:.0f}s", child)


def _watch(cfg: RunConfig, children: list[Child], *, fleet: FleetSync, console: Console, tail: MetricsTail,
           sinks: SinkFeeder) -> None:
    index_of = _worker_indices(cfg)
    by_name = {c.name: c for c in children}
    reported: set[str] = set()
    loop = FleetLoop(fleet, tail)
    with RunProgress(cfg, console) as progress:
        while True:
            progress.refresh_from(cfg.run_path / "metrics.jsonl")
            sinks.feed(loop.tick())
            booting = getattr(fleet.provider, "booting", None)  # a remote fleet's machines coming up
            if booting is not None:
                progress.show_booting(booting())
            # the current process of each worker; one its provider released exited on purpose
            released = {f"worker-{index_of[w]}" for w in fleet.provider.released() if w in index_of}
            workers = [c for c in {c.name: c for c in children}.values()
                       if c.name.startswith("worker-") and c.name not in released]
            learner_code = by_name["learner"].exit_code()
            if learner_code == 0:
                return
            for name in ("learner", "coordinator"):
                if by_name[name].exit_code() is not None:
                    raise RunFailed(f"{name} exited with code {by_name[name].exit_code()}", by_name[name])
            _report_dead_workers(workers, reported, console)
            if workers and not released and all(w.name in reported for w in workers):
                raise RunFailed("every worker exited; nothing can generate rollouts", workers[-1])
            time.sleep(POLL_INTERVAL_S)


def _report_dead_workers(workers: list[Child], reported: set[str], console: Console) -> None:
    for worker in workers:
        if worker.name not in reported and worker.exit_code() is not None:
            reported.add(worker.name)
            console.print(f"[yellow]{worker.name} exited with code {worker.exit_code()}; the run continues "
                          f"without it (its leases return to the queue). Log: {worker.log_path}[/]")
