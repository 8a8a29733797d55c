"""Arguments and config plumbing shared by the subcommands."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import time
from pathlib import Path

from echo2.config.base import apply_overrides, parse_override, validate
from echo2.config.run import RunConfig, load_run_config

RESOLVED_CONFIG = "config.json"
# Fields a run in progress cannot change: its prepared base model, its checkpoints, the
# published versions, the groups in the coordinator's store and the workers' settings all
# follow them. `--set` on one of them with `--run-dir` is refused (start a new run dir instead).
FIXED_BY_THE_RUN = ("run_dir", "cache_dir", "seed", "model", "task", "warmstart", "sampling",
                    "grpo.prompts_per_step", "train.max_staleness", "broadcast")


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
    is left out: secrets travel in the environment, not in files others may read. Written to a
    temporary file and renamed, so a role starting at the same moment never reads half a file."""
    cfg.run_path.mkdir(parents=True, exist_ok=True)
    data = cfg.model_dump()
    data["coordinator"]["auth_token"] = ""
    path = cfg.run_path / RESOLVED_CONFIG
    partial = path.with_name(f".{RESOLVED_CONFIG}.{os.getpid()}")
    partial.write_text(json.dumps(data, indent=2))
    os.replace(partial, path)
    return path


def read_resolved(run_dir: str) -> RunConfig:
    path = Path(run_dir) / RESOLVED_CONFIG
    if not path.is_file():
        raise ValueError(f"--run-dir {run_dir!r} has no {RESOLVED_CONFIG}: start it with `echo2 run` or "
                         "`echo2 prepare --config FILE` (or `echo2 coordinator --config FILE`)")
    return validate(RunConfig, json.loads(path.read_text()), source=str(path))


def with_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """`cfg` with `--set` applied, for this command only (nothing is written back)."""
    return validate(RunConfig, apply_overrides(cfg.model_dump(), overrides), source="run config with --set")


def resolved_with_overrides(run_dir: str, overrides: list[str]) -> RunConfig:
    """The run's config.json with `--set` applied on top, written back when it changed, so the
    other roles, a restart and `echo2 export` see what this role runs with. Fields fixed by the
    run (FIXED_BY_THE_RUN) are refused. Read-modify-write under a lock: the coordinator and the
    learner, started together, must not lose each other's changes."""
    if not overrides:
        return read_resolved(run_dir)
    for item in overrides:
        _refuse_if_fixed(item, run_dir)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / f".{RESOLVED_CONFIG}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cfg = read_resolved(run_dir)
        data = apply_overrides(cfg.model_dump(), overrides)
        updated = validate(RunConfig, data, source=f"{Path(run_dir) / RESOLVED_CONFIG} with --set")
        if updated != cfg:
            write_resolved(updated)
    return updated


def _refuse_if_fixed(item: str, run_dir: str) -> None:
    key = ".".join(parse_override(item)[0])
    for fixed in FIXED_BY_THE_RUN:
        if key == fixed or key.startswith(fixed + "."):
            raise ValueError(
                f"--set {item}: {fixed} is fixed for the run in {run_dir} (its base model, checkpoints, versions and "
                f"groups were made with it). Start a new run dir: echo2 prepare --config FILE --set {key}=... "
                "--set run_dir=NEW_DIR")


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
