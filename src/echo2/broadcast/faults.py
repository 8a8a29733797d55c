"""Fault injection for relay tests and benchmarks: how a broken or hostile relay misbehaves.

A `RelayServer` built with a `Fault` misbehaves on every stream when it reaches chunk
`at_chunk`. Never set from a config file: only tests and `echo2.broadcast.lab` construct one.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field


class FaultKind(enum.Enum):
    CORRUPT = "corrupt"
    """Send chunk at_chunk with one byte flipped (right length, wrong sha256)."""
    DIE = "die"
    """Crash: reset every open stream and every later connection, as a killed process would."""
    STALL = "stall"
    """Go silent (no data, no keepalive) before chunk at_chunk, keeping the connection open."""
    TRUNCATE = "truncate"
    """Send half of chunk at_chunk, then end the response cleanly (a truncated stream)."""
    OVERSIZE = "oversize"
    """Announce chunk at_chunk as 1 MiB longer than the manifest says and keep sending."""
    KEEPALIVE_FOREVER = "keepalive_forever"
    """Before chunk at_chunk send keepalives forever (an endless stream with no progress)."""
    DRIBBLE = "dribble"
    """Send chunk at_chunk a few bytes at a time (a slow sender that never quite stalls)."""
    MIX = "mix"
    """Send, as chunk at_chunk, a genuine chunk from elsewhere: the same index of another
    version this server holds, else the next chunk of this version (mix-and-match)."""
    HOLD = "hold"
    """Before chunk at_chunk send keepalives until `release` is set, then carry on normally."""


@dataclass
class Fault:
    kind: FaultKind
    at_chunk: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """HOLD only: set it to let held streams continue."""
    dribble_interval_s: float = 0.05
    """DRIBBLE only: pause between 16-byte writes."""
    triggered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set the first time the fault fires, so a test can wait for it."""

    def fires_at(self, index: int) -> bool:
        return index == self.at_chunk
