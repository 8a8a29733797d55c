"""A worker's two roads to and from the coordinator beside its work. Its news line (GET
/v1/news, one JSON object a line) brings version news (what to fetch next, and from where) and
activation as they happen, whatever the fleet's size. Its heartbeats prove it alive and carry
its claims, at the interval each reply names (longer for a large fleet or a loaded
coordinator); one is sent at once when the version follower needs its next fetch now (`beat_now`).

Either road refused for an unknown worker (401: the coordinator restarted; 404: evicted) makes
the worker register again, once; 403 cuts it off for good."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

import aiohttp
from pydantic import ValidationError

from echo2.protocol.http import RefusedError, TransientError
from echo2.protocol.messages import Heartbeat, HeartbeatResponse
from echo2.rollout.diagnosis import WorkerFailed
from echo2.rollout.waits import wait_either

if TYPE_CHECKING:
    from echo2.report.metrics import MetricsWriter
    from echo2.rollout.follower import VersionFollower
    from echo2.rollout.link import CoordinatorLink

log = logging.getLogger("echo2.worker")

HEARTBEAT_TIMEOUT_S = 5.0
"""A heartbeat slower than this is as good as lost (the coordinator evicts after a few missed)."""
NEWS_SILENCE_S = 65.0
"""A news line silent this long is taken for dead and opened again: the coordinator writes a
blank line every 20 s (coordinator.http.news.NEWS_KEEPALIVE_S), so this is three missed."""
NEWS_CONNECT_S = 10.0
"""Opening the line: a coordinator that does not answer by then is tried again."""
MAX_NEWS_LINE_BYTES = 64 << 20
"""One line is a reply with a version's manifest (a chunk hash each): megabytes for the largest
models, never this (lines are split here: aiohttp's own line reader stops at 128 KiB)."""
NEWS_RETRY_S = (0.5, 30.0)
"""After a line fails: the first pause before opening it again, doubling up to the second."""


class ControlledWorker(Protocol):
    """What the control line reads and calls of its worker (`rollout.worker.Worker`)."""

    url: str
    worker_id: str
    version: int
    follower: VersionFollower
    link: CoordinatorLink
    metrics: MetricsWriter
    stats: dict
    generation_s: float | None
    heartbeat_interval_s: float
    registered_at: float
    beat_now: asyncio.Event
    failure: WorkerFailed | None

    def set_active(self, active: bool) -> None: ...

    async def reregister(self, seen_at: float) -> None: ...

    def cut_off(self, exc: RefusedError) -> None: ...


class ControlLine:
    def __init__(self, worker: ControlledWorker) -> None:
        self.worker = worker

    async def run(self, stop: asyncio.Event) -> None:
        """Beat and listen until stopped. Finding that the worker cannot go on (refused on joining
        again, or the coordinator silent too long) stops the worker; run() raises the reason."""
        listening = asyncio.ensure_future(self._listen(stop))
        try:
            await self._beat(stop)
        except WorkerFailed as failed:
            self.worker.failure = failed
            stop.set()
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)

    def heard(self, reply: HeartbeatResponse) -> None:
        """A reply or a news line: the newest version and the next fetch, activation, pace."""
        w = self.worker
        w.follower.note(reply.latest, reply.assignment, reply.learner_public_key, fetch=reply.fetch)
        w.set_active(reply.active)
        w.heartbeat_interval_s = reply.heartbeat_interval_s

    async def _beat(self, stop: asyncio.Event) -> None:
        w = self.worker
        while not stop.is_set():
            w.beat_now.clear()
            started = time.monotonic()
            await self._one_beat()
            pause_s = w.heartbeat_interval_s - (time.monotonic() - started)
            await wait_either(w.beat_now, stop, timeout_s=pause_s, consume=False)

    async def _one_beat(self) -> None:
        w = self.worker
        body = Heartbeat(worker_id=w.worker_id, version=w.version, base_version=w.follower.holding(),
                         swap_s=w.follower.swap_s, dissemination_s=w.follower.dissemination_s,
                         generation_s=w.generation_s, rollouts_total=w.stats["rollouts"],
                         busy_s_total=w.stats["busy_s"], bytes_relayed_total=w.follower.receiver.bytes_relayed_total())
        seen_at = w.registered_at
        try:
            text = await w.link.once("POST", "/v1/heartbeat", body, timeout_s=HEARTBEAT_TIMEOUT_S)
            self.heard(HeartbeatResponse.model_validate_json(text))
        except RefusedError as exc:
            await self._refused(exc, "heartbeat", seen_at)
        except TransientError as exc:
            # the next beat will try again; eviction takes several missed beats
            w.link.check_reachable(exc, next_try_s=w.heartbeat_interval_s)
        except ValidationError as exc:  # a malformed reply must not end the heartbeats
            w.metrics.write("worker_bad_reply", worker_id=w.worker_id, what="heartbeat", error=str(exc)[:300])

    async def _refused(self, exc: RefusedError, what: str, seen_at: float) -> None:
        # 404: evicted; 401: our credential is unknown (the coordinator restarted): join again
        w = self.worker
        log.warning("%s refused (HTTP %d: %s)%s", what, exc.status, exc.message,
                    "; registering again" if exc.status in (401, 404) else "")
        if exc.status in (401, 404):
            await w.reregister(seen_at)
        w.cut_off(exc)

    async def _listen(self, stop: asyncio.Event) -> None:
        """Keep the news line open: each line heard, the line opened again after a failure."""
        pause_s = NEWS_RETRY_S[0]
        while not stop.is_set():
            seen_at = self.worker.registered_at
            try:
                await self._read_line()
                pause_s = NEWS_RETRY_S[0]  # it was open, and ended: open it again at once
                continue
            except RefusedError as exc:
                await self._refused(exc, "news line", seen_at)
            except (aiohttp.ClientError, TimeoutError, ValidationError, ValueError) as exc:
                log.info("news line failed (%s: %s); opening it again in %.1f s", type(exc).__name__, exc, pause_s)
            await wait_either(stop, stop, timeout_s=pause_s)
            pause_s = min(2 * pause_s, NEWS_RETRY_S[1])

    async def _read_line(self) -> None:
        w = self.worker
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=NEWS_CONNECT_S, sock_read=NEWS_SILENCE_S)
        async with w.link.session.get(w.url + "/v1/news", timeout=timeout) as resp:
            if resp.status >= 400:
                raise RefusedError(resp.status, (await resp.text())[:500])
            pending = bytearray()
            async for data in resp.content.iter_any():
                w.link.last_contact_s = time.monotonic()
                pending += data
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                if len(pending) > MAX_NEWS_LINE_BYTES:
                    raise ValueError(f"a news line over {MAX_NEWS_LINE_BYTES} bytes")
                for line in lines:
                    if line.strip():
                        self.heard(HeartbeatResponse.model_validate_json(line))
