"""Arguments and config plumbing shared by the subcommands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from echo2.config.base import validate
from echo2.config.run import RunConfig, load_run_config

RESOLVED_CONFIG = "config.json"


def add_config_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--config", required=required, help="TOML config file (defaults when omitted)")
    add_set_arg(parser, "override one field, e.g. --set train.steps=50 (repeatable)")


def add_set_arg(parser: argparse.ArgumentParser, help: str) -> None:
    """The repeatable `--set KEY=VALUE` every command takes (applied by config.apply_overrides)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return load_run_config(args.config, args.overrides)


def write_resolved(cfg: RunConfig) -> Path:
    """Write the fully resolved config (every default filled in) to the run dir. The auth token
    is left out: secrets travel in the environment, not in files others may read."""
    cfg.run_path.mkdir(parents=True, exist_ok=True)
    data = cfg.model_dump()
    data["coordinator"]["auth_token"] = ""
    path = cfg.run_path / RESOLVED_CONFIG
    path.write_text(json.dumps(data, indent=2))
    return path


def read_resolved(run_dir: str) -> RunConfig:
    path = Path(run_dir) / RESOLVED_CONFIG
    if not path.is_file():
        raise ValueError(f"--run-dir {run_dir!r} has no {RESOLVED_CONFIG}: start it with `echo2 run` or `echo2 coordinator --config FILE`")
    return validate(RunConfig, json.loads(path.read_text()), source=str(path))


def coordinator_url(run_dir: str, given: str | None) -> str:
    if given:
        return given
    path = Path(run_dir) / "coordinator.json"
    if not path.is_file():
        raise ValueError(f"no --coordinator given and {path} does not exist: is the coordinator running?")
    return json.loads(path.read_text())["url"]
