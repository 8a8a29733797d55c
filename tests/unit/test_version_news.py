"""Version news reaches a worker by one road, its heartbeat, held at the coordinator until a
newer version is out (so news arrives at once while beats keep their pace); lease and submit
replies carry none; held requests answer at once when the coordinator shuts down, and a worker
asked to stop gives up its held lease request instead of waiting it out."""

from __future__ import annotations

import asyncio
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

BEAT = {"worker_id": "w0", "version": 0, "known_version": 0}


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


def test_a_held_heartbeat_answers_when_a_newer_version_is_published(tmp_path, tiny_model_dir):
    state = _state(tmp_path, tiny_model_dir)

    async def scenario(session, url, runner):
        headers = await _join(session, url, "w0")
        behind_s, behind = await _timed_beat(session, url, headers, known_version=-1, wait_s=5.0)
        quiet_s, quiet = await _timed_beat(session, url, headers, wait_s=5.0)  # capped at the 1 s interval
        publisher = asyncio.create_task(asyncio.sleep(0.3))
        publisher.add_done_callback(lambda _: asyncio.ensure_future(_publish(session, url, 1)))
        news_s, news = await _timed_beat(session, url, headers, wait_s=1.0)
        now_s, _ = await _timed_beat(session, url, headers, known_version=1)  # wait_s 0: at once
        return behind_s, behind, quiet_s, quiet, news_s, news, now_s

    behind_s, behind, quiet_s, quiet, news_s, news, now_s = _with_server(state, scenario)
    assert behind_s < 0.5 and behind["latest"]["version"] == 0  # it knew of none: told at once
    assert 0.9 < quiet_s < 2.5 and quiet["latest"]["version"] == 0  # nothing new: held a whole interval
    assert 0.25 < news_s < 0.9 and news["latest"]["version"] == 1  # answered when version 1 came out
    assert now_s < 0.5


def test_lease_and_submit_replies_carry_no_version_news():
    fields = set(LeaseResponse.model_fields) | set(SubmitResponse.model_fields) | set(RegisterResponse.model_fields)
    assert not {name for name in fields if "latest" in name}


def test_held_requests_answer_at_once_when_the_coordinator_shuts_down(tmp_path, tiny_model_dir):
    state = _state(tmp_path, tiny_model_dir, heartbeat_interval_s=10.0, worker_timeout_s=30.0)

    async def scenario(session, url, runner):
        headers = await _join(session, url, "w0")
        beat = asyncio.create_task(_timed_beat(session, url, headers, wait_s=10.0))
        await asyncio.sleep(0.3)  # the beat is held now
        started = time.monotonic()
        await runner.cleanup()
        return time.monotonic() - started, await beat

    shutdown_s, (beat_s, reply) = _with_server(state, scenario)
    assert shutdown_s < 2.0 and beat_s < 2.0 and reply["latest"]["version"] == 0


def test_a_real_worker_hears_of_a_version_at_once_and_stops_without_waiting_out_its_lease_poll(
        tmp_path, tiny_model_dir):
    """Two things a worker does on the one road: it hears of a published version within a
    fraction of its heartbeat interval (its beat is held until then), and, asked to stop while
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
