"""Loopback broadcast cluster for tests: a real Origin and real RelayServers on 127.0.0.1 port 0
in one event loop, faults injected by enum, every await bounded by a timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from echo2.broadcast import (
    FetchResult,
    Origin,
    RelayServer,
    fetch_version,
    generate_private_key,
    plan_broadcast,
)
from echo2.broadcast.faults import Fault
from echo2.broadcast.lab.payload import synthetic_payload
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.broadcast import BadPeerReport, BroadcastPlan, OriginInfo, PeerInfo
from echo2.protocol.manifest import SignedManifest

T = TypeVar("T")
TOKEN = "test-token"
CHUNK = 4096
FAST = BroadcastConfig(
    chunk_bytes=CHUNK,
    connect_timeout_s=0.5,
    stall_timeout_s=0.6,
    keepalive_interval_s=0.1,
    progress_timeout_s=1.5,
    announce_wait_s=1.0,
    retry_backoff_s=0.05,
    min_rate_bytes_per_s=50_000,
    report_timeout_s=0.5,
)
"""Timeouts scaled down ~20x from the defaults so fault tests finish in about a second."""


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
    """Run a test scenario; a hang fails the test instead of stalling the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


@dataclass
class Cluster:
    config: BroadcastConfig
    origin: Origin
    relays: dict[str, RelayServer]
    reports: list[BadPeerReport] = field(default_factory=list)
    key: Any = None

    @property
    def public_key(self) -> Any:
        return self.origin.public_key

    def plan(self, version: int, workers: list[str] | None = None) -> BroadcastPlan:
        peers = [PeerInfo(peer_id=w, url=self.relays[w].url, upload_bytes_per_s=1e8, download_bytes_per_s=1e8)
                 for w in (workers or list(self.relays))]
        return plan_broadcast(version, OriginInfo(url=self.origin.url, upload_bytes_per_s=1e8), peers, self.config)

    async def report(self, report: BadPeerReport) -> None:
        self.reports.append(report)

    async def fetch(self, worker: str, signed: SignedManifest, plan: BroadcastPlan, *,
                    held_version: int | None = None, auth_token: str = TOKEN) -> FetchResult:
        return await fetch_version(
            signed, plan.for_worker(worker), public_key=self.public_key, held_version=held_version,
            config=self.config, relay=self.relays[worker], auth_token=auth_token, worker_id=worker,
            report_bad_peer=self.report,
        )

    async def fetch_all(self, signed: SignedManifest, plan: BroadcastPlan, **kwargs: Any) -> dict[str, Any]:
        names = [a.worker_id for a in plan.assignments]
        results = await asyncio.gather(*(self.fetch(n, signed, plan, **kwargs) for n in names),
                                       return_exceptions=True)
        return dict(zip(names, results, strict=True))

    async def stop(self) -> None:
        for relay in self.relays.values():
            await relay.stop()
        await self.origin.stop()


async def start_cluster(n: int, *, config: BroadcastConfig = FAST, faults: dict[str, Fault] | None = None,
                        origin_fault: Fault | None = None) -> Cluster:
    faults = faults or {}
    origin = Origin(generate_private_key(), config, auth_token=TOKEN, fault=origin_fault)
    await origin.start()
    relays = {f"w{i}": RelayServer(config, auth_token=TOKEN, fault=faults.get(f"w{i}")) for i in range(n)}
    for relay in relays.values():
        await relay.start()
    return Cluster(config=config, origin=origin, relays=relays)


def payload(chunks: float = 24.5, seed: int = 0) -> bytes:
    """A payload of about `chunks` test chunks (the last one short, as in real life)."""
    return synthetic_payload(int(chunks * CHUNK), seed=seed)
