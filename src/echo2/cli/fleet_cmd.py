"""`echo2 fleet`: the machines a run rents and releases ("ssh" and "skypilot" providers).

    echo2 fleet status --run-dir R           held machines: class, price, billed so far, state
    echo2 fleet up --run-dir R               the run's provider beside a coordinator started by
                                             hand: acquires and releases as it decides, until
                                             the learner is done or Ctrl-C, then releases all
    echo2 fleet down ID... --run-dir R       release these workers' machines
    echo2 fleet down --all --run-dir R       release everything the ledger holds (after a crash)
"""

from __future__ import annotations

import argparse
import os
import signal
import time


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("fleet", help="the machines a run rents and releases (ssh, skypilot)")
    actions = parser.add_subparsers(dest="fleet_action", required=True)
    status = actions.add_parser("status", help="held machines, their class, price, billed dollars and state")
    status.add_argument("--run-dir", required=True)
    up = actions.add_parser("up", help="run the run's provider beside its coordinator until the learner is done")
    up.add_argument("--run-dir", required=True)
    up.add_argument("--coordinator-url", help="how the workers' machines reach the coordinator (default: "
                                              "activation.coordinator_url, else the coordinator's own URL)")
    down = actions.add_parser("down", help="release held machines (ids, or --all)")
    down.add_argument("worker_ids", nargs="*", metavar="ID")
    down.add_argument("--all", action="store_true", help="every machine the run's ledger holds")
    down.add_argument("--run-dir", required=True)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    run_path = Path(args.run_dir)
    if not run_path.is_dir():
        raise ValueError(f"--run-dir {args.run_dir}: no such directory")
    if args.fleet_action == "status":
        return _status(run_path)
    if args.fleet_action == "down":
        return _down(run_path, args.worker_ids, args.all)
    return _up(args)


def _status(run_path) -> int:
    from rich.console import Console
    from rich.table import Table

    from echo2.launch.fleet_ledger_ops import fleet_rows

    rows = fleet_rows(run_path)
    console = Console()
    if not rows:
        console.print(f"no machine acquired in {run_path} (its fleet_ledger.jsonl is empty or absent)")
        return 0
    table = Table("worker", "provider", "machine", "class", "$/h", "billed", "billed $", "state")
    for row in rows:
        table.add_row(row.worker_id, row.provider, row.machine, row.worker_class, f"{row.price_per_hour:.3f}",
                      f"{row.billed_s:.0f} s", f"{row.billed_usd:.4f}", row.state)
    console.print(table)
    held = sum(row.state != "released" for row in rows)
    console.print(f"{held} held, {len(rows) - held} released; billed ${sum(r.billed_usd for r in rows):.4f} in all")
    return 0


def _down(run_path, worker_ids: list[str], everything: bool) -> int:
    from echo2.launch.fleet_ledger_ops import release_held

    if everything == bool(worker_ids):
        raise ValueError("echo2 fleet down: give worker ids (see `echo2 fleet status`) or --all, not both or neither")
    failures = release_held(run_path, None if everything else worker_ids)
    for line in failures:
        print(f"still held: {line}")
    print("released everything asked for" if not failures else f"{len(failures)} still held: run it again")
    return 1 if failures else 0


def _up(args: argparse.Namespace) -> int:
    from rich.console import Console

    from echo2.cli.common import coordinator_url
    from echo2.config.run_dir import read_resolved
    from echo2.launch.fleet import FleetSync
    from echo2.launch.remote_fleet import REMOTE_PROVIDERS, FleetLoop, make_remote_fleet
    from echo2.report.metrics import MetricsTail

    cfg = read_resolved(args.run_dir)  # the coordinator's own: it offers the same roster to its controller
    if cfg.activation.provider not in REMOTE_PROVIDERS:
        raise ValueError(f"{args.run_dir}: activation.provider is {cfg.activation.provider!r}; `echo2 fleet up` runs "
                         "a provider that starts workers on other machines: prepare the run with [activation] "
                         "provider = \"ssh\" and inventory = \"hosts.toml\" (or provider = \"skypilot\")")
    token = os.environ.get("ECHO2_AUTH_TOKEN", "")
    if not token:
        raise ValueError("ECHO2_AUTH_TOKEN is not set: the workers' machines are given the run's join token, the one "
                         "the coordinator was started with")
    console = Console()
    url = coordinator_url(args.run_dir, args.coordinator_url, wait_s=60)
    fleet = make_remote_fleet(cfg, coordinator_url=url, auth_token=token,
                              warn=lambda line: console.print(f"[yellow]{line}[/]"))
    tail = MetricsTail(cfg.run_path / "metrics.jsonl")
    # the whole record from the start: the coordinator decided before this process started, and
    # only writes a decision again when it changes (a resumed run's old ones are superseded in order)
    loop = FleetLoop(FleetSync(fleet, cfg.activation.release_after_s), tail)
    signal.signal(signal.SIGTERM, _interrupt)
    console.print(f"fleet up: {cfg.activation.provider} provider for {cfg.run_path}; Ctrl-C releases everything")
    try:
        while not any(r.get("kind") == "learner_done" for r in loop.tick()):
            time.sleep(0.5)
        console.print("the learner is done: releasing the fleet")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: releasing the fleet[/]")
    finally:
        for line in fleet.close(reason="shutdown"):
            console.print(f"[red]still held, may still bill: {line}; `echo2 fleet down --all --run-dir "
                          f"{args.run_dir}` tries again[/]")
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
