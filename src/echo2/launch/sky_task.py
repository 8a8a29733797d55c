"""The SkyPilot task that starts one echo2 worker: its machine (the catalog class's
`[workers.NAME.skypilot]` table), a setup that installs the coordinator's exact echo2, and a run
that starts `echo2 worker` under the worker id the fleet decided.

The join token travels as a SkyPilot secret (`ECHO2_AUTH_TOKEN`, which `echo2 worker` reads when
its config has no `auth_token`): SkyPilot redacts secrets wherever it shows or stores a task, and
the token is never in the worker's TOML, a file written here, or a command line.

SkyPilot is imported where a task is built, so this module loads where it is not installed."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echo2.config.base import validate
from echo2.config.catalog import WorkerClass
from echo2.config.worker import WorkerConfig

if TYPE_CHECKING:
    import sky

TOKEN_VARIABLE = "ECHO2_AUTH_TOKEN"
REMOTE_DIR = "~/.echo2"
"""On the machine: the worker's TOML and the shipped wheel (the home of SkyPilot's user)."""
VENV = "$HOME/.echo2/venv"
PYTHON = "3.11"
"""The worker's interpreter: uv fetches it where the image has an older one (echo2 needs 3.11)."""
TOML_END = "ECHO2_WORKER_TOML"
# SkyPilot's rule is [a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?; Kubernetes and GCP take lowercase
# letters, digits and '-' only, so names keep to those everywhere
_NOT_NAME = re.compile(r"[^a-z0-9]+")


def cluster_name(run_id: str, worker_id: str) -> str:
    """The cluster of one worker in one run: readable parts, and a digest of the exact ids so two
    ids that read alike after cleaning (case, punctuation, length) never share a cluster. A worker
    keeps its name across acquires: its previous cluster is always downed first."""
    digest = hashlib.sha256(f"{run_id}\0{worker_id}".encode()).hexdigest()[:6]
    parts = [_slug(run_id, 12), _slug(worker_id, 16)]
    return "-".join(["e2", *[p for p in parts if p], digest])


def _slug(text: str, limit: int) -> str:
    return _NOT_NAME.sub("-", text.lower()).strip("-")[:limit].strip("-")


@dataclass(frozen=True)
class WorkerLaunch:
    """What every worker's task carries (see echo2.launch.sky_task.task_for)."""

    coordinator_url: str
    echo2_spec: str
    """The coordinator's exact echo2: a pip requirement or the path of its wheel here."""
    worker_fields: dict[str, Any] = field(default_factory=dict)
    """WorkerConfig fields every worker gets (engine, vllm, tls...); id, class and price are set per worker."""
    auth_token: str = field(default="", repr=False)
    """The run's join token: a SkyPilot secret of each task, nowhere else."""


def task_for(worker_id: str, worker_class: str, cls_cfg: WorkerClass, *, coordinator_url: str, echo2_spec: str,
             worker_fields: dict[str, Any], auth_token: str = "") -> sky.Task:
    """The task for `worker_id` on a machine of `worker_class` (its catalog entry `cls_cfg`).

    `echo2_spec`: what `pip install` takes for the coordinator's exact echo2: a requirement
    ("echo2==0.1.0", a VCS URL) or the path of a wheel here, which the task ships to the machine.
    `worker_fields`: fields of the worker's WorkerConfig (engine, vllm, tls...); the id, class and
    price are set here. `auth_token`: the run's join token, passed as a SkyPilot secret only."""
    import sky

    if cls_cfg.skypilot is None:
        raise ValueError(f"worker class {worker_class!r} has no [workers.{worker_class}.skypilot] table: add one "
                         "(accelerators, use_spot, infra) to rent it through SkyPilot")
    config = worker_toml(worker_id, worker_class, cls_cfg, worker_fields)
    mounts, install = _install(echo2_spec)
    yaml_config: dict[str, Any] = {
        "name": f"echo2-{_slug(worker_class, 40) or 'worker'}",
        "resources": cls_cfg.skypilot.resources(),
        "setup": _setup_script(install),
        "run": _run_script(config, coordinator_url),
        "envs": {"ECHO2_WORKER_ID": worker_id, "ECHO2_WORKER_CLASS": worker_class},
    }
    if mounts:
        yaml_config["file_mounts"] = mounts
    try:
        task = sky.Task.from_yaml_config(yaml_config)
    except Exception as exc:  # SkyPilot's own checks (schema, infra, accelerators) say what is wrong
        raise ValueError(f"worker class {worker_class!r}: SkyPilot refuses [workers.{worker_class}.skypilot]: "
                         f"{exc} (fix the table; `sky show-gpus` lists accelerators, `sky check` the enabled "
                         "infra)") from exc
    if auth_token:
        task.update_secrets({TOKEN_VARIABLE: auth_token})
    return task


def worker_toml(worker_id: str, worker_class: str, cls_cfg: WorkerClass, fields: dict[str, Any]) -> str:
    """The worker's settings as TOML (dotted keys, JSON scalars, which TOML reads alike), checked
    against WorkerConfig here so a bad field fails before a machine is rented."""
    if fields.get("auth_token"):
        raise ValueError("worker_fields.auth_token: the join token goes to the machine as a SkyPilot secret, "
                         "never in the worker's TOML: pass it as auth_token instead")
    data = {**fields, "worker_id": worker_id, "worker_class": worker_class,
            "price_per_hour": cls_cfg.price_per_hour, "auth_token": ""}
    checked = validate(WorkerConfig, data, source=f"worker config of {worker_id!r}")
    pairs = _flatten(checked.model_dump(exclude={"auth_token"}, exclude_defaults=True))
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in pairs)


def _flatten(fields: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in fields.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        elif value is not None:  # TOML has no null: a None is the field's default
            out.append((f"{prefix}{key}", value))
    return out


def _install(echo2_spec: str) -> tuple[dict[str, str], str]:
    """(file mounts, what pip installs): a wheel here is shipped beside the worker's TOML."""
    if not echo2_spec.strip():
        raise ValueError("echo2_spec is empty: give the coordinator's echo2 as a requirement ('echo2==0.1.0') "
                         "or the path of its wheel")
    if echo2_spec.endswith(".whl"):
        wheel = Path(echo2_spec).expanduser()
        if not wheel.is_file():
            raise ValueError(f"echo2_spec {echo2_spec!r}: no such wheel here; build it (pip wheel --no-deps .) "
                             "or give a requirement such as 'echo2==0.1.0'")
        remote = f"{REMOTE_DIR}/wheels/{wheel.name}"
        return {remote: str(wheel.resolve())}, remote
    return {}, echo2_spec


def _setup_script(install: str) -> str:
    """Installs echo2 into its own venv with uv (fast, and it brings Python 3.11 where the image
    lacks it). `install` is a pip requirement or the shipped wheel's path (~ expanded here)."""
    target = f'"$HOME/{install[2:]}"' if install.startswith("~/") else shlex.quote(install)
    return "\n".join([
        "set -euo pipefail",
        'export PATH="$HOME/.local/bin:$PATH"',
        "command -v uv >/dev/null || python3 -m pip install --quiet --user uv",
        f'uv venv --quiet --allow-existing --python {PYTHON} "{VENV}"',
        f'uv pip install --quiet --python "{VENV}/bin/python" {target}',
        f'"{VENV}/bin/python" -c "import echo2; print(\'echo2\', echo2.__version__)"',
    ])


def _run_script(config: str, coordinator_url: str) -> str:
    """Writes the worker's TOML and becomes `echo2 worker` (exec: SIGTERM reaches it, and it leaves
    the coordinator cleanly). The token is in the environment, as SkyPilot's secret."""
    return "\n".join([
        "set -euo pipefail",
        f'mkdir -p "$HOME/.echo2" && cat > "$HOME/.echo2/worker.toml" <<\'{TOML_END}\'',
        config.rstrip("\n"),
        TOML_END,
        f'exec "{VENV}/bin/echo2" worker --coordinator {shlex.quote(coordinator_url)} '
        '--config "$HOME/.echo2/worker.toml"',
    ])


def check_classes(catalog: dict[str, WorkerClass], workers: dict[str, str],
                   fallbacks: dict[str, list[str]]) -> None:
    named = set(workers.values()) | set(fallbacks) | {c for chain in fallbacks.values() for c in chain}
    for name in sorted(named):
        if name not in catalog:
            raise ValueError(f"worker class {name!r} is not in the catalog (classes: {', '.join(sorted(catalog))}): "
                             "fix the worker's class or its fallbacks")
        if catalog[name].skypilot is None:
            raise ValueError(f"worker class {name!r} has no [workers.{name}.skypilot] table: add one to rent it "
                             "through SkyPilot, or leave it out of the SkyPilot fleet and its fallbacks")
    for name, chain in fallbacks.items():
        if name in chain or len(set(chain)) != len(chain):
            raise ValueError(f"fallbacks[{name!r}] = {chain}: list each other class once, not {name!r} itself")
