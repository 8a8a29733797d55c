"""Broadcast rounds: which version travels to which workers, and when.

A shared network (one-to-many, chain, tree) carries one version at a time; in the ideal network
each worker's downlink is its own and only a worker still receiving sits a round out. A round
starts when a version is published and the network is free (or when it frees up, with the newest
version then: intermediate versions are skipped, as a real worker fetches the newest it has
heard of). It goes to every rented, live worker that does not already hold or expect that
version, over the scenario's topology (`broadcast.simulate_round`). Newcomers with no version
get the next round; if the network is idle they start one. Rounds over the same set of
bandwidths are computed once.

A round carries what its furthest-behind member needs (`Workload.catch_up_bytes`): M per
missed version, or join_bytes for a worker with no version (a full version when versions are
deltas), so a delta round that picks up a newcomer costs a full version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from echo2.sim.broadcast import Network, Round, simulate_round
from echo2.sim.events import EventLoop
from echo2.sim.fleet import Fleet, SimWorker


@dataclass
class RoundRecord:
    start_s: float
    version: int
    workers: int
    last_s: float
    """Seconds until the last of its workers held the version (before T_load)."""


class Broadcaster:
    def __init__(self, net: Network, loop: EventLoop, fleet: Fleet, *, pull: bool = False,
                 catch_up_bytes: Callable[[int | None], float] | None = None) -> None:
        """`pull`: workers fetch versions themselves (Fleet.heartbeat); only publish times are kept.
        `catch_up_bytes(versions_behind)`: bytes a round carries (None behind: holds no version);
        default: net.snapshot_bytes always."""
        self.net, self.loop, self.fleet, self.pull = net, loop, fleet, pull
        self.catch_up_bytes = catch_up_bytes or (lambda behind: net.snapshot_bytes)
        self.latest = -1
        self.free_at_s = 0.0
        self.timer_set = False
        self.rounds: list[RoundRecord] = []
        self._cache: dict[tuple[tuple[float, int], ...], Round] = {}

    def publish(self, version: int) -> None:
        self.latest = version
        self.fleet.publish_time_s.append(self.loop.now_s)
        if not self.pull:
            self.kick()

    def kick(self, _worker: SimWorker | None = None) -> None:
        """Start a round now if the network is free, else once it frees up."""
        if self.timer_set:
            return
        if self.loop.now_s >= self.free_at_s:
            self._start_round()
        else:
            self.timer_set = True
            self.loop.at(self.free_at_s, self._timer)

    def _timer(self) -> None:
        self.timer_set = False
        self._start_round()

    def _start_round(self) -> None:
        version = self.latest
        # ideal network: every downlink is its own channel, so a round skips only the workers
        # still busy receiving; shared networks carry one round at a time (busy_s below)
        ideal = self.net.topology == "ideal"
        members = [
            w
            for w in self.fleet.workers
            if w.alive
            and w.rented
            and w.newest() < version
            and not (ideal and w.incoming > max(w.version, w.staged))
        ]
        if version < 0 or not members:
            return
        members.sort(key=lambda w: (-w.bandwidth_bps, w.index))  # the order simulate_round places them in
        need = max(self.catch_up_bytes(version - w.newest() if w.newest() >= 0 else None) for w in members)
        trip = self._round([w.bandwidth_bps for w in members], need)
        for w, arrival_s in zip(members, trip.arrival_s, strict=True):
            self.fleet.expect(w, version)
            self.loop.after(arrival_s, self.fleet.deliver, w, version, w.epoch)
        self.free_at_s = self.loop.now_s + (0.0 if ideal else trip.busy_s)
        self.rounds.append(RoundRecord(self.loop.now_s, version, len(members), trip.last_s))

    def _round(self, bandwidths_bps: list[float], round_bytes: float) -> Round:
        key = (round_bytes, _run_lengths(bandwidths_bps))
        trip = self._cache.get(key)
        if trip is None:
            trip = self._cache[key] = simulate_round(replace(self.net, snapshot_bytes=round_bytes), bandwidths_bps)
        return trip


def _run_lengths(values: list[float]) -> tuple[tuple[float, int], ...]:
    """(value, repeats) of a sorted list: a short, hashable key for a large fleet."""
    out: list[tuple[float, int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return tuple(out)
