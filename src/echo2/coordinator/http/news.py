"""Version news as it happens: each worker holds one open response (`GET /v1/news`, one JSON
object a line), and the coordinator writes a line to it when something the worker acts on
changes: a version is published (with what the worker fetches next, and from where), or the
controller activates or idles it. A blank line every NEWS_KEEPALIVE_S keeps an idle line open
through proxies and tells the worker its coordinator is there.

Each line is a `HeartbeatResponse`, the reply a heartbeat gets too, composed from JSON made once
per version and once per assignment (`JsonPieces`): a publish costs one small write per worker,
where a held heartbeat would cost every worker a reply and a new request. Writes never wait on a slow
reader: a line whose unsent bytes pass STUCK_BUFFER_BYTES is closed, and its worker opens a new
one and is told afresh."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import BaseModel

from echo2.coordinator.parts.news_order import IdleTurns
from echo2.protocol.messages import PROTOCOL_VERSION, HeartbeatResponse

if TYPE_CHECKING:
    from echo2.coordinator.desks.workers import WorkerNews

log = logging.getLogger("echo2.coordinator")

NEWS_KEEPALIVE_S = 20.0
"""A blank line this often on every open line: well under the 60 s idle timeout of common
proxies and load balancers, and a worker that hears nothing for three of these reconnects."""
STUCK_BUFFER_BYTES = 256 << 10
"""Unsent bytes past which a worker is taken for not reading its news (a few hundred lines)."""
WRITES_PER_SLICE = 256
"""Lines written between yields to the event loop while every worker is told: requests are
served between slices, so a publish to 10,000 workers never stalls the loop for long."""
PIECES_KEPT = 65_536
"""Objects whose JSON is kept (one per assignment of the current plan, a few per version)."""


class JsonPieces:
    """Each wire object's JSON, made once: the same version goes to thousands of workers, and a
    worker's assignment to it on every reply until the next plan. Keyed by identity (the objects
    are frozen), holding the object so its id is not reused while kept."""

    def __init__(self, kept: int = PIECES_KEPT) -> None:
        self.kept = kept
        self._made: dict[int, tuple[object, bytes]] = {}
        self._texts: dict[str, bytes] = {}

    def clear(self) -> None:
        self._made.clear()

    def text(self, value: str) -> bytes:
        """A string's JSON (the learner's key: the same on every line)."""
        made = self._texts.get(value)
        if made is None:
            made = self._texts[value] = json.dumps(value).encode()
        return made

    def of(self, obj: BaseModel | None) -> bytes:
        if obj is None:
            return b"null"
        made = self._made.get(id(obj))
        if made is not None and made[0] is obj:
            return made[1]
        if len(self._made) >= self.kept:
            self._made.clear()
        data = obj.model_dump_json().encode()
        self._made[id(obj)] = (obj, data)
        return data


_HEAD = b'{"protocol":%d,"kind":"heartbeat_ack","latest":' % PROTOCOL_VERSION


def reply_bytes(pieces: JsonPieces, news: WorkerNews) -> bytes:
    """`news` as the JSON of its HeartbeatResponse (what `HeartbeatResponse(...).model_dump_json()`
    gives, field for field), from the pieces made once."""
    return b"".join((
        _HEAD, pieces.of(news.latest), b',"assignment":', pieces.of(news.assignment), b',"fetch":',
        pieces.of(news.fetch), b',"learner_public_key":', pieces.text(news.learner_public_key),
        b',"active":', b"true" if news.active else b"false", b',"heartbeat_interval_s":',
        repr(float(news.heartbeat_interval_s)).encode(), b"}",  # finite (MAX_HEARTBEAT_INTERVAL_S): valid JSON
    ))


def reply_message(news: WorkerNews) -> HeartbeatResponse:
    """The same reply as a message (tests, and the typed path)."""
    return HeartbeatResponse(latest=news.latest, assignment=news.assignment, fetch=news.fetch,
                             learner_public_key=news.learner_public_key, active=news.active,
                             heartbeat_interval_s=news.heartbeat_interval_s)


class _Line:
    """One worker's open response and the socket under it (how much it has not read yet)."""

    __slots__ = ("response", "transport", "ended")

    def __init__(self, response: web.StreamResponse, transport: asyncio.Transport | None) -> None:
        self.response, self.transport, self.ended = response, transport, asyncio.Event()


class NewsLines:
    """The open news lines, one per worker: a worker opening a second one closes its first."""

    def __init__(self) -> None:
        self.pieces = JsonPieces()
        self.lines: dict[str, _Line] = {}
        self.told_active: dict[str, bool] = {}
        self.told_order: dict[str, None] = {}
        """The open lines, the one told longest ago first (a dict keeps insertion order)."""
        self.told_version: dict[str, int] = {}
        """The newest version each open line was told of, as the newest or to fetch (-1: none yet)."""
        self.idle_turns = IdleTurns()
        """Where the idle workers' next turn of version news starts (upkeep.cry_idle_news)."""
        self.idle_due = asyncio.Event()
        """Set while some open line may not have heard of the newest version."""
        self.closed = False
        self._pending = asyncio.Event()
        self._version_news = self._activity_news = False

    def announce(self, *, version: bool = False, activity: bool = False) -> None:
        """Something to tell: a version was published, or activation may have changed."""
        self._version_news |= version
        self._activity_news |= activity
        self._pending.set()

    async def next_round(self) -> tuple[bool, bool]:
        """Wait for news; (a version, activation) to tell, each reset for the next round."""
        await self._pending.wait()
        self._pending.clear()
        told = self._version_news, self._activity_news
        self._version_news = self._activity_news = False
        return told

    async def serve(self, request: web.Request, worker_id: str, first: WorkerNews) -> web.StreamResponse:
        """Hold `worker_id`'s line open, starting with `first`, until the coordinator stops, the
        worker opens another, or a write to it fails."""
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
        await response.prepare(request)
        line = self.open(worker_id, response, request.transport)
        try:
            await self._write(worker_id, line, self._encode(worker_id, first))
            if not self.closed:
                await line.ended.wait()
        finally:
            if self.lines.get(worker_id) is line:
                del self.lines[worker_id]
                self.told_active.pop(worker_id, None)
                self.told_order.pop(worker_id, None)
                self.told_version.pop(worker_id, None)
        return response

    def open(self, worker_id: str, response: web.StreamResponse, transport: asyncio.Transport | None) -> _Line:
        """`worker_id`'s new line, in its first one's place (which ends); it is told first thing."""
        self._end(worker_id)
        line = self.lines[worker_id] = _Line(response, transport)
        self.told_order.pop(worker_id, None)
        self.told_order[worker_id] = None
        return line

    def open_for(self, *, first: Callable[[str], bool] | None = None) -> list[str]:
        """The workers with an open line; those `first` picks ahead of the rest, in their order."""
        if first is None:
            return list(self.lines)
        return sorted(self.lines, key=lambda worker_id: not first(worker_id))

    def told_of(self, version: int) -> Callable[[str], bool]:
        """Whether a worker's open line was told of `version` (or a newer one) already."""
        told = self.told_version
        return lambda worker_id: told.get(worker_id, -1) >= version

    def longest_untold(self, count: int, *, told: Callable[[str], bool]) -> list[str]:
        """Up to `count` open lines `told` is False for, the ones told longest ago first."""
        chosen: list[str] = []
        for worker_id in self.told_order:
            if len(chosen) >= count:
                break
            if not told(worker_id):
                chosen.append(worker_id)
        return chosen

    async def tell(self, news: Iterable[tuple[str, WorkerNews | None]]) -> int:
        """Write each worker its news (a slice at a time, yielding between slices); a worker with
        none is gone, and its line ends. Returns how many lines were written."""
        written = 0
        for worker_id, item in news:
            line = self.lines.get(worker_id)
            if line is not None and item is None:
                self._end(worker_id)
            elif line is not None and await self._write(worker_id, line, self._encode(worker_id, item)):
                written += 1
                if written % WRITES_PER_SLICE == 0:
                    await asyncio.sleep(0)
        return written

    async def tell_changed_activity(self, is_active: Callable[[str], bool],
                                    news_of: Callable[[str], WorkerNews | None]) -> int:
        """Tell the workers whose activation changed since they were last told."""
        changed = [w for w in self.open_for() if self.told_active.get(w) != is_active(w)]
        return await self.tell((w, news_of(w)) for w in changed)

    async def keep_alive(self) -> None:
        """A blank line to every open line (the caller repeats it every NEWS_KEEPALIVE_S)."""
        for index, (worker_id, line) in enumerate(list(self.lines.items())):
            await self._write(worker_id, line, b"\n")
            if index % WRITES_PER_SLICE == WRITES_PER_SLICE - 1:
                await asyncio.sleep(0)

    def close(self, worker_id: str) -> None:
        """End one worker's line (it left, or was evicted or quarantined)."""
        self._end(worker_id)

    def close_all(self) -> None:
        """The coordinator is stopping: every line ends now."""
        self.closed = True
        for worker_id in list(self.lines):
            self._end(worker_id)

    def _encode(self, worker_id: str, news: WorkerNews) -> bytes:
        self.told_active[worker_id] = news.active
        # the newest version the line named, as the newest or as the one to fetch next (the
        # idle crier tells a line again only of a version newer than that)
        self.told_version[worker_id] = max(news.latest.version if news.latest is not None else -1,
                                           news.fetch.version if news.fetch is not None else -1)
        self.told_order.pop(worker_id, None)
        self.told_order[worker_id] = None
        return reply_bytes(self.pieces, news) + b"\n"

    def _end(self, worker_id: str) -> None:
        line = self.lines.get(worker_id)
        if line is not None:
            line.ended.set()

    async def _write(self, worker_id: str, line: _Line, data: bytes) -> bool:
        transport = line.transport
        if (line.ended.is_set() or transport is None or transport.is_closing()
                or transport.get_write_buffer_size() > max(STUCK_BUFFER_BYTES, 2 * len(data))):
            self._end(worker_id)
            return False
        try:
            await line.response.write(data)
        except (ConnectionError, RuntimeError):  # the worker went away mid-write
            self._end(worker_id)
            return False
        return True
