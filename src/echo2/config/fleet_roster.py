"""Which workers a releasable provider offers the run before any machine starts: the roster the
coordinator's activation controller chooses among (every one released, billing nothing) and the
launcher's provider acquires from.

- "local": the local workers that declare a catalog class (RunConfig.workers_started_on_demand).
- "ssh": every worker of every inventory host (NAME-0, NAME-1...), at the host's price shared
  among its workers.
- "skypilot": `count` workers of each catalog class with a [workers.NAME.skypilot] table
  (NAME-0, NAME-1...), at the class's price."""

from __future__ import annotations

from typing import NamedTuple

from echo2.config.catalog import PlanConfig
from echo2.config.inventory import SshInventory, load_inventory


class OfferedWorker(NamedTuple):
    """A worker the run's provider starts only when the controller chooses it."""

    worker_id: str
    price_per_hour: float
    worker_class: str


def inventory_offers(inventory: SshInventory) -> tuple[OfferedWorker, ...]:
    return tuple(OfferedWorker(worker_id, host.price_per_hour / host.workers_per_host, host.worker_class)
                 for host in inventory.hosts for worker_id in host.worker_ids())


def skypilot_offers(catalog: PlanConfig) -> tuple[OfferedWorker, ...]:
    return tuple(OfferedWorker(f"{name}-{i}", cls.price_per_hour, name)
                 for name, cls in sorted(catalog.workers.items()) if cls.skypilot is not None
                 for i in range(cls.count))


def remote_offers(provider: str, *, inventory_path: str, catalog: PlanConfig | None) -> tuple[OfferedWorker, ...]:
    """The ssh or skypilot roster (empty for the other providers)."""
    if provider == "ssh":
        inventory = load_inventory(inventory_path)
        if catalog is not None:
            inventory.check_classes(set(catalog.workers), "the activation catalog")
        return inventory_offers(inventory)
    if provider == "skypilot" and catalog is not None:
        offers = skypilot_offers(catalog)
        if not offers:
            raise ValueError("provider \"skypilot\": no class of the activation catalog has a "
                             "[workers.NAME.skypilot] table with count > 0, so there is nothing to rent; add one "
                             "(see configs/catalog/skypilot_example.toml)")
        return offers
    return ()
