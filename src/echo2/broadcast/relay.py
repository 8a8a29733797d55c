"""Relay server: the small aiohttp server every worker (and the learner, as origin) runs to hand
verified chunks to its children.

It holds the newest completed version (what the worker serves and has loaded) and at most one
incoming version (being received). Versions are served by form (`full` or `delta`, see
`catchup`): the learner's origin serves an anchor's delta and its full snapshot side by side. A
child's stream of the incoming version is fed chunk by chunk as the worker verifies them, so
chunk j goes out while chunk j+1 is still arriving. The completed version keeps being served
until the incoming one completes; a failed or superseded incoming version ends its children's
streams with an error frame so they fail over at once.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
from collections import defaultdict

from aiohttp import web

from echo2.broadcast import wire
from echo2.broadcast.catchup import retained
from echo2.broadcast.faults import Fault, FaultKind
from echo2.broadcast.store import VersionBuffer
from echo2.broadcast.throttle import Throttle
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.manifest import Form, Manifest
from echo2.protocol.tls import base_url, warn_plain_bind

log = logging.getLogger(__name__)
SENT_HISTORY = 64
"""Versions whose per-child byte counts are kept for metrics (a long run publishes thousands)."""


class RelayServer:
    def __init__(
        self,
        config: BroadcastConfig,
        *,
        auth_token: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        keep_versions: int = 1,
        keep_since_anchor: bool = False,
        fault: Fault | None = None,
        throttle: Throttle | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`port` 0 picks a free port (read it back from `.port` after `start`). `keep_versions`
        completed versions are served (1 on workers; the learner keeps config.keep_versions, and
        with `keep_since_anchor` every version since its newest anchor: see `catchup.retained`).
        `ssl_context` (echo2.protocol.tls.server_context): serve https; None: plain HTTP."""
        self.config = config
        self.fault = fault
        self.throttle = throttle  # emulated slow uplink (local runs only)
        self._auth_token = auth_token
        self._ssl_context = ssl_context
        self._host, self._port = host, port
        self._keep_versions, self._keep_since_anchor = keep_versions, keep_since_anchor
        self._complete: dict[tuple[int, Form], VersionBuffer] = {}
        self._incoming: VersionBuffer | None = None
        self._announced = asyncio.Event()
        self._sent: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._sent_total_bytes = 0  # every version's, kept past SENT_HISTORY (the heartbeats report it)
        self._streams = 0
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get(wire.CHUNKS_PATH, self._handle_chunks)
        app.router.add_get(wire.STATUS_PATH, self._handle_status)
        # shutdown_timeout: stop() waits this long for open streams; they are cut after that.
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=self._ssl_context)
        await site.start()
        if self._ssl_context is None:
            warn_plain_bind(self._host, "weight server (relay or origin)")
        self._port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.url

    async def stop(self) -> None:
        if self._incoming is not None:
            self._incoming.fail("relay stopping")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return base_url(self._host, self._port, tls=self._ssl_context is not None)

    # ---- versions --------------------------------------------------------------------------

    @property
    def incoming(self) -> VersionBuffer | None:
        """The version being received, if any (read-only use: progress, tests)."""
        return self._incoming

    @property
    def held_version(self) -> int | None:
        """Newest completed version this relay serves (None before the first)."""
        return max((version for version, _ in self._complete), default=None)

    def begin(self, manifest: Manifest) -> VersionBuffer:
        """The store to receive `manifest`'s version into (served to children as it fills).

        A newer version supersedes an unfinished older one (its children get an error frame); the
        same version again resumes the verified prefix of an earlier, failed attempt."""
        held = self.held_version
        if held is not None and manifest.version <= held:
            raise ValueError(f"version {manifest.version} is not newer than held version {held}")
        incoming = self._incoming
        if incoming is not None and incoming.version == manifest.version and incoming.manifest == manifest:
            if incoming.state == "receiving":
                raise ValueError(f"a fetch of version {manifest.version} is already running on this relay")
            incoming.restart()
            return incoming
        if incoming is not None and incoming.version > manifest.version:
            raise ValueError(f"version {manifest.version} is older than incoming version {incoming.version}")
        if incoming is not None:
            incoming.fail(f"superseded by version {manifest.version}", gone=True)
        self._incoming = VersionBuffer(manifest)
        self._announce()
        return self._incoming

    def install(self, manifest: Manifest, payload: bytes) -> VersionBuffer:
        """Serve a complete version whose payload the caller built the manifest from (the origin)."""
        buffer = VersionBuffer(manifest, payload)
        self._complete[manifest.version, manifest.form] = buffer
        self._prune()
        self._announce()
        return buffer

    def promote(self, buffer: VersionBuffer) -> memoryview:
        """Mark a fully verified incoming version complete and serve it instead of the previous one."""
        payload = buffer.complete()
        if self._incoming is buffer:
            self._incoming = None
        self._complete[buffer.version, buffer.manifest.form] = buffer
        self._prune()
        return payload

    def bytes_sent(self, version: int) -> int:
        """Chunk bytes this server sent for `version` (relayed bytes; for the learner, uplink use)."""
        return sum(self._sent.get(version, {}).values())

    def bytes_sent_total(self) -> int:
        """Chunk bytes this server sent since it started, over every version."""
        return self._sent_total_bytes

    def bytes_sent_by_peer(self, version: int) -> dict[str, int]:
        return dict(self._sent.get(version, {}))

    def _prune(self) -> None:
        keep = retained(self._complete, self._keep_versions, since_anchor=self._keep_since_anchor)
        for key in [key for key in self._complete if key not in keep]:
            del self._complete[key]
        for version in sorted(self._sent)[:-SENT_HISTORY]:
            del self._sent[version]

    def _announce(self) -> None:
        event, self._announced = self._announced, asyncio.Event()
        event.set()

    def _lookup(self, version: int, form: Form) -> VersionBuffer | None:
        if (version, form) in self._complete:
            return self._complete[version, form]
        incoming = self._incoming
        if incoming is not None and incoming.version == version and incoming.manifest.form == form:
            return incoming
        return None

    def _newest_known(self) -> int:
        incoming = self._incoming.version if self._incoming is not None else -1
        return max(incoming, self.held_version if self.held_version is not None else -1)

    def _other_form_only(self, version: int, form: Form) -> bool:
        """This relay holds (or receives) `version`, but not in `form`: it never will."""
        other: Form = "delta" if form == "full" else "full"
        return self._lookup(version, other) is not None

    # ---- handlers --------------------------------------------------------------------------

    async def _handle_status(self, request: web.Request) -> web.Response:
        if not self._authorized(request):  # the coordinator's probe: that a relay listens, nothing more
            return web.json_response({"relay": wire.RELAY_MARK})
        incoming = self._incoming
        return web.json_response(
            {
                "relay": wire.RELAY_MARK,
                "held_version": self.held_version,
                "incoming_version": incoming.version if incoming else None,
                "incoming_verified_chunks": incoming.verified_chunks if incoming else 0,
                "streams": self._streams,
            }
        )

    async def _handle_chunks(self, request: web.Request) -> web.StreamResponse:
        self._authorize(request)
        if self._crashed():
            _abort(request)
        version, start, form = _parse_query(request)
        if self._streams >= self.config.max_children:
            raise web.HTTPServiceUnavailable(text=f"relay serves {self._streams} streams already; use another source")
        buffer = self._lookup(version, form)
        if buffer is None and (version < self._newest_known() or self._other_form_only(version, form)):
            raise web.HTTPGone(text=f"version {version} ({form}) is not served here (newest {self._newest_known()})")
        response = web.StreamResponse(headers={"Content-Type": wire.CONTENT_TYPE})
        self._streams += 1  # counted before the first await so concurrent requests see it
        try:
            await response.prepare(request)
            buffer = buffer or await self._await_announce(response, version, form)
            if buffer is not None:
                await _Stream(self, request, response, buffer).run(start)
        except (ConnectionError, TimeoutError) as exc:
            # The child went away or stopped draining for stall_timeout_s: free the uplink.
            log.info("stream of version %s to %s ended: %r", version, request.headers.get(wire.PEER_HEADER), exc)
            _abort(request)
        finally:
            self._streams -= 1
        return response

    async def _await_announce(self, response: web.StreamResponse, version: int, form: Form) -> VersionBuffer | None:
        """Keep the child waiting with keepalives until this relay is told about `version`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.announce_wait_s
        while (buffer := self._lookup(version, form)) is None:
            if self._newest_known() > version or self._other_form_only(version, form):
                # this relay skipped `version` (a newer one came first): the child should move on
                # to its next source now, not wait out announce_wait_s
                reason = f"version {version} skipped here (newest {self._newest_known()})"
                await self._write(response, wire.error_frame(reason, gone=True))
                return None
            if loop.time() >= deadline:
                await self._write(response, wire.error_frame(f"version {version} was never announced here"))
                return None
            event = self._announced
            try:
                await asyncio.wait_for(event.wait(), self.config.keepalive_interval_s)
            except TimeoutError:
                await self._write(response, wire.keepalive_frame(0))
        return buffer

    async def _write(self, response: web.StreamResponse, data: bytes | memoryview) -> None:
        # A child that takes longer than stall_timeout_s plus the chunk at min_rate_bytes_per_s to
        # drain a write is stalled or uselessly slow (the same bound the child applies to senders);
        # dropping it frees the uplink for the others. A flat stall_timeout_s would cut off healthy
        # children of a learner whose uplink is split many ways (one-to-many).
        deadline_s = self.config.stall_timeout_s + len(data) / self.config.min_rate_bytes_per_s
        async with asyncio.timeout(deadline_s):
            await response.write(data)

    def _genuine_elsewhere(self, buffer: VersionBuffer, index: int) -> memoryview:
        """FaultKind.MIX: a verified chunk that is not chunk `index` of `buffer`."""
        for (version, _), other in self._complete.items():
            if version != buffer.version and index < other.manifest.num_chunks:
                return other.chunk_view(index)
        return buffer.chunk_view(index + 1 if index + 1 < buffer.verified_chunks else index - 1)

    def _crashed(self) -> bool:
        """FaultKind.DIE has fired: behave like a killed process (reset every connection)."""
        return self.fault is not None and self.fault.kind is FaultKind.DIE and self.fault.triggered.is_set()

    def _count(self, version: int, peer: str, nbytes: int) -> None:
        self._sent[version][peer] += nbytes
        self._sent_total_bytes += nbytes

    def _authorize(self, request: web.Request) -> None:
        if not self._authorized(request):
            raise web.HTTPUnauthorized(text="missing or wrong bearer token")

    def _authorized(self, request: web.Request) -> bool:
        expected = f"Bearer {self._auth_token}"
        return not self._auth_token or hmac.compare_digest(request.headers.get("Authorization", ""), expected)


class _Stream:
    """One child's stream of one version, from chunk `start` to the last (or to an error)."""

    def __init__(self, relay: RelayServer, request: web.Request, response: web.StreamResponse, buffer: VersionBuffer):
        self.relay, self.request, self.response, self.buffer = relay, request, response, buffer
        self.peer = request.headers.get(wire.PEER_HEADER, "?")[:128]

    async def run(self, start: int) -> None:
        buffer, total = self.buffer, self.buffer.manifest.num_chunks
        if not 0 <= start <= total:
            await self.relay._write(self.response, wire.error_frame(f"start {start} outside 0..{total}"))
            return
        index = start
        while index < total:
            if self.relay._crashed():
                _abort(self.request)
                raise ConnectionResetError("fault: relay died")
            if buffer.state == "failed":
                await self.relay._write(self.response, wire.error_frame(buffer.failure, gone=buffer.gone))
                return
            if index < buffer.verified_chunks:
                await self._send_chunk(index)
                index += 1
            elif not await buffer.wait_beyond(index, self.relay.config.keepalive_interval_s):
                await self.relay._write(self.response, wire.keepalive_frame(buffer.verified_chunks))
        await self.response.write_eof()

    async def _send_chunk(self, index: int) -> None:
        fault = self.relay.fault
        if fault is not None and fault.fires_at(index):
            fault.triggered.set()
            if await self._misbehave(fault, index):
                return
        data = self.buffer.chunk_view(index)
        await self.relay._write(self.response, wire.data_header(index, len(data)))
        await self.relay._write(self.response, data)
        self.relay._count(self.buffer.version, self.peer, len(data))
        if self.relay.throttle is not None:
            await self.relay.throttle.consume(len(data))

    async def _misbehave(self, fault: Fault, index: int) -> bool:
        """Act out the fault before chunk `index`; True when the chunk must not be sent normally."""
        data, write = self.buffer.chunk_view(index), self.relay._write
        kind = fault.kind
        if kind is FaultKind.MIX:
            other = self.relay._genuine_elsewhere(self.buffer, index)
            await write(self.response, wire.data_header(index, len(other)))
            await write(self.response, other)
            return True
        if kind is FaultKind.CORRUPT:
            bad = bytearray(data)
            bad[len(bad) // 2] ^= 0xFF
            await write(self.response, wire.data_header(index, len(bad)))
            await write(self.response, bytes(bad))
            return True
        if kind is FaultKind.HOLD:
            while not fault.release.is_set():
                await write(self.response, wire.keepalive_frame(index))
                await asyncio.sleep(min(0.05, self.relay.config.keepalive_interval_s))
            return False
        if kind in (FaultKind.KEEPALIVE_FOREVER, FaultKind.STALL):
            while not _closing(self.request):  # until the child gives up and hangs up
                if kind is FaultKind.KEEPALIVE_FOREVER:
                    await write(self.response, wire.keepalive_frame(index))
                await asyncio.sleep(self.relay.config.keepalive_interval_s)
            raise ConnectionResetError("fault: child hung up")
        if kind is FaultKind.DIE:
            _abort(self.request)
            raise ConnectionResetError("fault: relay died")
        await self._misbehave_on_data(fault, index, data)
        return True

    async def _misbehave_on_data(self, fault: Fault, index: int, data: memoryview) -> None:
        write, kind = self.relay._write, fault.kind
        if kind is FaultKind.TRUNCATE:
            await write(self.response, wire.data_header(index, len(data)))
            await write(self.response, data[: len(data) // 2])
            await self.response.write_eof()
            raise ConnectionResetError("fault: truncated stream")
        if kind is FaultKind.OVERSIZE:
            await write(self.response, wire.data_header(index, len(data) + (1 << 20)))
            while True:  # an endless body; the child must refuse it from the header
                await write(self.response, data)
        if kind is FaultKind.DRIBBLE:
            await write(self.response, wire.data_header(index, len(data)))
            for offset in range(0, len(data), 16):
                await write(self.response, data[offset : offset + 16])
                await asyncio.sleep(fault.dribble_interval_s)


def _parse_query(request: web.Request) -> tuple[int, int, Form]:
    try:
        version, start = int(request.query["version"]), int(request.query.get("start", "0"))
    except (KeyError, ValueError):
        raise web.HTTPBadRequest(text="expected integer query parameters version and start") from None
    if version < 0 or start < 0:
        raise web.HTTPBadRequest(text="version and start must be >= 0")
    form = request.query.get("form", "full")
    if form not in ("full", "delta"):
        raise web.HTTPBadRequest(text=f"form must be 'full' or 'delta', got {form[:20]!r}")
    return version, start, form  # type: ignore[return-value]


def _closing(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
