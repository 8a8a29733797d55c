"""The coordinator's HTTP face (aiohttp): authentication, error mapping, one-line handlers that
call the desks (the long-held requests are in `long_polls`, what routes share in `base`, the
coordinator's own loops in `upkeep`), and submissions scored off the event loop (the scoring
pool, `build_app(scoring=...)`)."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import ValidationError

from echo2.config.tls import TLSConfig
from echo2.coordinator.http.base import (
    CHANGED_KEY,
    HISTORY_KEY,
    LIMIT_KEY,
    METRICS_KEY,
    NEWS_KEY,
    RELAY_TOKEN_KEY,
    ROOM_KEY,
    SCORING_KEY,
    SECRETS_KEY,
    STATE_KEY,
    TLS_KEY,
    WORKER_KEY,
    Signal,
    error_reply,
    parse_body,
    typed_reply,
    validation_error,
    worker_body,
    write_events,
)
from echo2.coordinator.http.dashboard import add_dashboard_routes, viewer_gate
from echo2.coordinator.http.history import RunHistory
from echo2.coordinator.http.long_polls import (
    answer_long_polls_now,
    handle_batch,
    handle_evaluation,
    handle_evaluation_result,
    handle_heartbeat,
    handle_lease,
    handle_news,
)
from echo2.coordinator.http.news import NewsLines
from echo2.coordinator.http.prometheus import add_metrics_route
from echo2.coordinator.http.relay_checks import CHECKS_WAKE_KEY, wake_checks
from echo2.coordinator.http.upkeep import run_upkeep
from echo2.coordinator.http.view import snapshot
from echo2.coordinator.parts.credentials import (
    JOIN,
    LEARNER,
    OPEN,
    OPERATOR,
    ROUTE_ROLES,
    VIEWER,
    WORKER,
    Secrets,
    holds_trusted_token,
)
from echo2.coordinator.parts.probe import check_relay_address, own_address, probe_relay
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.scoring.jobs import InlineScoring, Scoring
from echo2.protocol.learner_api import (
    AuditReport,
    AuditResponse,
    PublishRequest,
    PublishResponse,
    RejectBatchRequest,
    RejectBatchResponse,
)
from echo2.protocol.messages import (
    PROTOCOL_VERSION,
    RELEASE,
    BadPeerRequest,
    LeaveRequest,
    OkResponse,
    ProbeRequest,
    ProbeResponse,
    RegisterRequest,
    RolloutSubmission,
)
from echo2.protocol.trusted import TRUSTED_HEADER
from echo2.report.metrics import MetricsWriter

if TYPE_CHECKING:
    from echo2.coordinator.state import CoordinatorState

_TOKEN_HINTS = {
    JOIN: "the run's join token (coordinator.auth_token / $ECHO2_AUTH_TOKEN)",
    LEARNER: "the learner token ($ECHO2_LEARNER_TOKEN or <run_dir>/keys/learner.token)",
    OPERATOR: "the operator token ($ECHO2_OPERATOR_TOKEN or <run_dir>/keys/operator.token)",
}


def make_auth_middleware(secrets: Secrets, state: CoordinatorState):
    """Each route accepts exactly one role's credential (echo2.coordinator.parts.credentials); a
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
            worker_id = state.registry.worker_for_credential(given.removeprefix("Bearer "))
            if worker_id is None:
                return error_reply(401, "missing or unknown worker credential: register (POST /v1/register with the "
                                   "join token) and send the credential it returns")
            request[WORKER_KEY] = worker_id
            return await handler(request)
        if not hmac.compare_digest(given.encode(), f"Bearer {expected[role]}".encode()):
            return error_reply(401, f"missing or wrong bearer token: {request.path} needs {_TOKEN_HINTS[role]}")
        return await handler(request)

    return auth


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except RequestError as exc:
        return error_reply(exc.status, exc.message, exc.retry_after_s)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[LIMIT_KEY]
        return error_reply(413, f"request body over coordinator.max_request_bytes={limit}; send smaller rollouts")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_reply(exc.status, exc.text or exc.reason)
    except ValidationError as exc:
        return validation_error(request.path, exc)
    finally:
        # before the reply leaves: what it tells a worker (its group dropped as stale) is on
        # record even when the coordinator is killed the moment after
        write_events(request.app)


async def handle_register(request: web.Request) -> web.Response:
    req = await parse_body(request, RegisterRequest)
    trusted = holds_trusted_token(request.app[SECRETS_KEY], request.headers.get(TRUSTED_HEADER, ""))
    return typed_reply(request.app[STATE_KEY].worker_desk.register(req, source=request.remote or "", trusted=trusted))


async def handle_leave(request: web.Request) -> web.Response:
    request.app[STATE_KEY].worker_desk.leave(await worker_body(request, LeaveRequest))
    return typed_reply(OkResponse())


async def handle_bad_peer(request: web.Request) -> web.Response:
    if request.app[STATE_KEY].worker_desk.bad_peer(await worker_body(request, BadPeerRequest)) == "check":
        wake_checks(request.app)
    return typed_reply(OkResponse())


async def handle_rollout(request: web.Request) -> web.Response:
    """Checked, scored off the event loop (heartbeats and everything else are answered
    meanwhile), then applied whole (the state's submit_scored)."""
    req = await worker_body(request, RolloutSubmission)
    reply = await request.app[STATE_KEY].intake.submit_scored(req, request.app[SCORING_KEY])
    if reply.accepted:
        async with request.app[CHANGED_KEY]:
            request.app[CHANGED_KEY].notify_all()
    return typed_reply(reply)


async def handle_publish(request: web.Request) -> web.Response:
    req = await parse_body(request, PublishRequest)
    # accepted and answered at once: the crier plans its relay tree on a thread, then tells every worker
    anchor_wanted = request.app[STATE_KEY].learner_desk.publish(req.info, req.public_key_hex, plan=False)
    request.app[NEWS_KEY].announce(version=True)
    return typed_reply(PublishResponse(version=req.info.version, anchor_wanted=anchor_wanted))


async def handle_reject_batch(request: web.Request) -> web.Response:
    req = await parse_body(request, RejectBatchRequest)
    rejected = request.app[STATE_KEY].learner_desk.reject_batch(req.step, req.reason, req.requeue_lease_ids)
    return typed_reply(RejectBatchResponse(groups_rejected=rejected))


async def handle_audit(request: web.Request) -> web.Response:
    quarantined = request.app[STATE_KEY].learner_desk.record_audit(await parse_body(request, AuditReport))
    return typed_reply(AuditResponse(quarantined=quarantined))


async def handle_broadcast_config(request: web.Request) -> web.Response:
    """What every peer must agree on (chunking, timeouts, limits): fetched before registering,
    since a worker starts its relay server with it."""
    return web.Response(text=request.app[STATE_KEY].cfg.broadcast.model_dump_json(),
                        content_type="application/json")


async def handle_state(request: web.Request) -> web.Response:
    return web.json_response(snapshot(request.app[STATE_KEY]))


async def handle_health(request: web.Request) -> web.Response:
    """Open to anyone: liveness, and the protocol and release (`echo2 worker --check` compares)."""
    return web.json_response({"ok": True, "protocol": PROTOCOL_VERSION, "release": RELEASE})


async def handle_probe(request: web.Request) -> web.Response:
    """Dial a worker's relay address back, at the caller's own address only
    (echo2.coordinator.parts.probe). Rate-limited with the registrations: each probe makes the
    coordinator resolve a name and open a connection."""
    req = await parse_body(request, ProbeRequest)
    problem = check_relay_address(req.relay_address)
    if problem:
        raise RequestError(422, problem)
    request.app[STATE_KEY].registry.take_join_token(request.remote or "")
    dial = await own_address(req.relay_address, request.remote or "")
    reachable, detail = await probe_relay(req.relay_address, request.app[TLS_KEY], dial=dial)
    return typed_reply(ProbeResponse(reachable=reachable, detail=detail))


async def _run_scoring(app: web.Application):
    await app[SCORING_KEY].start()
    yield
    await app[SCORING_KEY].stop()  # after the requests in flight: every scoring process killed and reaped


def build_app(state: CoordinatorState, metrics: MetricsWriter, secrets: Secrets,
              *, max_request_bytes: int, tls_config: TLSConfig | None = None,
              scoring: Scoring | None = None) -> web.Application:
    """`tls_config`: the CA the relay probe checks https:// relays against. `scoring`: where
    submissions are scored, started and stopped with the app (the coordinator's ScoringPool;
    None: inline, on the event loop, for tests)."""
    app = web.Application(
        client_max_size=max_request_bytes, middlewares=[error_middleware, make_auth_middleware(secrets, state)]
    )
    app[STATE_KEY], app[METRICS_KEY], app[CHANGED_KEY] = state, metrics, asyncio.Condition()
    app[LIMIT_KEY] = max_request_bytes
    app[TLS_KEY] = tls_config or TLSConfig()
    app[RELAY_TOKEN_KEY], app[CHECKS_WAKE_KEY] = secrets.join, asyncio.Event()
    app[SECRETS_KEY] = secrets
    app[HISTORY_KEY] = history = RunHistory(metrics.path)  # the run's records, for the dashboard and /metrics
    app[ROOM_KEY] = Signal()
    app[NEWS_KEY] = NewsLines()
    app[SCORING_KEY] = scoring or InlineScoring(state.scorer)
    app.cleanup_ctx.append(_run_scoring)
    app.cleanup_ctx.append(run_upkeep)
    app.on_shutdown.append(answer_long_polls_now)
    add_dashboard_routes(app, state, history, secrets.operator)
    add_metrics_route(app, state, history)
    app.add_routes(
        [
            web.post("/v1/register", handle_register),
            web.post("/v1/heartbeat", handle_heartbeat),
            web.get("/v1/news", handle_news),
            web.post("/v1/lease", handle_lease),
            web.post("/v1/leave", handle_leave),
            web.post("/v1/bad_peer", handle_bad_peer),
            web.post("/v1/rollout", handle_rollout),
            web.post("/v1/evaluation", handle_evaluation),
            web.get("/v1/evaluation", handle_evaluation_result),
            web.post("/v1/publish", handle_publish),
            web.post("/v1/batch", handle_batch),
            web.post("/v1/batch/reject", handle_reject_batch),
            web.post("/v1/audit", handle_audit),
            web.get("/v1/state", handle_state),
            web.get("/v1/broadcast_config", handle_broadcast_config),
            web.post("/v1/probe", handle_probe),
            web.get("/healthz", handle_health),
        ]
    )
    return app
