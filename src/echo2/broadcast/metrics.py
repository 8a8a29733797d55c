"""Broadcast metrics: per version and per worker, publish -> verified and -> loaded times, bytes
received from each source, bytes relayed; per version, bytes sent by the learner. All records are
pydantic models that dump to one JSON line each (the run's metrics JSONL). A worker's report of
a bad peer, which it sends the coordinator, is echo2.protocol.broadcast's BadPeerReport.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from echo2.protocol.manifest import Manifest


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FetchMetrics(_Record):
    kind: Literal["broadcast_fetch"] = "broadcast_fetch"
    version: int
    worker_id: str
    total_bytes: int
    published_at: float
    """Learner wall clock when the version was signed and served (from the manifest)."""
    started_at: float
    first_chunk_at: float | None
    verified_at: float
    """Every chunk verified: the payload is complete and served to this worker's children."""
    loaded_at: float | None = None
    """Set by the caller once the engine runs the new weights (see `loaded`)."""
    bytes_by_source: dict[str, int]
    """Verified chunk bytes received from each source (resumed fetches show several)."""
    resumed_at_chunks: list[int] = []
    """First missing chunk at each failover (0 would mean a restart from zero)."""
    source_failures: list[str] = []
    bad_peers: list[str] = []
    report_failures: int = 0
    bytes_relayed_at_verified: int = 0
    """Bytes this worker had relayed to its children when it finished (children may still pull;
    ask the relay's `bytes_sent(version)` later for the final count)."""

    @property
    def publish_to_verified_s(self) -> float:
        return self.verified_at - self.published_at

    @property
    def publish_to_loaded_s(self) -> float | None:
        return None if self.loaded_at is None else self.loaded_at - self.published_at

    def loaded(self, at: float) -> FetchMetrics:
        """A copy recording that the engine loaded this version at wall clock `at`."""
        return self.model_copy(update={"loaded_at": at})


class OriginMetrics(_Record):
    kind: Literal["broadcast_origin"] = "broadcast_origin"
    version: int
    total_bytes: int
    bytes_sent: int
    """Learner uplink bytes for this version (one copy per first-hop child in pipelined mode)."""
    bytes_by_child: dict[str, int]


@dataclass(frozen=True)
class FetchResult:
    payload: memoryview
    """The complete payload, every chunk verified against the signed manifest: a read-only view
    of the same memory the relay serves children from (no copy; one payload of RAM per version).
    `torch.frombuffer(payload, dtype=torch.uint8)` uses it in place; `bytes(payload)` copies."""
    manifest: Manifest
    metrics: FetchMetrics


class LatencySummary(_Record):
    count: int = Field(ge=0)
    p50_s: float | None
    p95_s: float | None
    max_s: float | None


def latency_summary(values_s: list[float]) -> LatencySummary:
    """p50 / p95 / max (nearest-rank percentiles: always a value that was measured)."""
    if not values_s:
        return LatencySummary(count=0, p50_s=None, p95_s=None, max_s=None)
    ordered = sorted(values_s)
    return LatencySummary(
        count=len(ordered), p50_s=_nearest_rank(ordered, 50), p95_s=_nearest_rank(ordered, 95), max_s=ordered[-1]
    )


def _nearest_rank(ordered: list[float], percent: float) -> float:
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]
