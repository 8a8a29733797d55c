"""Learner side of delta versions: in which forms each version goes out (bytes in, bytes out).

With `BroadcastConfig.deltas` off every version is full. With it on, version v is a delta
against v-1 (the previous payload is kept here as the base), and a full snapshot goes out as
well (an anchor) every `anchor_every` versions, when the coordinator asked for one, and whenever
no delta is possible: the first version a learner process publishes (it holds no base), or a
payload whose layout changed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from echo2.broadcast.delta import encode_delta, same_layout
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.manifest import FULL_CODEC, TensorEntry, content_index


@dataclass(frozen=True)
class Encoded:
    """One form of a version, ready to hash and sign."""

    payload: bytes | memoryview
    base_version: int | None = None
    codec: str = FULL_CODEC
    content: list[TensorEntry] = field(default_factory=list)
    content_bytes: int = 0
    encode_s: float = 0.0


class VersionEncoder:
    def __init__(self, config: BroadcastConfig) -> None:
        self.config = config
        self._base: tuple[int, bytes | memoryview] | None = None
        self.anchor_requested = False
        """Set from the coordinator's publish reply: the next version also goes out full."""

    def encode(self, version: int, payload: bytes | memoryview) -> list[Encoded]:
        """The forms of `version`: [delta], [delta, full] (an anchor) or [full]. The first is
        the one the broadcast tree carries to workers holding version - 1."""
        base, self._base = self._base, (version, payload)
        if not self.config.deltas:
            return [Encoded(payload)]
        forms = []
        if base is not None and base[0] == version - 1 and same_layout(base[1], payload):
            forms.append(self._delta(version - 1, base[1], payload))
        if not forms or self.anchor_requested or version % self.config.anchor_every == 0:
            forms.append(Encoded(payload))
            self.anchor_requested = False
        return forms

    def _delta(self, base_version: int, base: bytes | memoryview, payload: bytes | memoryview) -> Encoded:
        started = time.perf_counter()
        delta = encode_delta(base, payload, codec=self.config.delta_codec, level=self.config.delta_zstd_level)
        return Encoded(delta, base_version=base_version, codec=self.config.delta_codec, content=content_index(payload),
                       content_bytes=len(payload), encode_s=time.perf_counter() - started)
