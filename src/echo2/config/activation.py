"""Cost-aware activation (`[activation]`): which of the offered workers the controller runs,
how it measures them and when it releases idle ones."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from echo2.config.base import Frozen


class ActivationConfig(Frozen):
    """The coordinator's online cost-aware activation controller (ECHO2.md section 6)."""

    enabled: bool = True
    """False: every registered worker stays active (cost is still accounted)."""
    control_period_s: float = Field(2.0, gt=0)
    """How often the activation set is re-decided; a worker lost re-decides at once."""
    headroom: float = Field(1.15, ge=1.0, le=10.0)
    """New sets are sized for headroom x R_required (estimates are noisy and a short fleet idles
    the most expensive machine, the learner); a running set is replaced only when it falls below
    R_required itself, so noise inside that band changes nothing."""
    margin: float = Field(0.1, ge=0.0, lt=1.0)
    """Hysteresis: switch to a cheaper set only if it saves more than this fraction."""
    ewma_alpha: float = Field(0.2, gt=0.0, le=1.0)
    """Weight of the newest sample in the throughput and step-time estimates."""
    scale_down_after_s: float = Field(10.0, ge=0.0)
    """A cheaper, smaller set replaces the current one only this long after the last change;
    a shortfall is fixed at once (scale up fast, down slowly: no flapping on noisy rates)."""
    min_samples: int = Field(3, ge=1)
    """Rate samples (each at least one lease long) before a worker's measured rate is trusted;
    until then it is on probation and counts for nothing toward covering demand."""
    probation_slots: int = Field(4, ge=0)
    """Unmeasured workers active at once beside a measured set that covers demand, so they can
    prove themselves; those that have spent the least time on probation go first. Unbounded,
    probation would keep most of a large fleet active and billed while a full lease window left
    most of them no work to be measured by. When the measured workers fall short, as many more
    run as would cover the rest at the measured workers' mean rate; before any rate or the
    demand is known, every worker runs. Either way, at most twice the (S + 1) x
    prompts_per_step groups a full lease window holds: more could not all hold work at once."""
    probation_timeout_s: float = Field(120.0, gt=0)
    """A worker keeps its probation slot this long (time active, unmeasured) before it goes to
    the back of the queue: long enough to load the current version and generate min_samples
    leases, so honest workers are measured, while one that never leases gives its slot up."""
    provider: Literal["static", "local", "ssh", "skypilot"] = "static"
    """Who holds the workers' machines (the FleetProvider, policy/fleet_sync.py). "static": nothing is
    ever released, so an idle worker keeps billing its price. "local" (`echo2 run` only): the
    launcher stops a worker process idle for release_after_s (it bills nothing while released)
    and starts it again when the controller chooses it; its rejoin time is recorded. With a
    catalog, local workers that declare a class are not started until a decision chooses them
    (RunConfig.workers_started_on_demand). "ssh": the hosts of `inventory`, each worker started
    over SSH when chosen and stopped when released (launch/ssh_fleet.py). "skypilot": machines
    SkyPilot rents for the catalog's classes that have a [workers.NAME.skypilot] table
    (launch/skypilot.py). With "ssh" and "skypilot" every worker is offered to the controller
    before any runs, and `echo2 run` starts no local workers."""
    inventory: str = ""
    """With provider "ssh": the inventory TOML of the hosts (echo2.config.inventory)."""
    coordinator_url: str = Field("", pattern=r"^(https?://\S+)?$")
    """With provider "ssh" or "skypilot": how the workers' machines reach the coordinator
    (http://ADDRESS:PORT); an inventory host may set its own. Empty: the coordinator's own URL,
    which only a worker on its machine can use unless coordinator.host is an outside address."""
    release_after_s: float = Field(10.0, ge=0.0)
    """With a releasable provider: how long a worker must stay inactive before it is released
    (a short idle spell is cheaper to ride out than a stop and a cold start)."""
    catalog: str = ""
    """An `echo2 plan` catalog (TOML: [learner], [workers.NAME], [workload], [broadcast]); with it,
    workers that declare one of its classes (worker.worker_class) are chosen by the planner's own
    model, the catalog's figures as the prior and the run's measurements in their place
    (policy/planned.py). The run's S and batch replace the catalog's workload. Empty: every
    worker is priced by its measured rate alone. `echo2 sim` takes the scenario as its catalog
    (sim.activation = "online") and ignores this."""
    max_worker_share: float = Field(0.5, gt=0.0, le=1.0)
    """Most of a batch one worker's groups fill, and of the demand it is credited with while
    other measured workers are live (policy/trust.py, policy/credit.py; one worker alone is
    never capped). 1.0 turns both off."""

    @field_validator("inventory")
    @classmethod
    def _inventory_exists(cls, path: str) -> str:
        if path and not Path(path).is_file():
            raise ValueError(f"no file at {path!r}: give the path of an SSH inventory TOML ([defaults] and "
                             "[[hosts]]: see docs/operations.md, \"Bring your own machines\")")
        return path

    @model_validator(mode="after")
    def _provider_needs(self) -> ActivationConfig:
        if self.provider == "ssh" and not self.inventory:
            raise ValueError("provider \"ssh\" needs inventory: the path of a TOML listing the hosts "
                             "(echo2 run --provider ssh --inventory hosts.toml)")
        if self.provider == "skypilot" and not self.catalog:
            raise ValueError("provider \"skypilot\" needs catalog: an `echo2 plan` catalog whose classes have "
                             "[workers.NAME.skypilot] tables (e.g. configs/catalog/skypilot_example.toml)")
        return self

    @field_validator("catalog")
    @classmethod
    def _catalog_exists(cls, path: str) -> str:
        if path and not Path(path).is_file():
            raise ValueError(f"no file at {path!r}: give the path of an `echo2 plan` catalog TOML "
                             "(e.g. configs/catalog/example.toml), or leave it empty")
        return path
