"""Watching a run: the coordinator's Prometheus `/metrics` and dashboard on a real loopback
server, over a state driven through leases, submissions, heartbeats and a batch, with the
learner's records in the run's metrics file; who may read them."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from tests.unit.coordinator_helpers import FakeClock, lease, make_state, past_slow_start, publish, submission

from echo2.coordinator.http.dashboard import SESSION_COOKIE
from echo2.coordinator.http.server import build_app
from echo2.coordinator.parts.credentials import ROUTE_ROLES, Secrets
from echo2.protocol.messages import Heartbeat, RegisterRequest
from echo2.report.metrics import MetricsWriter

JOIN, LEARNER_TOKEN, OPERATOR_TOKEN = "dash-join-0123456789", "dash-learner-0123456789", "dash-operator-0123456789"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
TIMEOUT = aiohttp.ClientTimeout(total=10)


@pytest.fixture
def run(tmp_path, tiny_model_dir):
    """A coordinator state two workers ($0.5/h and $1.5/h) worked for: version 1 published, step
    0's batch assigned (2 groups of version 0), one group buffered, one lease out; the learner's
    step and eval records in the run's metrics file."""
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=1, groups_per_step=2)
    publish(state, 0)
    for worker_id, price in (("w0", 0.5), ("w1", 1.5)):
        state.worker_desk.register(RegisterRequest(worker_id=worker_id, engine="hf", price_per_hour=price,
                                       relay_address=f"http://{worker_id}:1"))
    past_slow_start(state, "w0", "w1")
    for task in lease(state, "w0", 0, max_tasks=2).tasks:
        clock.now += 1.0
        state.intake.submit(submission(state, "w0", task.lease_id, 0))
    assert state.learner_desk.take_batch(0) is not None
    publish(state, 1)
    state.worker_desk.heartbeat(Heartbeat(worker_id="w0", version=1, dissemination_s=0.75, bytes_relayed_total=123_456))
    state.worker_desk.heartbeat(Heartbeat(worker_id="w1", version=0))
    held = lease(state, "w1", 0, max_tasks=2).tasks
    state.intake.submit(submission(state, "w1", held[0].lease_id, 0))
    learner = MetricsWriter(tmp_path / "metrics.jsonl", role="learner")
    learner.write("eval", step=0, accuracy=0.25, problems=8, eval_s=0.1)
    learner.write("train_step", step=0, wait_s=1.0, train_s=2.0, publish_s=1.0, reward_mean=0.625,
                  staleness_max=0, staleness_hist={"0": 2}, token_staleness_hist={"0": 12, "1": 4},
                  tokens_masked_stale=4)
    learner.write("checkpoint", step=1, checkpoint_s=1.0, path="x")
    learner.write("eval", step=1, accuracy=0.5, problems=8, eval_s=0.1)
    learner.close()
    return state, tmp_path / "metrics.jsonl"


def serve(state, metrics_path, scenario):
    """Run `scenario(session, url)` against a coordinator app on port 0 (every await bounded)."""
    async def main():
        secrets = Secrets(join=JOIN, learner=LEARNER_TOKEN, operator=OPERATOR_TOKEN)
        app = build_app(state, MetricsWriter(metrics_path, "coordinator"), secrets,
                        max_request_bytes=64 << 10)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
                return await asyncio.wait_for(scenario(session, f"http://{host}:{port}"), timeout=30)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


async def _settled(session, url, path: str, ready, headers=OPERATOR) -> str:
    """GET `path` until `ready(text)`: the history reads the metrics file once a second."""
    deadline = time.monotonic() + 10
    while True:
        async with session.get(url + path, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            text = await resp.text()
        if ready(text) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_prometheus_metrics_parse_and_follow_the_run(run):
    state, metrics_path = run

    async def scenario(session, url):
        return await _settled(session, url, "/metrics", lambda t: "echo2_heldout_accuracy_ratio" in t
                              and 'echo2_staleness_steps_count 2.0' in t)

    samples = _samples(serve(state, metrics_path, scenario))
    one = {name: value for (name, labels), value in samples.items() if not labels}
    assert one["echo2_learner_step"] == 0 and one["echo2_policy_version"] == 1
    assert one["echo2_leases_outstanding"] == 1 and one["echo2_groups_buffered"] == 1
    assert one["echo2_workers_live"] == 2 and one["echo2_workers_active"] == 2
    assert one["echo2_cost_dollars_per_hour"] == pytest.approx(2.0)  # both rented; the learner is priced 0
    assert one["echo2_reward_mean"] == 0.625 and one["echo2_heldout_accuracy_ratio"] == 0.5
    # busy 2 + 1 + the checkpoint's 1, waiting 1: as report.summary counts it
    assert one["echo2_learner_utilization_ratio"] == pytest.approx(0.8)
    assert samples["echo2_groups_total", (("outcome", "trained"),)] == 2
    assert samples["echo2_groups_total", (("outcome", "accepted"),)] == 3
    # step 0 trained on two groups of version 0: staleness 0; the buckets run up to S
    assert samples["echo2_staleness_steps_bucket", (("le", "0.0"),)] == 2
    assert one["echo2_staleness_steps_count"] == 2 and one["echo2_staleness_steps_sum"] == 0
    assert samples["echo2_token_staleness_steps_bucket", (("le", "0.0"),)] == 12
    assert one["echo2_token_staleness_steps_count"] == 16 and one["echo2_token_staleness_steps_sum"] == 4
    assert one["echo2_tokens_masked_stale_total"] == 4
    w0, w1 = (("worker", "w0"),), (("worker", "w1"),)
    assert samples["echo2_worker_relayed_bytes_total", w0] == 123_456
    assert samples["echo2_worker_publish_to_loaded_seconds", w0] == 0.75
    assert ("echo2_worker_publish_to_loaded_seconds", w1) not in samples  # never reported: no sample
    assert samples["echo2_worker_version", w0] == 1 and samples["echo2_worker_version", w1] == 0
    assert samples["echo2_worker_tokens_per_second", w0] > 0
    assert samples["echo2_worker_price_dollars_per_hour", w1] == 1.5


def test_dashboard_state_is_the_run(run):
    state, metrics_path = run

    async def scenario(session, url):
        import json

        text = await _settled(session, url, "/dashboard/state.json", lambda t: json.loads(t)["curves"]["accuracy"]
                              and json.loads(t)["staleness_hist"])
        return json.loads(text)

    view = serve(state, metrics_path, scenario)
    assert (view["learner_step"], view["version"], view["max_staleness"]) == (0, 1, 1)
    assert (view["queued"], view["leased"], view["buffered"]) == (0, 1, 1)
    assert view["curves"] == {"reward": [[0, 0.625]], "accuracy": [[0, 0.25], [1, 0.5]], "utilization": [[0, 0.75]]}
    assert view["learner_utilization"] == pytest.approx(0.8)  # the checkpoint came after step 0's point
    assert view["staleness_hist"] == {"0": 2}
    # per token, as the learner counted: a fifth of what it was given masked as older than S
    assert view["token_staleness_hist"] == {"0": 12, "1": 4} and view["tokens_masked_stale"] == 4
    assert view["masked_token_share"] == pytest.approx(0.2)
    rows = {w["worker_id"]: w for w in view["workers"]}
    assert rows["w0"] | {"tokens_per_s": None, "rollouts_per_s": None, "cost": None} == {
        "worker_id": "w0", "status": "active", "alive": True, "version": 1, "leases": 0, "rollouts": 4,
        "tokens": state.registry.workers["w0"].tokens, "tokens_per_s": None, "rollouts_per_s": None,
        "publish_to_loaded_s": 0.75,
        "bytes_relayed": 123_456, "price_per_hour": 0.5, "cost": None}
    # tokens over the generation seconds reported
    assert rows["w0"]["tokens_per_s"] == pytest.approx(state.registry.workers["w0"].tokens / 0.2)
    assert rows["w0"]["cost"] == pytest.approx(0.5 * 2 / 3600)  # registered 2 s (fake clock) ago
    assert (rows["w1"]["leases"], rows["w1"]["version"], rows["w1"]["bytes_relayed"]) == (1, 0, 0)
    assert (view["workers_live"], view["workers_active"], view["cost"]["per_hour"]) == (2, 2, 2.0)
    # version 1's tree over the two relays; w0 holds it already
    nodes = {n["id"]: n for n in view["broadcast"]["nodes"]}
    assert view["broadcast"]["version"] == 1 and set(nodes) == {"origin", "w0", "w1"}
    assert nodes["w0"]["holds"] and not nodes["w1"]["holds"]
    assert {nodes["w0"]["parent"], nodes["w1"]["parent"]} <= {"origin", "w0", "w1"}
    assert view["required_rps"] is None  # infinite until the step time is known: JSON has no Infinity


def test_dashboard_and_metrics_need_the_operator_credential(run):
    state, metrics_path = run
    closed = ["/", "/dashboard/state.json", "/dashboard/app.js", "/dashboard/app.css", "/metrics"]

    async def status(session, url, path, headers=None):
        async with session.get(url + path, headers=headers or {}, allow_redirects=False) as resp:
            return resp.status, await resp.text()

    async def scenario(session, url):
        out = {"anonymous": [await status(session, url, p) for p in closed]}
        for name, token in (("join", JOIN), ("learner", LEARNER_TOKEN)):
            out[name] = [(await status(session, url, p, {"Authorization": f"Bearer {token}"}))[0] for p in closed]
        async with session.post(url + "/dashboard/login", data={"token": "wrong-" + OPERATOR_TOKEN},
                                allow_redirects=False) as resp:
            out["wrong_login"] = resp.status, len(session.cookie_jar)
        async with session.post(url + "/dashboard/login", data={"token": OPERATOR_TOKEN},
                                allow_redirects=False) as resp:
            out["login"] = resp.status, resp.headers["Location"], resp.headers["Set-Cookie"]
        async with session.head(url + "/metrics") as resp:  # HEAD runs the GET handler: same credential
            out["head"] = resp.status
        out["session"] = [(await status(session, url, p))[0] for p in closed + ["/v1/state"]]
        guesses = []  # wrong tokens are rate-limited per address, with the registrations
        for _ in range(int(state.cfg.coordinator.registrations_per_minute) + 1):
            async with session.post(url + "/dashboard/login", data={"token": "guess-" + OPERATOR_TOKEN},
                                    allow_redirects=False) as resp:
                guesses.append(resp.status)
        out["guesses"] = guesses
        out["bearer"] = [(await status(session, url, p, OPERATOR))[0] for p in closed]
        return out

    out = serve(state, metrics_path, scenario)
    assert [s for s, _ in out["anonymous"]] == [401] * len(closed)
    assert 'action="/dashboard/login"' in out["anonymous"][0][1]  # the page without a credential: the login form
    assert "echo2_" not in out["anonymous"][-1][1]
    assert out["join"] == out["learner"] == [401] * len(closed)
    assert out["wrong_login"] == (401, 0) and out["head"] == 401
    login_status, location, cookie = out["login"]
    assert (login_status, location) == (303, "/")
    assert f"{SESSION_COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert OPERATOR_TOKEN not in cookie
    # the session opens the dashboard's routes only; scrapers and /v1/state take the bearer token
    assert out["session"] == [200, 200, 200, 200, 401, 401]
    assert out["bearer"] == [200] * len(closed)
    assert out["guesses"][-1] == 429 and set(out["guesses"][:-2]) == {401}


def test_every_route_has_a_role(run):
    """A route missing from ROUTE_ROLES would be served to anyone: each one the app registers
    (HEAD aside: it takes its GET's role) is listed."""
    state, metrics_path = run
    app = build_app(state, MetricsWriter(None, "coordinator"), Secrets(JOIN, LEARNER_TOKEN, OPERATOR_TOKEN),
                    max_request_bytes=1024)
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    assert routes == set(ROUTE_ROLES)


def test_the_fleet_ledger_bill_is_in_metrics_and_the_dashboard(run):
    """A remote provider's machines: billed from acquire to release (its ledger), shown live."""
    from echo2.report.fleet_ledger import FleetLedger

    state, metrics_path = run
    ledger = FleetLedger(metrics_path.parent)
    ledger.acquiring("h-0", provider="ssh", machine="h", worker_class="", price_per_hour=3600.0)  # $1 a second
    ledger.started("h-0", pid=1)

    async def scenario(session, url):
        metrics = await _settled(session, url, "/metrics", lambda t: "echo2_fleet_billed_dollars" in t)
        async with session.get(url + "/dashboard/state.json", headers=OPERATOR) as resp:
            return metrics, await resp.json()

    metrics, view = serve(state, metrics_path, scenario)
    one = {name: value for (name, labels), value in _samples(metrics).items() if not labels}
    assert one["echo2_fleet_machines_held"] == 1 and one["echo2_fleet_billed_dollars_total"] > 0
    assert view["fleet_bill"]["held_at_end"] == ["h-0"] and view["fleet_bill"]["billed_usd"] > 0
