"""The coordinator's HTTP face (aiohttp): authentication, request parsing, error mapping, the
batch long-poll, and the periodic sweep of silent workers and overdue leases."""

from __future__ import annotations

import asyncio
import hmac
import json
import math
from collections.abc import Awaitable, Callable

from aiohttp import web
from pydantic import BaseModel, ValidationError

from echo2.config.tls import TLSConfig
from echo2.coordinator.credentials import JOIN, LEARNER, OPEN, OPERATOR, ROUTE_ROLES, VIEWER, WORKER, Secrets
from echo2.coordinator.dashboard import add_dashboard_routes, viewer_gate
from echo2.coordinator.history import RunHistory
from echo2.coordinator.log_lines import log_event
from echo2.coordinator.probe import check_relay_address, probe_relay
from echo2.coordinator.prometheus import add_metrics_route
from echo2.coordinator.state import CoordinatorState, RequestError
from echo2.protocol.messages import (
    PROTOCOL_VERSION,
    RELEASE,
    AuditReport,
    BadPeerRequest,
    BatchResponse,
    ErrorResponse,
    EvalSubmission,
    Heartbeat,
    LeaseRequest,
    LeaseResponse,
    LeaveRequest,
    ProbeRequest,
    ProbeResponse,
    PublishRequest,
    RegisterRequest,
    RejectBatchRequest,
    RolloutSubmission,
    TrainGroup,
    protocol_mismatch,
)
from echo2.report.metrics import MetricsWriter

# how often silent workers and overdue leases are looked for; well under worker_timeout_s so a
# dead worker's prompts return within about one timeout
SWEEP_INTERVAL_S = 0.25
# upper bound on one batch long-poll, whatever the learner asks: keeps requests well inside
# client and proxy timeouts
MAX_BATCH_WAIT_S = 30.0
# a lease refused for a full window waits at most this long for room (the worker asks for less
# when its own request timeout is short): one request per long poll instead of ten a second
MAX_LEASE_WAIT_S = 10.0
# refusals a lease long-poll waits out: room opens when the learner takes a batch, a version
# is published or leases end; any other refusal is answered at once
_WAITS_FOR_ROOM = ("window full", "holding")


class Signal:
    """Wakes every waiter at once, from sync code: the coordinator notifies after every request
    and sweep, and long polls re-check their condition (state changes are cheap to re-check,
    requests over the network are not)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            pass

STATE_KEY = web.AppKey("state", CoordinatorState)
METRICS_KEY = web.AppKey("metrics", MetricsWriter)
CHANGED_KEY = web.AppKey("buffer_changed", asyncio.Condition)
LIMIT_KEY = web.AppKey("max_request_bytes", int)
TLS_KEY = web.AppKey("tls", TLSConfig)
HISTORY_KEY = web.AppKey("history", RunHistory)
ROOM_KEY = web.AppKey("state_changed", Signal)
JOIN_TOKEN_KEY = web.AppKey("join_token", str)  # the relay probe presents it, as peers do
WORKER_KEY = web.RequestKey("worker_id", str)  # set by the auth middleware: the credential's worker


def _error(status: int, message: str) -> web.Response:
    return web.json_response(ErrorResponse(error=message).model_dump(), status=status)


def _reply(message: BaseModel) -> web.Response:
    return web.Response(text=message.model_dump_json(), content_type="application/json")


_TOKEN_HINTS = {
    JOIN: "the run's join token (coordinator.auth_token / $ECHO2_AUTH_TOKEN)",
    LEARNER: "the learner token ($ECHO2_LEARNER_TOKEN or <run_dir>/keys/learner.token)",
    OPERATOR: "the operator token ($ECHO2_OPERATOR_TOKEN or <run_dir>/keys/operator.token)",
}


def make_auth_middleware(secrets: Secrets, state: CoordinatorState):
    """Each route accepts exactly one role's credential (echo2.coordinator.credentials); a
    worker's credential also names the worker, which handlers check the body speaks for."""
    expected = {JOIN: secrets.join, LEARNER: secrets.learner, OPERATOR: secrets.operator}

    @web.middleware
    async def auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        # HEAD runs the GET handler (aiohttp adds it to every GET route): it needs the GET's credential
        method = "GET" if request.method == "HEAD" else request.method
        role = ROUTE_ROLES.get((method, request.path))
        if role is None or role == OPEN:
            return await handler(request)  # unknown routes get the router's 404/405
        if role == VIEWER:
            return await viewer_gate(request, secrets.operator, handler)
        given = request.headers.get("Authorization", "")
        if role == WORKER:
            worker_id = state.worker_for_credential(given.removeprefix("Bearer "))
            if worker_id is None:
                return _error(401, "missing or unknown worker credential: register (POST /v1/register with the "
                                   "join token) and send the credential it returns")
            request[WORKER_KEY] = worker_id
            return await handler(request)
        if not hmac.compare_digest(given.encode(), f"Bearer {expected[role]}".encode()):
            return _error(401, f"missing or wrong bearer token: {request.path} needs {_TOKEN_HINTS[role]}")
        return await handler(request)

    return auth


def _speaks_for(request: web.Request, worker_id: str) -> None:
    """A worker credential is good for its own worker id only."""
    if worker_id != request[WORKER_KEY]:
        raise RequestError(403, f"this credential belongs to worker {request[WORKER_KEY]!r}, not {worker_id!r}")


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except RequestError as exc:
        return _error(exc.status, exc.message)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[LIMIT_KEY]
        return _error(413, f"request body over coordinator.max_request_bytes={limit}; send smaller rollouts")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.text or exc.reason)
    except ValidationError as exc:
        return _validation_error(request.path, exc)
    finally:
        # before the reply leaves: what it tells a worker (its group dropped as stale) is on
        # record even when the coordinator is killed the moment after
        write_events(request.app)


def write_events(app: web.Application) -> None:
    """The state's pending events, logged and appended to metrics.jsonl; long polls re-check."""
    state, metrics = app[STATE_KEY], app[METRICS_KEY]
    app[ROOM_KEY].notify()
    events, state.events = state.events, []
    for event in events:
        log_event(event)
        metrics.write(event.pop("kind"), **event)


# a string or list over its cap (protocol.messages): well-formed, but refused as too large
_OVERSIZED = frozenset({"string_too_long", "too_long"})


def _validation_error(path: str, exc: ValidationError) -> web.Response:
    """400 for a malformed body; 422 when a field is over its size cap, naming the field."""
    errors = exc.errors()
    oversized = [e for e in errors if e["type"] in _OVERSIZED]
    first = (oversized or errors)[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    if oversized:
        return _error(422, f"refused {path} request: {where} is over its cap ({len(first['input'])} long): "
                           f"{first['msg']}")
    return _error(400, f"malformed {path} request: {where}: {first['msg']} ({exc.error_count()} error(s))")


async def _parse(request: web.Request, schema: type[BaseModel]):
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
    problem = protocol_mismatch(sent, release, "this coordinator", "the request", spoken=PROTOCOL_VERSION)
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


async def handle_register(request: web.Request) -> web.Response:
    return _reply(request.app[STATE_KEY].register(await _parse(request, RegisterRequest), source=request.remote or ""))


async def _worker_body(request: web.Request, schema: type[BaseModel]):
    body = await _parse(request, schema)
    _speaks_for(request, body.report.reporter_id if isinstance(body, BadPeerRequest) else body.worker_id)
    return body


async def handle_heartbeat(request: web.Request) -> web.Response:
    return _reply(request.app[STATE_KEY].heartbeat(await _worker_body(request, Heartbeat)))


async def handle_leave(request: web.Request) -> web.Response:
    request.app[STATE_KEY].leave(await _worker_body(request, LeaveRequest))
    return web.json_response({"ok": True})


async def handle_bad_peer(request: web.Request) -> web.Response:
    request.app[STATE_KEY].bad_peer(await _worker_body(request, BadPeerRequest))
    return web.json_response({"ok": True})


async def handle_lease(request: web.Request) -> web.Response:
    """A lease refused for a full window is held until room opens, or a new version is out (the
    worker should load it: its room is counted from the version it holds), up to the worker's
    wait_s: a refused worker does not poll."""
    req = await _worker_body(request, LeaseRequest)
    state, room = request.app[STATE_KEY], request.app[ROOM_KEY]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(req.wait_s, MAX_LEASE_WAIT_S)
    asked_at = state.current_version
    reply = state.lease(req)
    while _waits_for_room(reply) and loop.time() < deadline and state.current_version == asked_at:
        await room.wait(deadline - loop.time())
        reply = state.lease(req)
    return _reply(reply)


def _waits_for_room(reply: LeaseResponse) -> bool:
    return not reply.tasks and reply.evaluation is None and reply.reason.startswith(_WAITS_FOR_ROOM)


async def handle_evaluation(request: web.Request) -> web.Response:
    return _reply(request.app[STATE_KEY].submit_evaluation(await _worker_body(request, EvalSubmission)))


async def handle_evaluation_result(request: web.Request) -> web.Response:
    """The learner asks for a version's evaluation, waiting up to wait_s for it (long poll)."""
    version = _int_query(request, "version", minimum=0)
    wait_s = min(_float_query(request, "wait_s", 0.0), MAX_BATCH_WAIT_S)
    state, room = request.app[STATE_KEY], request.app[ROOM_KEY]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    result = state.evaluation_result(version)
    while not result.done and loop.time() < deadline:
        await room.wait(deadline - loop.time())
        result = state.evaluation_result(version)
    return _reply(result)


async def handle_rollout(request: web.Request) -> web.Response:
    reply = request.app[STATE_KEY].submit(await _worker_body(request, RolloutSubmission))
    if reply.accepted:
        async with request.app[CHANGED_KEY]:
            request.app[CHANGED_KEY].notify_all()
    return _reply(reply)


async def handle_publish(request: web.Request) -> web.Response:
    req = await _parse(request, PublishRequest)
    anchor_wanted = request.app[STATE_KEY].publish(req.info, req.public_key_hex)
    return web.json_response({"ok": True, "version": req.info.version, "anchor_wanted": anchor_wanted})


async def handle_batch(request: web.Request) -> web.Response:
    step = _int_query(request, "step", minimum=0)
    wait_s = min(_float_query(request, "wait_s", 10.0), MAX_BATCH_WAIT_S)
    state, changed = request.app[STATE_KEY], request.app[CHANGED_KEY]
    if "step_time_s" in request.query:
        state.observe_step_time(_float_query(request, "step_time_s", 0.0))
    if "durable_step" in request.query:  # the learner's newest checkpoint: older batches can go
        state.checkpointed(_int_query(request, "durable_step", minimum=0), step)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    groups = state.take_batch(step)
    while groups is None and loop.time() < deadline:
        async with changed:
            try:
                await asyncio.wait_for(changed.wait(), timeout=deadline - loop.time())
            except TimeoutError:
                pass
        groups = state.take_batch(step)
    batch = [TrainGroup.model_validate(g) for g in groups or []]
    return _reply(BatchResponse(step=step, groups=batch))


async def handle_reject_batch(request: web.Request) -> web.Response:
    req = await _parse(request, RejectBatchRequest)
    rejected = request.app[STATE_KEY].reject_batch(req.step, req.reason, req.requeue_group_ids)
    return web.json_response({"ok": True, "groups_rejected": rejected})


async def handle_audit(request: web.Request) -> web.Response:
    quarantined = request.app[STATE_KEY].record_audit(await _parse(request, AuditReport))
    return web.json_response({"ok": True, "quarantined": quarantined})


def _int_query(request: web.Request, name: str, minimum: int) -> int:
    raw = request.query.get(name)
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise RequestError(400, f"query parameter {name}={raw!r}: expected an integer >= {minimum}")
    return value


def _float_query(request: web.Request, name: str, default: float) -> float:
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


async def handle_broadcast_config(request: web.Request) -> web.Response:
    """What every peer must agree on (chunking, timeouts, limits): fetched before registering,
    since a worker starts its relay server with it."""
    return web.Response(text=request.app[STATE_KEY].settings.broadcast.model_dump_json(),
                        content_type="application/json")


async def handle_state(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].snapshot())


async def handle_health(request: web.Request) -> web.Response:
    """Open to anyone: liveness, and the protocol and release (`echo2 worker --check` compares)."""
    return web.json_response({"ok": True, "protocol": PROTOCOL_VERSION, "release": RELEASE})


async def handle_probe(request: web.Request) -> web.Response:
    """Dial a worker's relay address back (echo2.coordinator.probe). Rate-limited with the
    registrations: each probe makes the coordinator open a connection."""
    req = await _parse(request, ProbeRequest)
    problem = check_relay_address(req.relay_address)
    if problem:
        raise RequestError(422, problem)
    request.app[STATE_KEY].take_join_token(request.remote or "")
    reachable, detail = await probe_relay(req.relay_address, request.app[JOIN_TOKEN_KEY], request.app[TLS_KEY])
    return _reply(ProbeResponse(reachable=reachable, detail=detail))


async def _housekeeping(app: web.Application) -> None:
    state = app[STATE_KEY]
    loop = asyncio.get_running_loop()
    next_control = loop.time()
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        state.sweep()
        if loop.time() >= next_control:
            state.control()
            next_control = loop.time() + state.settings.activation.control_period_s
        write_events(app)


async def _run_housekeeping(app: web.Application):
    task = asyncio.create_task(_housekeeping(app))
    stop_history = asyncio.Event()
    history = asyncio.create_task(app[HISTORY_KEY].follow(stop_history))
    yield
    task.cancel()
    stop_history.set()
    await history  # its file read in a thread: let it finish before the files close
    app[METRICS_KEY].write("coordinator_final", **app[STATE_KEY].snapshot())


def build_app(state: CoordinatorState, metrics: MetricsWriter, secrets: Secrets,
              max_request_bytes: int, tls_config: TLSConfig | None = None) -> web.Application:
    """`tls_config`: the CA the relay probe checks https:// relays against."""
    app = web.Application(
        client_max_size=max_request_bytes, middlewares=[error_middleware, make_auth_middleware(secrets, state)]
    )
    app[STATE_KEY], app[METRICS_KEY], app[CHANGED_KEY] = state, metrics, asyncio.Condition()
    app[LIMIT_KEY] = max_request_bytes
    app[JOIN_TOKEN_KEY] = secrets.join
    app[TLS_KEY] = tls_config or TLSConfig()
    app[HISTORY_KEY] = history = RunHistory(metrics.path)  # the run's records, for the dashboard and /metrics
    app[ROOM_KEY] = Signal()
    app.cleanup_ctx.append(_run_housekeeping)
    add_dashboard_routes(app, state, history, secrets.operator)
    add_metrics_route(app, state, history)
    app.add_routes(
        [
            web.post("/v1/register", handle_register),
            web.post("/v1/heartbeat", handle_heartbeat),
            web.post("/v1/lease", handle_lease),
            web.post("/v1/leave", handle_leave),
            web.post("/v1/bad_peer", handle_bad_peer),
            web.post("/v1/rollout", handle_rollout),
            web.post("/v1/evaluation", handle_evaluation),
            web.get("/v1/evaluation", handle_evaluation_result),
            web.post("/v1/publish", handle_publish),
            web.get("/v1/batch", handle_batch),
            web.post("/v1/batch/reject", handle_reject_batch),
            web.post("/v1/audit", handle_audit),
            web.get("/v1/state", handle_state),
            web.get("/v1/broadcast_config", handle_broadcast_config),
            web.post("/v1/probe", handle_probe),
            web.get("/healthz", handle_health),
        ]
    )
    return app
