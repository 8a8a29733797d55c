"""The coordinator's long-held requests: a worker's news line (version news and activation as
they happen), a lease refused for a full window waiting for room, the learner's batch request
waiting for its batch, the learner's question about a version's evaluation waiting for its
result; and heartbeats and evaluation submissions. A held request re-checks the state only when
something it waits on changed (the room signal: a version, a batch, a lease or an evaluation
result, never a heartbeat), and all of them answer at once when the coordinator shuts down."""

from __future__ import annotations

import asyncio

from aiohttp import web

from echo2.coordinator.http.base import (
    CHANGED_KEY,
    NEWS_KEY,
    ROOM_KEY,
    SCORING_KEY,
    STATE_KEY,
    WORKER_KEY,
    evaluation_desk,
    float_query,
    int_query,
    parse_body,
    typed_reply,
    worker_body,
)
from echo2.coordinator.http.news import reply_bytes
from echo2.protocol.learner_api import BatchRequest, BatchResponse
from echo2.protocol.messages import WAITS_FOR_ROOM, EvalSubmission, Heartbeat, LeaseRequest, LeaseResponse

# upper bound on one batch long-poll, whatever the learner asks: keeps requests well inside
# client and proxy timeouts
MAX_BATCH_WAIT_S = 30.0
# a lease refused for a full window waits at most this long for room (the worker asks for less
# when its own request timeout is short): one request per long poll instead of ten a second
MAX_LEASE_WAIT_S = 10.0
# a batch held back by the share cap (policy/trust.py) forms when its wait ends, which no
# request announces: a held batch request looks again this often
BATCH_RECHECK_S = 0.5
HELD_HEADER = "X-Echo2-Held-S"
"""How long a lease request was held waiting for room (seconds): its latency less that is the
coordinator's own time (benchmarks/coordinator_load.py reports both)."""


async def handle_heartbeat(request: web.Request) -> web.Response:
    """Recorded and answered at once: the worker's news as of now, and when to beat next."""
    req = await worker_body(request, Heartbeat)
    news = request.app[STATE_KEY].worker_desk.heartbeat(req)
    return web.Response(body=reply_bytes(request.app[NEWS_KEY].pieces, news), content_type="application/json")


async def handle_news(request: web.Request) -> web.StreamResponse:
    """The worker's news line (`news.NewsLines`), for the worker its credential names: what it
    should know now, then each change as it happens, until it goes or the coordinator stops."""
    worker_id = request[WORKER_KEY]
    state = request.app[STATE_KEY]
    record = state.registry.live(worker_id)
    return await request.app[NEWS_KEY].serve(request, worker_id, state.worker_desk.news(record))


async def handle_lease(request: web.Request) -> web.Response:
    """A lease refused for a full window is held until room opens, or a new version is out (the
    worker should load it: its room is counted from the version it holds), up to the worker's
    wait_s: a refused worker does not poll."""
    req = await worker_body(request, LeaseRequest)
    state, room = request.app[STATE_KEY], request.app[ROOM_KEY]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(req.wait_s, MAX_LEASE_WAIT_S)
    asked_at, held_s = state.versions.current, 0.0
    reply = state.worker_desk.lease(req)
    while (_waits_for_room(reply) and loop.time() < deadline and state.versions.current == asked_at
           and not room.closed):
        waited_from = loop.time()
        await room.wait(deadline - loop.time())
        held_s += loop.time() - waited_from
        reply = state.worker_desk.lease(req)
    answer = typed_reply(reply)
    answer.headers[HELD_HEADER] = f"{held_s:.3f}"  # the time waiting for room, apart from the serving
    return answer


def _waits_for_room(reply: LeaseResponse) -> bool:
    return not reply.tasks and reply.evaluation is None and reply.refusal in WAITS_FOR_ROOM


async def handle_evaluation(request: web.Request) -> web.Response:
    """Scored off the event loop (the scoring pool), like rollouts."""
    req = await worker_body(request, EvalSubmission)
    return typed_reply(await evaluation_desk(request.app[STATE_KEY]).submit_scored(req, request.app[SCORING_KEY]))


async def handle_evaluation_result(request: web.Request) -> web.Response:
    """The learner asks for a version's evaluation, waiting up to wait_s for it (long poll)."""
    version = int_query(request, "version", minimum=0)
    wait_s = min(float_query(request, "wait_s", 0.0), MAX_BATCH_WAIT_S)
    state, room = request.app[STATE_KEY], request.app[ROOM_KEY]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    result = evaluation_desk(state).result(version)
    while not result.done and loop.time() < deadline and not room.closed:
        await room.wait(deadline - loop.time())
        result = evaluation_desk(state).result(version)
    return typed_reply(result)


async def handle_batch(request: web.Request) -> web.Response:
    """The learner's progress report and its ask for a step's batch, held until the batch is
    ready or `wait_s` (at most MAX_BATCH_WAIT_S) has passed."""
    req = await parse_body(request, BatchRequest)
    state, changed = request.app[STATE_KEY], request.app[CHANGED_KEY]
    if req.step_time_s is not None:
        state.learner_desk.observe_step_time(req.step_time_s)
    if req.durable_step is not None:  # the learner's newest checkpoint: older batches can go
        state.learner_desk.checkpointed(req.durable_step, req.step)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(req.wait_s, MAX_BATCH_WAIT_S)
    groups = state.learner_desk.take_batch(req.step)
    while groups is None and loop.time() < deadline and not request.app[ROOM_KEY].closed:
        async with changed:
            try:
                await asyncio.wait_for(changed.wait(), timeout=min(deadline - loop.time(), BATCH_RECHECK_S))
            except TimeoutError:
                pass
        groups = state.learner_desk.take_batch(req.step)
    return typed_reply(BatchResponse(step=req.step, groups=groups or []))


async def answer_long_polls_now(app: web.Application) -> None:
    """On shutdown (before aiohttp waits for the requests in flight): every held request answers
    with what it has, instead of the shutdown waiting out each one's deadline."""
    app[ROOM_KEY].close()
    app[NEWS_KEY].close_all()
    async with app[CHANGED_KEY]:
        app[CHANGED_KEY].notify_all()
