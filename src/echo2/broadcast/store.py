"""Chunk store of one version: the only place received bytes are kept, and only once verified.

Chunks arrive in order (a stream, and a failover resumes at the first missing chunk), so the
store holds a verified prefix: `verified_chunks` chunks, each checked against the manifest's
sha256 before it is copied in. Relay streams wait on the store for the next chunk, which is how a
worker forwards chunk j while it is still receiving chunk j+1.

Received versions live in an anonymous memory map: the kernel zero-fills pages lazily, so
memory is touched chunk by chunk while the network is the bottleneck (a zero-filled bytearray
would touch all of it up front: seconds for a large version on a loaded box), and the finished
payload is a read-only view of the same pages: no final copy, one payload's worth of memory per
version.
"""

from __future__ import annotations

import asyncio
import mmap
from typing import Literal

from echo2.broadcast.wire import SourceMisbehaved
from echo2.protocol.manifest import Manifest, sha256_hex, verify_chunk

State = Literal["receiving", "complete", "failed"]


class VersionBuffer:
    def __init__(self, manifest: Manifest, payload: bytes | None = None) -> None:
        """An empty store to receive into, or (`payload` given, already verified by the caller,
        as the learner does for what it built the manifest from) a complete one."""
        self.manifest = manifest
        if payload is not None:
            self._view = memoryview(payload)
        elif manifest.total_bytes:
            self._view = memoryview(mmap.mmap(-1, manifest.total_bytes))
        else:
            self._view = memoryview(b"")
        self.verified_chunks = manifest.num_chunks if payload is not None else 0
        self.state: State = "complete" if payload is not None or manifest.num_chunks == 0 else "receiving"
        self.failure = ""
        self.gone = False
        self._changed = asyncio.Event()

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def done(self) -> bool:
        return self.verified_chunks == self.manifest.num_chunks

    def add_chunk(self, index: int, data: bytes | memoryview) -> None:
        """Store chunk `index` if it is the next one and matches its sha256; raise otherwise."""
        if index != self.verified_chunks:
            raise ValueError(f"chunk {index} added out of order; next missing is {self.verified_chunks}")
        if not verify_chunk(self.manifest, index, data):
            raise SourceMisbehaved(f"chunk {index} of version {self.version} fails its sha256", reason="corrupt_chunk",
                                   chunk_index=index, got_sha256=sha256_hex(data))
        start, end = self.manifest.chunk_span(index)
        self._view[start:end] = data
        self.verified_chunks += 1
        self._notify()

    def chunk_view(self, index: int) -> memoryview:
        if index >= self.verified_chunks:
            raise ValueError(f"chunk {index} is not verified yet ({self.verified_chunks} are)")
        start, end = self.manifest.chunk_span(index)
        return self._view[start:end].toreadonly()

    def complete(self) -> memoryview:
        """Mark the fully verified version complete; returns the payload as a read-only view."""
        if not self.done:
            raise ValueError(f"version {self.version} has {self.verified_chunks}/{self.manifest.num_chunks} chunks")
        self.state = "complete"
        self._notify()
        return self._view.toreadonly()

    def fail(self, reason: str, gone: bool = False) -> None:
        """Give up on this version: streams to children end with an error frame naming `reason`
        (`gone`: superseded here, so they should not ask again)."""
        if self.state == "receiving" and not self.done:  # a fully verified version cannot fail
            self.state, self.failure, self.gone = "failed", reason, gone
            self._notify()

    def restart(self) -> None:
        """Receive again after a failure, keeping the verified prefix (resume, not from zero)."""
        if self.state == "failed":
            self.state, self.failure, self.gone = "receiving", "", False

    async def wait_beyond(self, held: int, timeout_s: float) -> bool:
        """Wait until more than `held` chunks are verified or the state changes; False on timeout."""
        if self.verified_chunks > held or self.state == "failed":
            return True
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _notify(self) -> None:
        # A fresh event per change: waiters woken by the old one re-check state, none miss a wakeup.
        event, self._changed = self._changed, asyncio.Event()
        event.set()
