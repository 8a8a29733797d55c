"""Learner side of a broadcast: build and sign each version's manifest, serve its chunks to the
first-hop workers (every worker in one-to-many mode).

`Origin` is the asyncio object; the learner is a torch training loop, so `OriginThread` runs an
Origin on its own event loop in a daemon thread and exposes blocking `start`, `publish`, `stats`
and `stop`. Hashing a version (sha256 of every chunk) happens in the calling thread, so the
serving loop keeps streaming the previous version meanwhile. `prepare_version` encodes a
version in the forms `encoder.VersionEncoder` picks (a delta, a full anchor, or both).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from echo2.broadcast.encoder import Encoded, VersionEncoder
from echo2.broadcast.faults import Fault
from echo2.broadcast.metrics import OriginMetrics
from echo2.broadcast.relay import RelayServer
from echo2.broadcast.signing import sign_manifest
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.manifest import (
    FULL_CODEC,
    AdapterSpec,
    Codec,
    Form,
    SignedManifest,
    TensorEntry,
    build_manifest,
)

T = TypeVar("T")


class Origin:
    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        config: BroadcastConfig,
        *,
        auth_token: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        fault: Fault | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.config = config
        self._private_key = private_key
        self.relay = RelayServer(
            config, auth_token=auth_token, host=host, port=port, keep_versions=config.keep_versions,
            keep_since_anchor=True, fault=fault, ssl_context=ssl_context,
        )
        self.encoder = VersionEncoder(config)
        self._total_bytes: dict[int, int] = {}
        self._last_prepared: tuple[int, set[Form]] | None = None  # touched by the publishing thread only

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._private_key.public_key()

    @property
    def url(self) -> str:
        return self.relay.url

    async def start(self) -> str:
        return await self.relay.start()

    async def stop(self) -> None:
        await self.relay.stop()

    def prepare(self, version: int, payload: bytes | memoryview, *, base_version: int | None = None,
                codec: Codec = FULL_CODEC, content: list[TensorEntry] | None = None,
                content_bytes: int = 0, adapter: AdapterSpec | None = None) -> SignedManifest:
        """Hash and sign one form of a version (CPU only, safe from any thread); `install` then
        starts serving it. A version may be prepared once per form (an anchor: delta and full)."""
        form: Form = "full" if base_version is None else "delta"
        last = self._last_prepared
        if last is not None and (version < last[0] or (version == last[0] and form in last[1])):
            raise ValueError(f"version {version} ({form}) must be newer than the last published version {last[0]}")
        manifest = build_manifest(version, payload, self.config.chunk_bytes, base_version=base_version, codec=codec,
                                  content=content, content_bytes=content_bytes, adapter=adapter)
        self._last_prepared = (version, (last[1] if last and last[0] == version else set()) | {form})
        # Publish time is taken after hashing: dissemination is measured from when it can start.
        return sign_manifest(manifest.model_copy(update={"published_at": time.time()}), self._private_key)

    def prepare_version(self, version: int, payload: bytes | memoryview, *,
                        adapter: AdapterSpec | None = None) -> list[tuple[SignedManifest, Encoded]]:
        """Encode a full payload in the forms the encoder picks and sign each; the first is what
        the broadcast tree carries (the delta when there is one). `adapter`: the payload holds
        LoRA adapters only."""
        return [(self.prepare(version, form.payload, base_version=form.base_version, codec=form.codec,  # type: ignore[arg-type]
                              content=form.content, content_bytes=form.content_bytes, adapter=adapter), form)
                for form in self.encoder.encode(version, payload)]

    def install(self, signed: SignedManifest, payload: bytes | memoryview) -> None:
        manifest = signed.unverified_manifest()  # we signed it a moment ago
        self.relay.install(manifest, payload)
        self._total_bytes.setdefault(manifest.version, manifest.total_bytes)  # the tree's form comes first

    def publish(self, version: int, payload: bytes, *, base_version: int | None = None) -> SignedManifest:
        """Sign `payload` as `version` and serve it; hand the result to the coordinator."""
        signed = self.prepare(version, payload, base_version=base_version)
        self.install(signed, payload)
        return signed

    def stats(self, version: int) -> OriginMetrics:
        return OriginMetrics(
            version=version, total_bytes=self._total_bytes.get(version, 0),
            bytes_sent=self.relay.bytes_sent(version), bytes_by_child=self.relay.bytes_sent_by_peer(version),
        )


class LoopThread:
    """An asyncio loop in a daemon thread; `call` runs a coroutine there and waits for it."""

    def __init__(self, name: str = "echo2-broadcast") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()


class OriginThread:
    """Blocking facade over an `Origin` for the (synchronous, torch) learner loop."""

    def __init__(self, private_key: Ed25519PrivateKey, config: BroadcastConfig, **origin_kwargs: Any) -> None:
        self._private_key, self._config, self._kwargs = private_key, config, origin_kwargs
        self._loop: LoopThread | None = None
        self.origin: Origin | None = None

    def start(self, timeout_s: float = 10.0) -> str:
        """Start serving; returns the origin's base URL. 10 s: binding a port takes milliseconds,
        the margin is for a learner box busy with its first training step."""
        self._loop = LoopThread("echo2-origin")
        self.origin = self._loop.call(self._make(), timeout_s)
        return self._loop.call(self.origin.start(), timeout_s)

    async def _make(self) -> Origin:
        return Origin(self._private_key, self._config, **self._kwargs)  # built on the loop it serves from

    def publish(self, version: int, payload: bytes, *, base_version: int | None = None,
                timeout_s: float = 10.0) -> SignedManifest:
        origin, loop = self._require()
        signed = origin.prepare(version, payload, base_version=base_version)  # hashing, in this thread
        loop.call(_run(origin.install, signed, payload), timeout_s)
        return signed

    def stats(self, version: int, timeout_s: float = 10.0) -> OriginMetrics:
        origin, loop = self._require()
        return loop.call(_run(origin.stats, version), timeout_s)

    @property
    def url(self) -> str:
        return self._require()[0].url

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is None or self.origin is None:
            return
        try:
            self._loop.call(self.origin.stop(), timeout_s)
        finally:
            self._loop.close()
            self._loop = self.origin = None

    def _require(self) -> tuple[Origin, LoopThread]:
        if self._loop is None or self.origin is None:
            raise ValueError("OriginThread is not started; call start() first")
        return self.origin, self._loop


async def _run(fn: Any, *args: Any) -> Any:
    return fn(*args)
