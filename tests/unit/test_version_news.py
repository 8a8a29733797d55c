"""Version news reaches a worker by one road, its news line (GET /v1/news), as it happens; a
heartbeat is answered at once and says when to beat next; lease and submit replies carry no
news; held requests and news lines end at once when the coordinator shuts down, and a worker
asked to stop gives up its held lease request instead of waiting it out."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from tests.unit.coordinator_helpers import (
    KEEP_ALIKE,
    LEARNER_KEY_HEX,
    FakeClock,
    make_state,
    publish,
    version_info,
)
from tests.unit.test_coordinator_http import LEARNER, LEARNER_TOKEN, TIMEOUT, TOKEN, _join, _post, _serve
from tests.unit.test_loopback_pipeline import _until

from echo2.config.run import RunConfig
from echo2.config.worker import WorkerConfig
from echo2.learner.io import LearnerIO
from echo2.models.loading import load_model
from echo2.models.weights import model_payload
from echo2.protocol.learner_api import PublishRequest
from echo2.protocol.messages import LeaseResponse, RegisterResponse, SubmitResponse
from echo2.report.metrics import MetricsWriter
from echo2.rollout.worker import Worker

BEAT = {"worker_id": "w0", "version": 0}


def _state(tmp_path, tiny_model_dir, **fields):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), rewards=KEEP_ALIKE, **fields)
    publish(state, 0)
    return state


async def _publish(session, url, version: int) -> None:
    body = PublishRequest(info=version_info(version), public_key_hex=LEARNER_KEY_HEX).model_dump_json()
    async with session.post(url + "/v1/publish", data=body, headers=LEARNER) as resp:
        assert resp.status == 200, await resp.text()


async def _timed_beat(session, url, headers, **fields) -> tuple[float, dict]:
    started = time.monotonic()
    status, reply = await _post(session, url, "/v1/heartbeat", {**BEAT, **fields}, headers)
    assert status == 200, reply
    return time.monotonic() - started, reply


def _with_server(state, scenario):
    async def main():
        runner, url = await _serve(state)
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                return await asyncio.wait_for(scenario(session, url, runner), timeout=30)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


async def _lines(session, url, headers, into: list) -> None:
    """Read a news line into `into` as (seconds since opened, reply), blank keepalives skipped."""
    opened = time.monotonic()
    async with session.get(url + "/v1/news", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            if raw.strip():
                into.append((time.monotonic() - opened, json.loads(raw)))


def test_the_news_line_tells_a_version_as_it_is_published_and_heartbeats_are_answered_at_once(
        tmp_path, tiny_model_dir):
    state = _state(tmp_path, tiny_model_dir)

    async def scenario(session, url, runner):
        headers = await _join(session, url, "w0")
        heard: list = []
        listening = asyncio.create_task(_lines(session, url, headers, heard))
        await _until(lambda: heard)  # told at once what is out
        beat_s, beat = await _timed_beat(session, url, headers)
        published = time.monotonic()
        await _publish(session, url, 1)
        await _until(lambda: len(heard) >= 2)
        news_s = time.monotonic() - published
        listening.cancel()
        return heard, beat_s, beat, news_s

    heard, beat_s, beat, news_s = _with_server(state, scenario)
    assert heard[0][0] < 0.5 and heard[0][1]["latest"]["version"] == 0 and heard[0][1]["kind"] == "heartbeat_ack"
    assert heard[1][1]["latest"]["version"] == 1 and heard[1][1]["fetch"] is None  # fetch the newest: not sent twice
    assert heard[1][1]["assignment"]["version"] == 1  # where to pull it from, with the news
    assert news_s < 0.5, news_s
    assert beat_s < 0.5 and beat["latest"]["version"] == 0 and 0.9 <= beat["heartbeat_interval_s"] <= 1.1


def test_activation_reaches_the_news_line_of_the_workers_it_changes(tmp_path, tiny_model_dir):
    """A worker idled by the controller hears so on its line at the next decision, without a
    heartbeat; a worker opening a second line ends its first."""
    # one decision, the upkeep's first: a later one could undo the idling below before it is told
    state = _state(tmp_path, tiny_model_dir, config={"activation": {"control_period_s": 3600.0}})
    decisions = []
    control = state.fleet_desk.control
    state.fleet_desk.control = lambda *args, **kwargs: (decisions.append(1), control(*args, **kwargs))[1]

    async def scenario(session, url, runner):
        headers = await _join(session, url, "w0")
        first: list = []
        listening = asyncio.create_task(_lines(session, url, headers, first))
        await _until(lambda: first and decisions and not state.fleet_desk.control_due)
        state.controller.workers["w0"].active = False  # what a decision idling it leaves
        request_news(runner.app)
        await _until(lambda: len(first) >= 2)
        second: list = []
        again = asyncio.create_task(_lines(session, url, headers, second))
        await _until(lambda: second and listening.done())  # the first line ended
        again.cancel()
        return first, second

    first, second = _with_server(state, scenario)
    assert len(decisions) == 1
    assert first[0][1]["active"] and not first[1][1]["active"]
    assert not second[0][1]["active"]


def request_news(app) -> None:
    from echo2.coordinator.http.base import NEWS_KEY

    app[NEWS_KEY].announce(activity=True)


def test_lease_and_submit_replies_carry_no_version_news():
    fields = set(LeaseResponse.model_fields) | set(SubmitResponse.model_fields) | set(RegisterResponse.model_fields)
    assert not {name for name in fields if "latest" in name}


def test_held_requests_answer_at_once_when_the_coordinator_shuts_down(tmp_path, tiny_model_dir):
    state = _state(tmp_path, tiny_model_dir, heartbeat_interval_s=10.0, worker_timeout_s=30.0)

    async def scenario(session, url, runner):
        headers = await _join(session, url, "w0")
        heard: list = []
        line = asyncio.create_task(_lines(session, url, headers, heard))
        await _until(lambda: heard)  # the line is open now
        started = time.monotonic()
        await runner.cleanup()
        await asyncio.wait_for(line, timeout=5)
        return time.monotonic() - started, heard

    shutdown_s, heard = _with_server(state, scenario)
    assert shutdown_s < 2.0 and heard[0][1]["latest"]["version"] == 0


def test_a_real_worker_hears_of_a_version_at_once_and_stops_without_waiting_out_its_lease_poll(
        tmp_path, tiny_model_dir):
    """Two things a worker does: it hears of a published version on its news line within a
    fraction of its heartbeat interval, and, asked to stop while
    its lease request is held for a full window, it gives that request up and leaves at once
    (it used to wait the 5 s poll out, and a launcher's grace could run out first)."""
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=0, groups_per_step=1, rewards=KEEP_ALIKE)
    model = load_model(str(tiny_model_dir))

    async def main():
        runner, url = await _serve(state, max_request_bytes=1 << 20)
        io = LearnerIO(RunConfig(run_dir=str(tmp_path / "run")), url, LEARNER_TOKEN, TOKEN)
        await asyncio.to_thread(io.start)
        worker = Worker(WorkerConfig(worker_id="w0", tasks_per_lease=1), url, TOKEN, MetricsWriter(None, "worker"))
        stop = asyncio.Event()
        try:
            await asyncio.to_thread(io.publish, 0, model_payload(model))
            job = asyncio.create_task(worker.run(stop))
            await _until(lambda: state.counters.accepted >= 1)  # its group is in: the window is full
            await asyncio.sleep(2.0)  # its next lease request is held (nobody takes the batch)
            heard_s = []
            for version in (1, 2):  # 2 right after it loaded 1 (its fetch asked what is next)
                published = time.monotonic()
                await asyncio.to_thread(io.publish, version, model_payload(model))
                await _until(lambda: worker.follower.latest.version == version)  # noqa: B023
                heard_s.append(time.monotonic() - published)
                await _until(lambda: worker.version == version)  # noqa: B023
            await asyncio.sleep(1.5)  # at version 2 its window is full again: a held lease request
            started = time.monotonic()
            stop.set()
            await asyncio.wait_for(job, timeout=15)
            return heard_s, time.monotonic() - started
        finally:
            stop.set()
            await asyncio.to_thread(io.close)
            await runner.cleanup()

    heard_s, stop_s = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert max(heard_s) < 0.6, heard_s  # the heartbeat interval is 1 s
    assert stop_s < 2.0 and not state.registry.workers["w0"].alive  # it left, well inside its 5 s poll


def test_a_version_is_told_to_the_active_workers_first():
    """The crier's order: the learner's next batches wait on the active workers' fetch, so their
    lines are written before the thousands of idle ones (order kept within each kind)."""
    from echo2.coordinator.http.news import NewsLines

    lines = NewsLines()
    for worker_id in ("idle0", "act0", "idle1", "act1", "idle2"):
        lines.lines[worker_id] = object()  # only the keys matter to the order
    assert lines.open_for() == ["idle0", "act0", "idle1", "act1", "idle2"]
    assert lines.open_for(first=lambda w: w.startswith("act")) == ["act0", "act1", "idle0", "idle1", "idle2"]
