"""Schema of an SSH inventory (`[activation] inventory`, `echo2 run --provider ssh --inventory
hosts.toml`): the machines a user already has or rents by the hour, which the `ssh` provider
starts workers on and releases.

    [defaults]          any host field, for every host that does not set it
    [[hosts]]           one table per machine: name, address, worker_class, price_per_hour...
    [hosts.worker]      worker settings for that host's workers (fields of WorkerConfig)

A host runs `workers_per_host` workers, ids `NAME-0`, `NAME-1`...; each bills the host's price
divided among them. Problems the file itself shows (a duplicate host, an unknown class) stop the
run before anything starts; problems only a host can show (its key, its Python, its disk) are one
line each when it is first used, and the run goes on with the hosts that work."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from echo2.config.base import Frozen, read_toml, validate
from echo2.config.worker import WorkerConfig

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$"


class SshHost(Frozen):
    name: str = Field(pattern=NAME_PATTERN)
    """Short, unique: the workers' ids are NAME-0, NAME-1..."""
    address: str = Field(min_length=1)
    """Hostname or IP the learner's machine reaches it at (and the workers' peers, for relaying)."""
    port: int = Field(22, ge=1, le=65535)
    user: str = Field("root", min_length=1)
    key_file: str = "~/.ssh/id_ed25519"
    """The private key the SSH client logs in with (no password prompts: BatchMode)."""
    known_hosts: Literal["strict", "accept-new"] = "strict"
    """"strict": the host's key must already be in known_hosts_file (an unknown one is refused,
    with the ssh-keyscan line that adds it). "accept-new": a host never seen is trusted on first
    use and recorded; a changed key is still refused."""
    known_hosts_file: str = "~/.ssh/known_hosts"
    python: str = "python3"
    """The interpreter on the host (3.11 or later). The run's venv sees its packages (a GPU image's
    torch is used as it is), and pip adds what it lacks."""
    work_dir: str = "~/.echo2"
    """Where the host keeps echo2's venvs (one per echo2 version, reused by later runs) and each
    run's worker configs and logs."""
    min_free_mb: int = Field(1024, ge=0)
    """An acquire is refused (one line: the host and the fix) when work_dir has less free space."""
    worker_class: str = Field("", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    """Its class in the run's activation catalog; empty: priced by its measured rate alone."""
    price_per_hour: float = Field(0.0, ge=0)
    """What the host costs per hour, shared among its workers."""
    workers_per_host: int = Field(1, ge=1, le=64)
    coordinator_url: str = Field("", pattern=r"^(https?://\S+)?$")
    """How this host reaches the coordinator (http://ADDRESS:PORT); empty: the URL the fleet is
    given (`echo2 fleet up --coordinator-url`, or the coordinator's own when `echo2 run` starts it)."""
    worker: dict[str, Any] = {}
    """Worker settings (fields of WorkerConfig: engine, device, bandwidth_bps...) for its workers."""

    def worker_ids(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.workers_per_host)]

    def worker_config(self, worker_id: str, base: dict[str, Any] | None = None) -> WorkerConfig:
        """One of its workers' settings: `base` (the run's shared worker settings), relaying on
        every interface, announced at `address`, then the host's own `worker` table."""
        data = {**(base or {}), "relay_host": "0.0.0.0", "relay_advertise_host": self.address, **self.worker,
                "worker_id": worker_id, "worker_class": self.worker_class,
                "price_per_hour": self.price_per_hour / self.workers_per_host}
        return validate(WorkerConfig, data, source=f"inventory host {self.name!r} worker settings")

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


class SshInventory(Frozen):
    hosts: tuple[SshHost, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> SshInventory:
        seen_names: dict[str, int] = {}
        seen_places: dict[tuple[str, int], str] = {}
        for index, host in enumerate(self.hosts):
            if host.name in seen_names:
                raise ValueError(f"hosts[{index}]: name {host.name!r} is also hosts[{seen_names[host.name]}]'s; "
                                 "give each host its own name")
            place = (host.address, host.port)
            if place in seen_places:
                raise ValueError(f"hosts[{index}] ({host.name!r}) is {host.address}:{host.port}, as host "
                                 f"{seen_places[place]!r} is; list each machine once (workers_per_host runs "
                                 "several workers on one)")
            seen_names[host.name], seen_places[place] = index, host.name
        return self

    def host_of(self, worker_id: str) -> SshHost:
        for host in self.hosts:
            if worker_id in host.worker_ids():
                return host
        raise KeyError(f"no inventory host runs worker {worker_id!r}")

    def worker_ids(self) -> list[str]:
        return [w for host in self.hosts for w in host.worker_ids()]

    def check_classes(self, classes: set[str], catalog: str) -> None:
        """Every host's class is one of the catalog's (a typo would price it as nothing)."""
        for host in self.hosts:
            if host.worker_class and host.worker_class not in classes:
                raise ValueError(f"inventory host {host.name!r} has worker_class {host.worker_class!r}, which the "
                                 f"activation catalog {catalog!r} lacks (classes: {', '.join(sorted(classes))}); "
                                 "set it to one of them, or empty")


def load_inventory(path: str | Path) -> SshInventory:
    """Read an inventory TOML: [defaults] merged under each [[hosts]] table."""
    data = read_toml(path)
    unknown = set(data) - {"defaults", "hosts"}
    if unknown:
        raise ValueError(f"inventory {path}: unknown table(s) {', '.join(sorted(unknown))}; it holds [defaults] "
                         "and [[hosts]] only")
    defaults = data.get("defaults", {})
    hosts = [{**defaults, **host} for host in data.get("hosts", [])]
    inventory = validate(SshInventory, {"hosts": hosts}, source=f"inventory {path}")
    for host in inventory.hosts:  # a bad worker setting is the file's fault: say so now
        host.worker_config(host.worker_ids()[0])
    return inventory
