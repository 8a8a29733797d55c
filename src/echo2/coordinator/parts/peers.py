"""What the broadcast knows of the live workers: a `Peer` (or the registry's own record, which
has the same fields: `PeerLike`), and `LivePeers`, a view of them at one moment that answers
the questions the relay planner asks without a pass over the fleet per question."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Peer:
    """What the coordinator knows of one live worker, for the broadcast."""

    worker_id: str
    relay_address: str
    upload_bps: float
    download_bps: float
    version: int
    """Version the worker holds (from its heartbeats)."""


class PeerLike(Protocol):
    """What the broadcast reads of a worker: a `Peer`, or the registry's record itself."""

    @property
    def worker_id(self) -> str: ...
    @property
    def relay_address(self) -> str: ...
    @property
    def upload_bps(self) -> float: ...
    @property
    def download_bps(self) -> float: ...
    @property
    def version(self) -> int: ...


class LivePeers:
    """The live workers as the broadcast sees them at one moment: every one for a version's
    plan, one by id, and each version's holders fastest uplink first (for late joiners), sorted
    at most once per version however many workers join."""

    def __init__(self, peers: Iterable[PeerLike], *, membership: int | None = None) -> None:
        """`membership`: the registry's count of joins and departures when the view was made
        (None: a view made by hand). Two views at the same count hold the same workers."""
        self.by_id = {p.worker_id: p for p in peers}
        self.membership = membership
        self._holders: dict[int, list[PeerLike]] = {}

    def __iter__(self) -> Iterator[PeerLike]:
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, worker_id: str) -> PeerLike | None:
        return self.by_id.get(worker_id)

    def holders(self, version: int) -> list[PeerLike]:
        """Workers holding `version` or newer, fastest uplink first (ties by id), the order
        `late_joiner_assignment` picks sources in."""
        made = self._holders.get(version)
        if made is None:
            made = sorted((p for p in self.by_id.values() if p.version >= version),
                          key=lambda p: (-p.upload_bps, p.worker_id))
            self._holders[version] = made
        return made


def live_peers(peers: LivePeers | Iterable[PeerLike]) -> LivePeers:
    return peers if isinstance(peers, LivePeers) else LivePeers(peers)




def fleet_key(peers: LivePeers | list[PeerLike]) -> tuple:
    """What names a set of workers and the links the relay planner reads: a registry view's
    membership count (no pass over the fleet), else every worker's link fields."""
    membership = peers.membership if isinstance(peers, LivePeers) else None
    if membership is not None:
        return ("membership", membership)
    return tuple((p.worker_id, p.relay_address, p.upload_bps, p.download_bps) for p in peers)
