"""Worker side of a broadcast: verify the signed manifest, pull the version from the assigned
sources, verify every chunk before it is kept or relayed, fail over on any problem.

`fetch_version` streams from the first source starting at the first missing chunk. Each chunk is
checked against the manifest's sha256 by the store before it is kept, so a worker's relay (if
given) forwards only verified chunks and does so while the next one is still arriving. When a
source stalls, dies, truncates, is too slow or misbehaves, the fetch resumes from the same chunk
at the next source; misbehaving sources are reported and never retried. The previous version
stays served (and loaded) until every chunk of the new one is verified.

Limits enforced on every stream (values and reasons in `BroadcastConfig`):
  silence       no byte for stall_timeout_s (aiohttp sock_read)           -> next source
  no progress   keepalives only for progress_timeout_s (endless stream)     -> next source
  slow chunk    chunk body longer than stall_timeout_s + bytes / rate_floor -> next source
  slow stream   average below rate_floor once progress_timeout_s has passed -> next source
  truncated     EOF before the last chunk                                   -> next source
  oversized     frame length != manifest chunk size, or out-of-order index  -> reported
  corrupt       sha256 mismatch                                             -> reported
Bytes past the last chunk are never read.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from echo2.broadcast import wire
from echo2.broadcast.metrics import FetchMetrics, FetchResult
from echo2.broadcast.relay import RelayServer
from echo2.broadcast.signing import verify_manifest
from echo2.broadcast.store import VersionBuffer
from echo2.broadcast.throttle import Throttle
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.broadcast import Assignment, BadPeerReport, Source
from echo2.protocol.manifest import SignedManifest
from echo2.protocol.tls import describe_failure, warn_plain_url

log = logging.getLogger(__name__)
ReportBadPeer = Callable[[BadPeerReport], Awaitable[None]]


async def fetch_version(
    signed: SignedManifest,
    assignment: Assignment,
    *,
    public_key: Ed25519PublicKey,
    held_version: int | None,
    config: BroadcastConfig,
    relay: RelayServer | None = None,
    auth_token: str = "",
    worker_id: str = "",
    report_bad_peer: ReportBadPeer | None = None,
    session: aiohttp.ClientSession | None = None,
    throttle: Throttle | None = None,
    measured_rate_bytes_per_s: float | None = None,
) -> FetchResult:
    """Fetch and verify `signed`'s version from `assignment.sources` (in order).
    `measured_rate_bytes_per_s`, the rate this worker received its previous versions at, sets the
    slow-sender cutoff when known; else the plan's rate does (built from declared link speeds).
    Either way the cutoff never drops below config.rate_floor_bytes_per_s.

    Raises ManifestRejected (bad signature, not newer than `held_version`, too large) before any
    network traffic; BroadcastFailed when every source failed (the relay keeps serving the
    previous version); FetchAborted when a newer version superseded this one on `relay`.
    """
    manifest = verify_manifest(signed, public_key, held_version=held_version,
                               max_payload_bytes=config.max_payload_bytes)
    if assignment.version != manifest.version:
        raise ValueError(f"assignment is for version {assignment.version}, manifest for {manifest.version}")
    for source in assignment.sources:
        warn_plain_url(source.url, f"weight source {source.peer_id}")
    buffer = relay.begin(manifest) if relay is not None else VersionBuffer(manifest)
    job = _Fetch(buffer, assignment, config, auth_token=auth_token,
                 worker_id=worker_id or assignment.worker_id, report=report_bad_peer,
                 measured_rate_bytes_per_s=measured_rate_bytes_per_s)
    job.throttle = throttle
    owned = session is None
    session = session or new_session(config)
    try:
        await job.run(session)
    except BaseException as exc:
        buffer.fail(f"fetch ended: {exc!r}"[:200])  # children fail over at once instead of stalling
        raise
    finally:
        if owned:
            await session.close()
    payload = relay.promote(buffer) if relay is not None else buffer.complete()
    return FetchResult(payload=payload, manifest=manifest, metrics=job.metrics(relay))


def new_session(config: BroadcastConfig, ssl_context: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """A client session fit for chunk streams: no decompression, a 1 MiB read buffer (fewer
    wakeups per chunk), and the stream timeouts as defaults (each request sets them too).
    `ssl_context` (echo2.protocol.tls.client_context) verifies https:// sources; None: the
    system's trust store."""
    connector = aiohttp.TCPConnector(ssl=ssl_context) if ssl_context is not None else None
    return aiohttp.ClientSession(auto_decompress=False, read_bufsize=1 << 20, timeout=_stream_timeout(config),
                                 connector=connector)


def _stream_timeout(config: BroadcastConfig) -> aiohttp.ClientTimeout:
    # No total: a 16 GB version legitimately streams for minutes. Connect and silence are bounded
    # (connect_timeout_s, stall_timeout_s: values justified in BroadcastConfig); slow and endless
    # streams are bounded by the frame checks below.
    return aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s, sock_read=config.stall_timeout_s)


def slow_sender_floor(config: BroadcastConfig, planned_rate_bytes_per_s: float,
                      measured_rate_bytes_per_s: float | None) -> float:
    """The slowest a source may send before it is cut off: config.min_rate_bytes_per_s, lowered
    to a quarter of the rate this worker measured on earlier versions (else of the plan's rate,
    which comes from declared link speeds) when that is slower, never below
    config.rate_floor_bytes_per_s (a relay declaring a few bytes per second could otherwise hold
    a child for hours)."""
    basis = measured_rate_bytes_per_s or planned_rate_bytes_per_s
    return max(config.rate_floor_bytes_per_s, min(config.min_rate_bytes_per_s, basis / 4))


class _Fetch:
    def __init__(self, buffer: VersionBuffer, assignment: Assignment, config: BroadcastConfig,
                 *, auth_token: str, worker_id: str, report: ReportBadPeer | None,
                 measured_rate_bytes_per_s: float | None = None) -> None:
        self.buffer, self.assignment, self.config = buffer, assignment, config
        self.headers = wire.bearer_headers(auth_token, worker_id)
        self.worker_id, self.report = worker_id, report
        self.rate_floor = slow_sender_floor(config, assignment.planned_rate_bytes_per_s, measured_rate_bytes_per_s)
        self.started_at, self.first_chunk_at = time.time(), None
        self.bytes_by_source: dict[str, int] = defaultdict(int)
        self.resumed_at: list[int] = []
        self.failures: list[str] = []
        self.bad_peers: list[str] = []
        self.gone: set[str] = set()  # sources that will never serve this version (HTTP 410, skipped)
        self.report_failures = 0
        self.throttle: Throttle | None = None

    async def run(self, session: aiohttp.ClientSession) -> None:
        banned: set[str] = set()  # misbehaved or gone: never asked again for this version
        for round_index in range(self.config.source_rounds):
            if all(s.peer_id in banned for s in self.assignment.sources):
                break  # nobody left to ask: fail now, not after a backoff
            if round_index and not self.buffer.done:
                await asyncio.sleep(self.config.retry_backoff_s)
            for source in self.assignment.sources:
                if self.buffer.done:
                    return
                if source.peer_id not in banned:
                    await self._try_source(session, source, banned)
        if not self.buffer.done:
            raise wire.BroadcastFailed(
                f"version {self.buffer.version}: every source failed at chunk {self.buffer.verified_chunks}/"
                f"{self.buffer.manifest.num_chunks}: {'; '.join(self.failures[-4:])}",
                obsolete=all(s.peer_id in self.gone for s in self.assignment.sources),
            )

    async def _try_source(self, session: aiohttp.ClientSession, source: Source, banned: set[str]) -> None:
        if self.failures:
            self.resumed_at.append(self.buffer.verified_chunks)
        try:
            await _SourceStream(self, source).pull(session)
        except wire.SourceMisbehaved as exc:
            banned.add(source.peer_id)
            self._note_failure(source, exc)
            self.bad_peers.append(source.peer_id)
            await self._report(source, exc)
        except wire.SourceGone as exc:
            banned.add(source.peer_id)
            self.gone.add(source.peer_id)
            self._note_failure(source, exc)
        except wire.SourceError as exc:
            self._note_failure(source, exc)
        if self.buffer.state == "failed":
            raise wire.FetchAborted(f"version {self.buffer.version}: {self.buffer.failure}")

    def _note_failure(self, source: Source, exc: Exception) -> None:
        message = f"{source.peer_id}: {exc}"
        log.warning("broadcast v%s from %s", self.buffer.version, message)
        self.failures.append(message)

    async def _report(self, source: Source, exc: wire.SourceMisbehaved) -> None:
        if self.report is None:
            return
        report = BadPeerReport(
            version=self.buffer.version, reporter_id=self.worker_id, peer_id=source.peer_id, url=source.url,
            chunk_index=exc.chunk_index, form=self.buffer.manifest.form, got_sha256=exc.got_sha256,
            reason=exc.reason, detail=str(exc)[:500],  # type: ignore[arg-type]
        )
        try:
            await asyncio.wait_for(self.report(report), self.config.report_timeout_s)
        except Exception as report_exc:  # a failed report must not cost the worker the version
            self.report_failures += 1
            log.warning("could not report bad peer %s: %r", source.peer_id, report_exc)

    def metrics(self, relay: RelayServer | None) -> FetchMetrics:
        manifest = self.buffer.manifest
        return FetchMetrics(
            version=manifest.version, worker_id=self.worker_id, total_bytes=manifest.total_bytes,
            published_at=manifest.published_at, started_at=self.started_at, first_chunk_at=self.first_chunk_at,
            verified_at=time.time(), bytes_by_source=dict(self.bytes_by_source), resumed_at_chunks=self.resumed_at,
            source_failures=self.failures, bad_peers=self.bad_peers, report_failures=self.report_failures,
            bytes_relayed_at_verified=relay.bytes_sent(manifest.version) if relay is not None else 0,
        )


class _SourceStream:
    """One GET of the version from one source, reading frames until the store is complete."""

    def __init__(self, fetch: _Fetch, source: Source) -> None:
        self.fetch, self.source, self.buffer = fetch, source, fetch.buffer
        self.config = fetch.config
        self.loop = asyncio.get_running_loop()
        self.last_progress = self.loop.time()
        self.first_data: float | None = None
        self.stream_bytes = 0

    async def pull(self, session: aiohttp.ClientSession) -> None:
        timeout = _stream_timeout(self.config)
        params = {"version": str(self.buffer.version), "start": str(self.buffer.verified_chunks),
                  "form": self.buffer.manifest.form}
        try:
            async with session.get(self.source.url + wire.CHUNKS_PATH, params=params,
                                   headers=self.fetch.headers, timeout=timeout) as response:
                await self._check_status(response)
                await self._read_frames(response.content)
        except aiohttp.ServerTimeoutError:
            raise wire.SourceError(f"silent for {self.config.stall_timeout_s}s (stalled or dead)") from None
        except asyncio.IncompleteReadError:
            raise wire.SourceError(f"stream truncated at chunk {self.buffer.verified_chunks}") from None
        except aiohttp.ClientSSLError as exc:
            # a certificate or URL problem, not a fault of this moment: asking again cannot help
            raise wire.SourceGone(describe_failure(self.source.url, exc)) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise wire.SourceError(f"connection failed: {exc!r}") from None

    async def _check_status(self, response: aiohttp.ClientResponse) -> None:
        if response.status != 200:
            text = (await response.content.read(512)).decode(errors="replace")
            error = wire.SourceGone if response.status == 410 else wire.SourceError
            raise error(f"HTTP {response.status}: {text.strip()}")

    async def _read_frames(self, content: aiohttp.StreamReader) -> None:
        while not self.buffer.done:
            kind, index, length = wire.FRAME.unpack(await content.readexactly(wire.FRAME.size))
            if self.buffer.state == "failed":
                return  # superseded while we read; the caller raises FetchAborted
            if kind == wire.DATA:
                await self._take_chunk(content, index, length)
            elif kind == wire.KEEPALIVE:
                self._check_keepalive(index)
            elif kind == wire.ERROR:
                await self._raise_error_frame(content, length, gone=index == wire.GONE)
            else:
                raise self._violation(f"unknown frame kind {kind!r}")

    async def _take_chunk(self, content: aiohttp.StreamReader, index: int, length: int) -> None:
        expected = self.buffer.verified_chunks
        if index != expected:
            raise self._violation(f"sent chunk {index}, expected chunk {expected}")
        start, end = self.buffer.manifest.chunk_span(index)
        if length != end - start:
            raise self._violation(f"announced chunk {index} as {length} bytes; the manifest says {end - start}")
        deadline_s = self.config.stall_timeout_s + length / self.fetch.rate_floor
        try:
            async with asyncio.timeout(deadline_s):
                data = await content.readexactly(length)
        except aiohttp.ServerTimeoutError:
            raise
        except TimeoutError:
            raise wire.SourceError(f"chunk {index} took over {deadline_s:.1f}s (slower than "
                                   f"{self.fetch.rate_floor:.0f} B/s)") from None
        if self.fetch.throttle is not None:  # emulated slow link (local runs only)
            await self.fetch.throttle.consume(length)
        self.buffer.add_chunk(index, data)  # raises SourceMisbehaved on a sha256 mismatch
        self._progress(length)

    def _progress(self, nbytes: int) -> None:
        now = self.loop.time()
        self.first_data = self.first_data or now
        self.fetch.first_chunk_at = self.fetch.first_chunk_at or time.time()
        self.fetch.bytes_by_source[self.source.peer_id] += nbytes
        self.stream_bytes += nbytes
        self.last_progress = now
        elapsed = now - self.first_data
        if elapsed > self.config.progress_timeout_s and self.stream_bytes / elapsed < self.fetch.rate_floor:
            raise wire.SourceError(f"averaged {self.stream_bytes / elapsed:.0f} B/s over {elapsed:.0f}s, "
                                   f"below {self.fetch.rate_floor:.0f} B/s")

    def _check_keepalive(self, held_chunks: int) -> None:
        if held_chunks > self.buffer.verified_chunks:
            raise self._violation(f"claims {held_chunks} chunks but sends keepalives instead of chunk "
                                  f"{self.buffer.verified_chunks}")
        waited_s = self.loop.time() - self.last_progress
        if waited_s > self.config.progress_timeout_s:
            raise wire.SourceError(f"no new chunk for {waited_s:.0f}s, only keepalives")

    async def _raise_error_frame(self, content: aiohttp.StreamReader, length: int, gone: bool) -> None:
        if length > wire.MAX_ERROR_BYTES:
            raise self._violation(f"error frame of {length} bytes (limit {wire.MAX_ERROR_BYTES})")
        reason = (await content.readexactly(length)).decode(errors="replace")
        raise (wire.SourceGone if gone else wire.SourceError)(f"source gave up: {reason}")

    def _violation(self, message: str) -> wire.SourceMisbehaved:
        return wire.SourceMisbehaved(message, reason="protocol_violation", chunk_index=self.buffer.verified_chunks)
