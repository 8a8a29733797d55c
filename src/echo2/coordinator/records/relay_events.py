"""The coordinator's events about relays: a worker's bad-peer report and the coordinator's own
check of one (`parts.relay_reports`), records as in `records.events`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from echo2.coordinator.records.events import Event


@dataclass(frozen=True)
class BadPeer(Event):
    kind: ClassVar[str] = "bad_peer"
    version: int
    reporter_id: str
    peer_id: str
    url: str
    chunk_index: int
    form: str
    got_sha256: str
    reason: str
    detail: str
    took_effect: bool
    avoided_by: str


@dataclass(frozen=True)
class RelayChecked(Event):
    """The coordinator fetched a reported chunk from the peer itself and judged it."""

    kind: ClassVar[str] = "relay_checked"
    peer_id: str
    version: int
    form: str
    chunk_index: int
    verdict: str
    seen: str
    reporters: list[str]
    refuted: list[str]
