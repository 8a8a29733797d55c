"""Config schemas (pydantic, frozen, no torch) and the TOML/`--set` loader."""

from echo2.config.base import Frozen, apply_overrides, parse_override, read_toml, validate
from echo2.config.run import RunConfig, load_run_config
from echo2.config.worker import WorkerConfig

__all__ = [
    "Frozen",
    "RunConfig",
    "WorkerConfig",
    "apply_overrides",
    "load_run_config",
    "parse_override",
    "read_toml",
    "validate",
]
