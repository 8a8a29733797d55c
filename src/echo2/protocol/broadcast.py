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


_INDEX_KEY = "_by_worker_index"
"""Where a BroadcastPlan keeps its index of assignments by worker (see `_by_worker`)."""


class BroadcastPlan(_Model):
    version: int
    mode: Mode
    stream_rate_bytes_per_s: float
    origin_children: list[str]
    assignments: list[Assignment]

    def for_worker(self, worker_id: str) -> Assignment:
        """The worker's assignment (the first one naming it), in O(1): the coordinator asks once
        per worker, and a scan per call would cost O(workers^2) per version."""
        assignment = self._by_worker().get(worker_id)
        if assignment is None:
            raise ValueError(f"worker {worker_id!r} is not in the plan for version {self.version}")
        return assignment

    def _by_worker(self) -> dict[str, Assignment]:
        """Worker id -> assignment, built on first use and kept in the instance's __dict__ next
        to the fields (where functools.cached_property would keep it): pydantic compares,
        hashes, prints and serializes the fields alone, so equality and JSON are unchanged, and a
        private attribute would not do (pydantic compares those). model_copy copies the
        __dict__, so the index is rebuilt unless it was built from this very list."""
        cached = self.__dict__.get(_INDEX_KEY)
        if cached is not None and cached[0] is self.assignments and cached[1] == len(self.assignments):
            return cached[2]
        index: dict[str, Assignment] = {}
        for assignment in self.assignments:
            index.setdefault(assignment.worker_id, assignment)
        self.__dict__[_INDEX_KEY] = (self.assignments, len(self.assignments), index)
        return index


class BadPeerReport(_Model):
    """What a worker tells the coordinator about a source that sent bytes no honest relay sends."""

    kind: Literal["bad_peer"] = "bad_peer"
    version: int = Field(ge=0)
    # bounded: reports come from untrusted workers and land in the metrics (uncapped, each
    # report could put megabytes into metrics.jsonl)
    reporter_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    peer_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    url: str = Field("", max_length=512)
    chunk_index: int = Field(ge=0)
    form: Literal["full", "delta"] = "full"
    """The form of the version the reporter was fetching: the coordinator asks the peer for the
    same chunk of the same form to confirm the report."""
    got_sha256: str = Field("", max_length=64, pattern=r"^([0-9a-f]{64})?$")
    """The sha256 of the chunk the reporter received (empty: it received no whole chunk)."""
    reason: Literal["corrupt_chunk", "protocol_violation"]
    detail: str = Field("", max_length=1000)
