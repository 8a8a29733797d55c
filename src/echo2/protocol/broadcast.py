"""Wire types of the weight broadcast: who pulls each version from whom (the coordinator's plan
and the assignment it sends each worker next to the signed manifest, built by
echo2.broadcast.topology) and a worker's report of a source that sent bad bytes. Data only: no
HTTP stack, no signature library, so the control plane's messages carry them cheaply."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ORIGIN_ID = "origin"
Mode = Literal["pipelined", "one_to_many"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PeerInfo(_Model):
    peer_id: str = Field(min_length=1)
    url: str = ""
    """Relay base URL (http://host:port); empty for a worker that cannot accept connections."""
    upload_bytes_per_s: float = Field(gt=0)
    download_bytes_per_s: float = Field(gt=0)
    reachable: bool = True
    """Accepts incoming connections; False (behind NAT) makes the worker a leaf."""


class OriginInfo(_Model):
    url: str
    upload_bytes_per_s: float = Field(gt=0)
    peer_id: str = ORIGIN_ID


class Source(_Model):
    peer_id: str
    url: str


class Assignment(_Model):
    """What the coordinator sends a worker for one version, next to the signed manifest."""

    kind: Literal["broadcast_assignment"] = "broadcast_assignment"
    version: int = Field(ge=0)
    worker_id: str
    mode: Mode
    sources: list[Source] = Field(min_length=1)
    """Parent first, then fallbacks in order; the learner last."""
    children: list[str] = []
    """Workers expected to pull from this one (informational: any authorized peer may pull)."""
    depth: int = Field(1, ge=1)
    """Hops from the learner (1: fed by the learner directly)."""
    edge_rate_bytes_per_s: float = Field(gt=0)
    """Planned rate of the parent -> this worker link (parent uplink share, capped by downlink)."""
    planned_rate_bytes_per_s: float = Field(gt=0)
    """Planned end-to-end rate: the slowest edge on the path from the learner."""


class BroadcastPlan(_Model):
    version: int
    mode: Mode
    stream_rate_bytes_per_s: float
    origin_children: list[str]
    assignments: list[Assignment]

    def for_worker(self, worker_id: str) -> Assignment:
        for assignment in self.assignments:
            if assignment.worker_id == worker_id:
                return assignment
        raise ValueError(f"worker {worker_id!r} is not in the plan for version {self.version}")


class BadPeerReport(_Model):
    """What a worker tells the coordinator about a source that sent bytes no honest relay sends."""

    kind: Literal["bad_peer"] = "bad_peer"
    version: int = Field(ge=0)
    # bounded: reports come from untrusted workers and land in the metrics (3 uncapped reports
    # once added 22 MB to metrics.jsonl)
    reporter_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    peer_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    url: str = Field("", max_length=512)
    chunk_index: int = Field(ge=0)
    reason: Literal["corrupt_chunk", "protocol_violation"]
    detail: str = Field("", max_length=1000)
