"""The provider of a run whose workers run on other machines ("ssh", "skypilot"), built the same
way for `echo2 run` (beside the coordinator it starts) and for `echo2 fleet up` (beside a
coordinator started by hand, as in the multi-machine recipe); and what follows its decisions
(`FleetLoop`: the run's metrics in, acquires and releases out)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from echo2.config.catalog import load_plan_config
from echo2.config.fleet_roster import skypilot_offers
from echo2.config.inventory import load_inventory
from echo2.config.run import RunConfig
from echo2.launch.fleet import FleetProvider, FleetSync
from echo2.report.fleet_ledger import FleetLedger
from echo2.report.metrics import MetricsTail, MetricsWriter

REMOTE_PROVIDERS = ("ssh", "skypilot")
FLEET_ROLE = "launcher"
"""The role its metrics records carry (worker_acquired, worker_released, worker_rejoined...)."""


class RemoteFleet(FleetProvider, Protocol):
    def booting(self) -> dict[str, float]: ...

    def poll(self, now: float) -> None: ...

    def close(self, reason: str = "shutdown") -> list[str]: ...


def fleet_run_id(run_path: Path) -> str:
    """Names this run's files on the hosts and its clusters: the run dir's name (readable) and a
    digest of its full path (two runs of the same name never share them)."""
    resolved = str(Path(run_path).resolve())
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(resolved).name)[:32] or "run"
    return f"{name}-{hashlib.sha256(resolved.encode()).hexdigest()[:8]}"


def worker_fields(cfg: RunConfig) -> dict[str, Any]:
    """The run's shared worker settings a remote worker starts from (its id, class, price and
    relay address are its own; the join token travels apart)."""
    fields = cfg.workers.worker.model_dump(exclude={"auth_token", "worker_id", "worker_class", "price_per_hour",
                                                    "relay_host", "relay_advertise_host"})
    return {k: v for k, v in fields.items() if v is not None}


def make_remote_fleet(cfg: RunConfig, *, coordinator_url: str, auth_token: str, warn: Callable[[str], None],
                      sky_api: Any = None, echo2_spec: str | None = None) -> RemoteFleet:
    """The run's ssh or skypilot provider; its ledger is the run dir's. `sky_api` (default:
    SkyPilot's SDK) and `echo2_spec` (default: this echo2's wheel) are for "skypilot"."""
    a = cfg.activation
    url = a.coordinator_url or coordinator_url
    ledger = FleetLedger(cfg.run_path)
    metrics = MetricsWriter(cfg.run_path / "metrics.jsonl", FLEET_ROLE)
    run_id = fleet_run_id(cfg.run_path)
    if a.provider == "ssh":
        from echo2.launch.ssh_fleet import SshFleet, SshLaunch
        from echo2.launch.wheel import coordinator_release

        launch = SshLaunch(run_id=run_id, coordinator_url=url, auth_token=auth_token,
                           release=lambda: coordinator_release(Path(cfg.cache_dir)),
                           worker_fields=worker_fields(cfg))
        return SshFleet(load_inventory(a.inventory), launch, ledger, metrics, warn=warn)
    if a.provider == "skypilot":
        return _skypilot_fleet(cfg, url=url, auth_token=auth_token, ledger=ledger, metrics=metrics, run_id=run_id,
                               sky_api=sky_api, echo2_spec=echo2_spec)
    raise ValueError(f"activation.provider {a.provider!r} is not a remote provider ({', '.join(REMOTE_PROVIDERS)})")


def _skypilot_fleet(cfg: RunConfig, *, url: str, auth_token: str, ledger: FleetLedger, metrics: MetricsWriter,
                    run_id: str, sky_api: Any, echo2_spec: str | None) -> RemoteFleet:
    try:
        from echo2.launch.sky_api import SkySdk
        from echo2.launch.skypilot import SkyPilotFleet, WorkerLaunch
        from echo2.launch.wheel import coordinator_release
    except ImportError as exc:
        raise RuntimeError(f"provider \"skypilot\" needs SkyPilot ({exc}): pip install 'echo2[skypilot]', then "
                           "`sky check` to enable your clouds") from None
    catalog = load_plan_config(cfg.activation.catalog)
    offers = skypilot_offers(catalog)
    classes = sorted({o.worker_class for o in offers}, key=lambda c: catalog.workers[c].price_per_hour)
    fallbacks = {c: [other for other in classes if other != c] for c in classes}  # cheapest first
    spec = echo2_spec or str(coordinator_release(Path(cfg.cache_dir)).wheel)
    launch = WorkerLaunch(coordinator_url=url, echo2_spec=spec, worker_fields=worker_fields(cfg),
                          auth_token=auth_token)
    return SkyPilotFleet(sky_api or SkySdk(), ledger, metrics, run_id=run_id, catalog=dict(catalog.workers),
                         workers={o.worker_id: o.worker_class for o in offers}, launch=launch, fallbacks=fallbacks)


class FleetLoop:
    """Follows a run's metrics with a provider: each `tick` reads the new records, acts on the
    activation decisions (FleetSync) and lets the provider check on its machines."""

    def __init__(self, sync: FleetSync, tail: MetricsTail) -> None:
        self.sync, self.tail = sync, tail

    def tick(self) -> list[dict]:
        """One pass; returns the records read (the caller may show or forward them)."""
        records = self.tail.read_new()
        for record in records:
            self.sync.observe(record, time.monotonic())
        self.sync.step(time.monotonic())
        poll = getattr(self.sync.provider, "poll", None)
        if poll is not None:
            poll(time.monotonic())
        return records
