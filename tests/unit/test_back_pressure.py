"""Back-pressure that degrades gracefully: registrations beyond the run's pace are told when to
come back, each in a slot of its own; a loaded coordinator stretches the heartbeat interval it
tells workers (and their timeouts with it) and defers registrations; a large fleet beats at the
planned rate; newcomers wait for the next activation decision; held lease requests are woken by
room opening, never by heartbeats; and the real worker keeps a Retry-After."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from tests.unit.coordinator_helpers import FakeClock, make_state, publish, register
from tests.unit.test_coordinator_http import TIMEOUT, _join, _post, _serve

from echo2.config.worker import WorkerConfig
from echo2.coordinator.desks.workers import OVERLOADED, OVERLOADED_REFUSAL_S
from echo2.coordinator.records.errors import RequestError
from echo2.protocol.messages import Heartbeat, LeaveRequest, RegisterRequest
from echo2.rollout.link import CoordinatorLink


def _refusals(state, count: int) -> list[float]:
    waits = []
    for i in range(count):
        with pytest.raises(RequestError) as refused:
            state.worker_desk.register(RegisterRequest(worker_id=f"late{i}", engine="hf"), source=f"10.0.0.{i}")
        assert refused.value.status == 503 and refused.value.retry_after_s is not None
        waits.append(refused.value.retry_after_s)
    return waits


def test_registrations_past_the_runs_pace_get_a_slot_each(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), registrations_per_s=10.0)
    for i in range(10):  # a burst of a second's worth
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf"), source=f"10.1.0.{i}")
    waits = _refusals(state, 20)
    gaps = [later - earlier for earlier, later in zip(waits, waits[1:], strict=False)]
    assert all(0.0 < gap < 0.2 for gap in gaps), gaps  # one slot each, 0.1 s apart (plus up to 0.1 s spread)
    assert 1.9 < waits[-1] < 2.2  # twenty slots: two seconds of the run's pace
    assert len(state.registry.workers) == 10  # a deferred registration changes nothing


def test_a_loaded_coordinator_stretches_heartbeats_and_defers_registrations(tmp_path, tiny_model_dir):
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock)
    publish(state, 0)
    register(state, "a")
    calm = state.worker_desk.heartbeat(Heartbeat(worker_id="a", version=0)).heartbeat_interval_s
    state.worker_desk.load_stretch = OVERLOADED
    loaded = state.worker_desk.heartbeat(Heartbeat(worker_id="a", version=0)).heartbeat_interval_s
    assert 0.9 <= calm <= 1.1 and 3.6 <= loaded <= 4.4
    assert state.registry.workers["a"].silent_after_s == pytest.approx(5.0 * loaded)  # its timeout stretches too
    (wait_s,) = _refusals(state, 1)
    assert wait_s >= OVERLOADED_REFUSAL_S
    clock.now += 10.0  # silent past worker_timeout_s (5 s), within its stretched timeout: still live
    state.fleet_desk.sweep()
    assert state.registry.workers["a"].alive


def test_a_large_fleet_beats_at_the_planned_rate(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), heartbeats_per_s=2.0, registrations_per_s=1e6,
                       registrations_per_minute=1e6)
    publish(state, 0)
    for i in range(20):
        register(state, f"w{i}")
    interval_s = state.worker_desk.heartbeat(Heartbeat(worker_id="w0", version=0)).heartbeat_interval_s
    assert 9.0 <= interval_s <= 11.0  # 20 workers at 2 beats a second: every 10 s


def test_news_of_a_shrunken_fleet_never_shortens_the_silence_owed_to_the_last_beat(tmp_path, tiny_model_dir):
    """A worker told "beat in 10 s" sleeps 10 s whatever its news line says meanwhile: when the
    fleet shrinks and the line tells a 1 s interval, the worker is not taken for gone before the
    beat it owes (a fleet leaving fast timed out hundreds of honest workers at 10,000)."""
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, heartbeats_per_s=2.0, registrations_per_s=1e6,
                       registrations_per_minute=1e6)
    publish(state, 0)
    for i in range(20):
        register(state, f"w{i}")
    told_s = state.worker_desk.heartbeat(Heartbeat(worker_id="w0", version=0)).heartbeat_interval_s
    assert told_s >= 9.0
    for i in range(1, 20):
        state.worker_desk.leave(LeaveRequest(worker_id=f"w{i}"))
    state.fleet_desk.sweep()  # the live count taken anew: one worker
    clock.now += 1.0
    shorter_s = state.worker_desk.news_of("w0").heartbeat_interval_s
    assert shorter_s < 1.2
    clock.now += told_s - 1.0 + 0.01  # the worker beats when it was told to, a moment late
    state.fleet_desk.sweep()
    assert state.registry.workers["w0"].alive
    state.worker_desk.heartbeat(Heartbeat(worker_id="w0", version=0))  # its beat: the 1 s pace from now on
    clock.now += 10 * shorter_s
    state.fleet_desk.sweep()
    assert not state.registry.workers["w0"].alive  # silent ten beats at the pace it was told


def test_newcomers_wait_for_the_next_decision_and_departures_coalesce(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    publish(state, 0)
    state.learner_desk.observe_step_time(1.0)  # the demand is known: the controller decides
    for i in range(5):
        register(state, f"w{i}")
    assert not any(state.controller.is_active(f"w{i}") for i in range(5))  # none leases before a decision
    state.fleet_desk.sweep()  # the decision (none measured yet: all of them run)
    assert all(state.controller.is_active(f"w{i}") for i in range(5))
    for i in range(5):
        state.worker_desk.leave(LeaveRequest(worker_id=f"w{i}"))
    decisions = lambda: [e for e in state.events if e.kind == "activation"]  # noqa: E731
    before = len(decisions())
    state.fleet_desk.sweep()
    assert len(decisions()) == before + 1 and decisions()[-1].trigger.count("left") == 5  # one for the five


def test_a_held_lease_request_is_woken_by_room_not_by_heartbeats(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=0, groups_per_step=1)
    publish(state, 0)
    asked = []
    lease = state.worker_desk.lease
    state.worker_desk.lease = lambda req: asked.append(req.worker_id) or lease(req)

    async def scenario(session, url):
        a, b = await _join(session, url, "a"), await _join(session, url, "b")
        status, first = await _post(session, url, "/v1/lease", {"worker_id": "a", "version": 0}, a)
        assert status == 200 and first["tasks"]  # the window (one group) is a's now
        held = asyncio.create_task(_post(session, url, "/v1/lease", {"worker_id": "b", "version": 0, "wait_s": 5}, b))
        await asyncio.sleep(0.3)
        for _ in range(30):  # heartbeats: nothing a held lease waits on
            await _post(session, url, "/v1/heartbeat", {"worker_id": "a", "version": 0}, a)
        rechecks = asked.count("b")
        state.fleet_desk.requeue(state.leases_book.held_by("a"), reason="lease_timeout")  # room opens
        await _post(session, url, "/v1/heartbeat", {"worker_id": "a", "version": 0}, a)  # a request: the mark moves
        status, reply = await asyncio.wait_for(held, 5)
        return rechecks, status, reply

    async def main():
        runner, url = await _serve(state)
        try:
            import aiohttp

            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                return await scenario(session, url)
        finally:
            await runner.cleanup()

    rechecks, status, reply = asyncio.run(asyncio.wait_for(main(), 30))
    assert rechecks == 1, rechecks  # asked once, then held: 30 heartbeats woke it for nothing
    assert status == 200 and reply["tasks"]


def test_the_worker_keeps_a_busy_coordinators_retry_after(tmp_path):
    answers = []

    async def register(request):
        answers.append(time.monotonic())
        if len(answers) == 1:
            return web.json_response({"kind": "error", "error": "busy"}, status=503, headers={"Retry-After": "1"})
        return web.json_response({"ok": True})

    async def main():
        app = web.Application()
        app.add_routes([web.post("/v1/register", register)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        link = CoordinatorLink(f"http://{host}:{port}", WorkerConfig(worker_id="w0"), asyncio.Event())
        try:
            import aiohttp

            async with aiohttp.ClientSession() as link.session:
                started = time.monotonic()
                await link.retrying("POST", "/v1/register", None)
                return time.monotonic() - started
        finally:
            await runner.cleanup()

    took_s = asyncio.run(asyncio.wait_for(main(), 20))
    assert len(answers) == 2 and took_s >= 1.0  # the first backoff would have been 0.2 s
