"""Arguments and config plumbing shared by the subcommands (a run dir's config.json is
echo2.config.run_dir's)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from echo2.config.run import RunConfig, load_run_config
from echo2.config.run_dir import RESOLVED_CONFIG


def add_config_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--config", required=required, help="TOML config file (defaults when omitted)")
    add_set_arg(parser, "override one field, e.g. --set train.steps=50 (repeatable)")


def add_set_arg(parser: argparse.ArgumentParser, help: str) -> None:
    """The repeatable `--set KEY=VALUE` every command takes (applied by config.apply_overrides)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return load_run_config(args.config, args.overrides)


def refuse_config_with_run_dir(args: argparse.Namespace) -> None:
    """`--config` next to `--run-dir` would be ignored: the run dir's config.json is the run's."""
    if getattr(args, "config", None) and args.run_dir:
        raise ValueError(f"--config {args.config} with --run-dir {args.run_dir}: the run dir's {RESOLVED_CONFIG} is "
                         "the run's config. Change fields of it with --set, or drop --run-dir to start a new run "
                         "from --config")


def coordinator_url(run_dir: str, given: str | None, wait_s: float = 0.0) -> str:
    """`given`, else the URL the coordinator of `run_dir` wrote when it bound its port, waiting
    up to `wait_s` for it (a learner started together with its coordinator)."""
    if given:
        return given
    path = Path(run_dir) / "coordinator.json"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return json.loads(path.read_text())["url"]
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or being written
            if time.monotonic() >= deadline:
                raise ValueError(f"no --coordinator given and {path} does not exist: is the coordinator "
                                 "running?") from None
            time.sleep(0.2)
