"""A run dir's config.json: the fully resolved config every local role reads, written once by
whoever starts the run, and `--set` overrides of a role applied on top of it (the fields a run
in progress cannot change refused). The launcher and the subcommands all read and write it
through these functions."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from echo2.config.base import apply_overrides, parse_override, validate
from echo2.config.run import RunConfig

RESOLVED_CONFIG = "config.json"
# Fields a run in progress cannot change: its prepared base model, its checkpoints, the
# published versions, the groups in the coordinator's store and the workers' settings all
# follow them. `--set` on one of them with `--run-dir` is refused (start a new run dir instead).
FIXED_BY_THE_RUN = ("run_dir", "cache_dir", "seed", "model", "task", "warmstart", "sampling",
                    "grpo.prompts_per_step", "train.max_staleness", "broadcast")


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
