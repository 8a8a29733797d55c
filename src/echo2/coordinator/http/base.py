"""What every coordinator route shares: the app's keys, the change signal long polls wait on,
replies and error replies, body parsing with the protocol check, the worker-credential check,
query parameters, and writing the state's events to metrics.jsonl."""

from __future__ import annotations

import asyncio
import json
import math
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import BaseModel, ValidationError

from echo2.config.tls import TLSConfig
from echo2.coordinator.http.history import RunHistory
from echo2.coordinator.http.log_lines import log_event
from echo2.coordinator.http.news import NewsLines
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.scoring.jobs import Scoring
from echo2.protocol.messages import PROTOCOL_VERSION, BadPeerRequest, ErrorResponse, protocol_mismatch
from echo2.report.metrics import MetricsWriter

if TYPE_CHECKING:
    from echo2.coordinator.desks.evaluation import EvaluationDesk
    from echo2.coordinator.parts.credentials import Secrets
    from echo2.coordinator.state import CoordinatorState



class Signal:
    """Wakes every waiter at once, from sync code, when what they wait on changed: after every
    request and sweep the coordinator compares a mark of the state the long polls wait on (its
    version, steps, leases, buffer and evaluation results) with the last, and wakes them only
    if it moved, so a fleet's heartbeats wake nobody."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.mark: tuple = ()
        self.closed = False  # the coordinator is shutting down: long polls answer now

    def notify_if_moved(self, mark: tuple) -> None:
        if mark != self.mark:
            self.mark = mark
            self.notify()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def close(self) -> None:
        self.closed = True
        self.notify()

    async def wait(self, timeout_s: float) -> None:
        if self.closed:
            return
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            pass


# the key's type is for type checkers: the routes see the state, never import it (it is built above them)
STATE_KEY: web.AppKey[CoordinatorState] = web.AppKey("state")
METRICS_KEY = web.AppKey("metrics", MetricsWriter)
CHANGED_KEY = web.AppKey("buffer_changed", asyncio.Condition)
LIMIT_KEY = web.AppKey("max_request_bytes", int)
TLS_KEY = web.AppKey("tls", TLSConfig)
SECRETS_KEY: web.AppKey[Secrets] = web.AppKey("secrets")  # the registration checks the trusted-worker token
RELAY_TOKEN_KEY = web.AppKey("relay_token", str)  # what relays take from any worker: the join token
HISTORY_KEY = web.AppKey("history", RunHistory)
ROOM_KEY = web.AppKey("state_changed", Signal)
NEWS_KEY = web.AppKey("news", NewsLines)
SCORING_KEY = web.AppKey("scoring", Scoring)  # where submissions are scored: the pool, off the event loop
WORKER_KEY = web.RequestKey("worker_id", str)  # set by the auth middleware: the credential's worker


def evaluation_desk(state: CoordinatorState) -> EvaluationDesk:
    """The run's evaluation leases; refused (409) when the learner evaluates instead."""
    if state.evaluation is None:
        raise RequestError(409, "this run evaluates on the learner ([evaluation] where); no evaluation leases")
    return state.evaluation


def error_reply(status: int, message: str, retry_after_s: float | None = None) -> web.Response:
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))} if retry_after_s is not None else None
    return web.json_response(ErrorResponse(error=message).model_dump(), status=status, headers=headers)


def typed_reply(message: BaseModel) -> web.Response:
    return web.Response(text=message.model_dump_json(), content_type="application/json")


def speaks_for(request: web.Request, worker_id: str) -> None:
    """A worker credential is good for its own worker id only."""
    if worker_id != request[WORKER_KEY]:
        raise RequestError(403, f"this credential belongs to worker {request[WORKER_KEY]!r}, not {worker_id!r}")


def write_events(app: web.Application) -> None:
    """The state's pending events, logged and appended to metrics.jsonl; long polls re-check if
    what they wait on moved."""
    state, metrics = app[STATE_KEY], app[METRICS_KEY]
    evaluated = len(state.evaluation.board.done) if state.evaluation is not None else 0
    app[ROOM_KEY].notify_if_moved((state.versions.current, state.groups.steps_taken, len(state.leases_book.leases),
                                   len(state.groups.buffer), len(state.leases_book.queue), evaluated,
                                   state.controller.last_change))
    for event in state.take_events():
        record = event.record()
        log_event(record)
        metrics.write(record.pop("kind"), **record)


# a string or list over its cap (protocol.messages): well-formed, but refused as too large
_OVERSIZED = frozenset({"string_too_long", "too_long"})


def validation_error(path: str, exc: ValidationError) -> web.Response:
    """400 for a malformed body; 422 when a field is over its size cap or breaks its character
    rule, naming the field."""
    errors = exc.errors()
    oversized = [e for e in errors if e["type"] in _OVERSIZED]
    # a field's cap is checked before its pattern, so a value shown here is never over its cap
    mismatched = [e for e in errors if e["type"] == "string_pattern_mismatch"]
    first = (oversized or mismatched or errors)[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    if oversized:
        return error_reply(422, f"refused {path} request: {where} is over its cap ({len(first['input'])} long): "
                           f"{first['msg']}")
    if mismatched:
        return error_reply(422, f"refused {path} request: {where}={first['input']!r} has characters its rule does not "
                           f"allow ({first['msg']}); send letters, digits and the punctuation the pattern names")
    return error_reply(400, f"malformed {path} request: {where}: {first['msg']} ({exc.error_count()} error(s))")


async def parse_body(request: web.Request, schema: type[BaseModel]):
    body = await request.read()  # over client_max_size: aiohttp answers 413 itself
    try:
        message = schema.model_validate_json(body)
    except ValidationError:
        # another echo2 release's message fails on some field; say that, naming both versions
        _refuse_other_protocols(*_claimed_protocol(body))
        raise
    _refuse_other_protocols(message.protocol, getattr(message, "release", ""))
    return message


def _refuse_other_protocols(sent: object, release: object) -> None:
    problem = protocol_mismatch(sent, release, here="this coordinator", there="the request",
                                spoken=PROTOCOL_VERSION)
    if problem:
        raise RequestError(426, problem)


def _claimed_protocol(body: bytes) -> tuple[object, object]:
    """(protocol, release) a body that did not validate says it speaks; ours when it says nothing."""
    try:
        data = json.loads(body)
    except ValueError:
        return PROTOCOL_VERSION, ""
    if not isinstance(data, dict):
        return PROTOCOL_VERSION, ""
    return data.get("protocol", PROTOCOL_VERSION), data.get("release", "")


async def worker_body(request: web.Request, schema: type[BaseModel]):
    body = await parse_body(request, schema)
    speaks_for(request, body.report.reporter_id if isinstance(body, BadPeerRequest) else body.worker_id)
    return body


def int_query(request: web.Request, name: str, minimum: int) -> int:
    raw = request.query.get(name)
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise RequestError(400, f"query parameter {name}={raw!r}: expected an integer >= {minimum}")
    return value


def float_query(request: web.Request, name: str, default: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise RequestError(400, f"query parameter {name}={raw!r}: expected a finite number >= 0")
    return value
