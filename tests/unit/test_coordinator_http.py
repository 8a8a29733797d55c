"""The coordinator's HTTP face on a real loopback server: authentication, malformed and
out-of-protocol requests get a 4xx with a clear message and change nothing, the batch long-poll."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from tests.unit.coordinator_helpers import KEEP_ALIKE, FakeClock, make_state, past_slow_start, publish

from echo2.coordinator.http.server import build_app
from echo2.coordinator.http.view import snapshot
from echo2.coordinator.parts.credentials import Secrets
from echo2.protocol.learner_api import RejectBatchResponse
from echo2.report.metrics import MetricsWriter

TOKEN = "loopback-token-0123456789"  # the join token
LEARNER_TOKEN = "loopback-learner-0123456789"
OPERATOR_TOKEN = "loopback-operator-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LEARNER = {"Authorization": f"Bearer {LEARNER_TOKEN}"}
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
TIMEOUT = aiohttp.ClientTimeout(total=10)


async def _serve(state, max_request_bytes: int = 64 << 10, metrics_path=None, scoring=None):
    """`scoring`: a ScoringPool (None: submissions scored inline)."""
    secrets = Secrets(join=TOKEN, learner=LEARNER_TOKEN, operator=OPERATOR_TOKEN)
    app = build_app(state, MetricsWriter(metrics_path, "coordinator"), secrets,
                    max_request_bytes=max_request_bytes, scoring=scoring)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def run_with_server(state, scenario, timeout_s: float = 30.0, **kwargs):
    """`timeout_s`: for the whole scenario and each of its requests (10 s, at most)."""
    async def main():
        runner, url = await _serve(state, **kwargs)
        try:
            request_timeout = aiohttp.ClientTimeout(total=max(TIMEOUT.total, timeout_s / 3))
            async with aiohttp.ClientSession(timeout=request_timeout) as session:
                return await asyncio.wait_for(scenario(session, url), timeout=timeout_s)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


@pytest.fixture
def state(tmp_path, tiny_model_dir):
    # the bodies here send fixed tokens, alike in every completion: kept (the transport is tested)
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), rewards=KEEP_ALIKE)
    publish(state, 0)
    return state


async def _post(session, url, path, body, headers=AUTH):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    async with session.post(url + path, data=data, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def _join(session, url, worker_id: str) -> dict[str, str]:
    """Register with the join token; the headers of that worker's own credential."""
    status, reply = await _post(session, url, "/v1/register", {"worker_id": worker_id, "engine": "hf"})
    assert status == 200, reply
    return {"Authorization": f"Bearer {reply['credential']}"}


def test_requests_without_the_token_are_refused(state):
    async def scenario(session, url):
        status, body = await _post(session, url, "/v1/register", {"engine": "hf"}, headers={})
        wrong = await _post(session, url, "/v1/register", {"engine": "hf"}, headers={"Authorization": "Bearer x"})
        async with session.get(url + "/healthz") as resp:
            health = resp.status
        return status, body, wrong[0], health

    status, body, wrong, health = run_with_server(state, scenario)
    assert (status, wrong, health) == (401, 401, 200)
    assert "token" in body["error"]
    assert state.registry.workers == {}


def test_bad_requests_get_4xx_and_change_nothing(state):
    async def scenario(session, url):
        w1 = await _join(session, url, "w1")
        status, lease = await _post(session, url, "/v1/lease", {"worker_id": "w1", "version": 0}, w1)
        task = lease["tasks"][0]
        before = json.dumps(snapshot(state), sort_keys=True)
        good = {"worker_id": "w1", "lease_id": task["lease_id"], "version": 0, "gen_time_s": 0.1,
                "completions": [{"token_ids": [20, 3], "logprobs": [-0.5, -0.5]}] * 2}
        cases = {
            "not json": "{nope",
            "unknown kind": {**good, "kind": "something_else"},
            "unknown field": {**good, "reward": [1.0, 1.0]},
            "nan": json.dumps(good).replace("-0.5, -0.5]}, {", "NaN, -0.5]}, {", 1),
            "unknown task": {**good, "lease_id": "L0000"},
            "another worker's id": {**good, "worker_id": "w9"},
            "future version": {**good, "version": 3},
            "bad token id": {**good, "completions": [{"token_ids": [999], "logprobs": [-1.0]}] * 2},
            "logprob length": {**good, "completions": [{"token_ids": [20, 3], "logprobs": [-1.0]}] * 2},
            "oversized": {**good, "padding": "x" * (80 << 10)},
        }
        results = {name: await _post(session, url, "/v1/rollout", body, w1) for name, body in cases.items()}
        after = json.dumps(snapshot(state), sort_keys=True)
        accepted = await _post(session, url, "/v1/rollout", good, w1)
        return results, before, after, accepted

    results, before, after, accepted = run_with_server(state, scenario)
    expected = {"not json": 400, "unknown kind": 400, "unknown field": 400, "nan": 400, "unknown task": 409,
                "another worker's id": 403, "future version": 422, "bad token id": 422, "logprob length": 422,
                "oversized": 413}
    assert {name: status for name, (status, _) in results.items()} == expected
    assert "future" in results["future version"][1]["error"]
    assert "vocabulary" in results["bad token id"][1]["error"]
    assert before == after
    assert accepted[0] == 200 and accepted[1]["accepted"]


def test_batch_long_poll_returns_when_the_batch_fills(state):
    async def scenario(session, url):
        w1 = await _join(session, url, "w1")
        past_slow_start(state, "w1")
        _, lease = await _post(session, url, "/v1/lease", {"worker_id": "w1", "version": 0, "max_tasks": 2}, w1)

        async def submit_later():
            await asyncio.sleep(0.3)
            for task in lease["tasks"]:
                body = {"worker_id": "w1", "lease_id": task["lease_id"], "version": 0, "gen_time_s": 0.1,
                        "completions": [{"token_ids": [20, 3], "logprobs": [-0.5, -0.5]}] * 2}
                await _post(session, url, "/v1/rollout", body, w1)

        submitter = asyncio.create_task(submit_later())
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with session.post(url + "/v1/batch", json={"step": 0, "wait_s": 10}, headers=LEARNER) as resp:
            batch = await resp.json()
        await submitter
        async with session.post(url + "/v1/batch", json={"step": "x"}, headers=LEARNER) as resp:
            bad = resp.status
        return batch, loop.time() - started, bad

    batch, waited_s, bad = run_with_server(state, scenario)
    assert len(batch["groups"]) == 2 and 0.2 < waited_s < 5
    assert bad == 400


def test_learner_hands_a_batch_back(state):
    async def scenario(session, url):
        w1 = await _join(session, url, "w1")
        past_slow_start(state, "w1")
        _, lease = await _post(session, url, "/v1/lease", {"worker_id": "w1", "version": 0, "max_tasks": 2}, w1)
        for task in lease["tasks"]:
            body = {"worker_id": "w1", "lease_id": task["lease_id"], "version": 0, "gen_time_s": 0.1,
                    "completions": [{"token_ids": [20, 3], "logprobs": [-0.5, -0.5]}] * 2}
            await _post(session, url, "/v1/rollout", body, w1)
        async with session.post(url + "/v1/batch", json={"step": 0, "wait_s": 1}, headers=LEARNER) as resp:
            batch = await resp.json()
        wrong_step = await _post(session, url, "/v1/batch/reject", {"step": 3, "reason": "x"}, LEARNER)
        malformed = await _post(session, url, "/v1/batch/reject", {"step": -1}, LEARNER)
        ok = await _post(session, url, "/v1/batch/reject", {"step": 0, "reason": "loss is nan"}, LEARNER)
        async with session.post(url + "/v1/batch", json={"step": 0, "wait_s": 0.2}, headers=LEARNER) as resp:
            after = await resp.json()
        return batch, wrong_step, malformed, ok, after

    batch, wrong_step, malformed, ok, after = run_with_server(state, scenario)
    assert len(batch["groups"]) == 2
    assert wrong_step[0] == 409 and "newest assigned batch is step 0" in wrong_step[1]["error"]
    assert malformed[0] == 400
    assert ok[0] == 200 and RejectBatchResponse.model_validate(ok[1]).groups_rejected == 2
    assert after["groups"] == [] and state.counters.rejected_by_learner == 2
