"""A worker that cannot join says why within seconds, and `echo2 worker --check` says it before
the worker is started: a wrong URL, a wrong join token and another echo2 protocol version, each
against a real coordinator over loopback (or nothing at all), plus the relay probe that tells a
worker whether peers can reach it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from tests.unit.coordinator_helpers import FakeClock, make_state, publish
from tests.unit.test_coordinator_http import TOKEN, _post, _serve, run_with_server

import echo2.coordinator.http.base as http_base
import echo2.coordinator.http.server as server
from echo2.config.worker import WorkerConfig
from echo2.protocol.messages import PROTOCOL_CHANGES, PROTOCOL_VERSION
from echo2.report.metrics import MetricsWriter
from echo2.rollout.check import run_checks
from echo2.rollout.diagnosis import WorkerFailed
from echo2.rollout.worker import Worker

# a port nothing listens on: the kernel refuses at once (port 1 needs root to bind)
NOBODY = "http://127.0.0.1:1"


@pytest.fixture
def state(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    publish(state, 0)
    return state


def _with_coordinator(state, body):
    """Run `body(url)` beside a real coordinator app on a loopback port."""
    async def main():
        runner, url = await _serve(state)
        try:
            return await asyncio.wait_for(body(url), timeout=30)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def _join_fails(state, token: str, tmp_path) -> tuple[str, float]:
    async def body(url):
        worker = Worker(WorkerConfig(device="cpu"), url, token, MetricsWriter(tmp_path / "m.jsonl", "worker"))
        started = time.monotonic()
        with pytest.raises(WorkerFailed) as failed:
            await worker.run(asyncio.Event())
        return str(failed.value), time.monotonic() - started

    return _with_coordinator(state, body)


def test_a_wrong_join_token_is_named_at_once(state, tmp_path):
    message, elapsed_s = _join_fails(state, "not-the-join-token-0123456789", tmp_path)
    assert "refused this worker's join token" in message and "ECHO2_AUTH_TOKEN" in message
    assert elapsed_s < 5
    assert state.registry.workers == {}


def test_a_worker_of_another_protocol_version_is_refused_naming_both(state, tmp_path, monkeypatch):
    monkeypatch.setattr(http_base, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)  # a coordinator of a newer echo2 release
    message, elapsed_s = _join_fails(state, TOKEN, tmp_path)
    assert f"incompatible echo2 versions: this coordinator speaks protocol {PROTOCOL_VERSION + 1}" in message
    assert (f"the request speaks protocol {PROTOCOL_VERSION} (echo2 0.1.0)" in message
            and "same echo2 release" in message)
    assert elapsed_s < 5
    assert state.registry.workers == {}


def test_a_registration_from_a_newer_release_gets_426_naming_both(state):
    newer = PROTOCOL_VERSION + 1
    body = {"protocol": newer, "release": "9.9.9", "kind": "register", "engine": "hf", "some_new_field": 1}

    async def scenario(session, url):
        return await _post(session, url, "/v1/register", body)

    status, reply = run_with_server(state, scenario)
    assert status == 426
    # the error says what this protocol changed, so an operator knows what the other side lacks
    assert (f"this coordinator speaks protocol {PROTOCOL_VERSION} (echo2 0.1.0) (protocol {PROTOCOL_VERSION}: "
            f"{PROTOCOL_CHANGES[PROTOCOL_VERSION]}), the request speaks protocol {newer} (echo2 9.9.9)"
            in reply["error"])


def test_a_wrong_url_is_reported_within_seconds_and_the_worker_gives_up(tmp_path):
    """The real command: each failed attempt is logged with the URL, the error and the next
    retry delay; after coordinator_unreachable_s without an answer it exits non-zero saying
    what to check."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "echo2", "worker", "--coordinator", NOBODY, "--set", "coordinator_unreachable_s=2"],
        capture_output=True, text=True, timeout=60, env=_env(),
    )
    elapsed_s = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    err = result.stderr
    assert f"contacting the coordinator at {NOBODY}" in err
    assert f"cannot reach the coordinator: GET {NOBODY}/v1/broadcast_config: ClientConnectorError" in err
    assert "next try in 0.2 s" in err and "next try in 0.4 s" in err
    assert "echo2 worker: error: no answer from the coordinator at http://127.0.0.1:1 for" in err
    assert "check that the coordinator is running" in err
    assert elapsed_s < 30  # interpreter and torch import included; the give-up itself takes 2 s


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "ECHO2_AUTH_TOKEN": TOKEN}


def _checks(state, cfg: WorkerConfig, token: str = TOKEN, url: str | None = None) -> dict[str, tuple[str, str]]:
    async def body(served_url):
        results = await run_checks(cfg, url or served_url, token)
        return {r.name: (r.status, r.detail) for r in results}

    return _with_coordinator(state, body)


def test_check_passes_for_a_reachable_worker(state):
    checks = _checks(state, WorkerConfig())
    assert {name: status for name, (status, _) in checks.items()} == \
        {"reach": "ok", "protocol": "ok", "auth": "ok", "relay": "ok"}
    assert "peers can pull weights from it" in checks["relay"][1]
    assert state.registry.workers == {}  # checking joins nothing


def test_check_tells_a_worker_peers_cannot_reach_that_it_would_be_a_leaf(state):
    # its relay listens on 127.0.0.2 but it advertises 127.0.0.1 (the address it calls from), where
    # nothing answers: what a worker behind NAT or a firewall sees
    checks = _checks(state, WorkerConfig(relay_host="127.0.0.2", relay_advertise_host="127.0.0.1"))
    status, detail = checks["relay"]
    assert status == "failed"
    assert "cannot reach this worker's relay at http://127.0.0.1:" in detail
    assert "only be a broadcast leaf" in detail and "accepts_incoming=false" in detail
    # an address other than the one it calls from is not probed at all (the probe is no port scanner)
    other = _checks(state, WorkerConfig(relay_advertise_host="127.0.0.2"))["relay"]
    assert other[0] == "failed" and "would not probe http://127.0.0.2:" in other[1]
    assert "only dials back the caller's own address" in other[1] and "relay_advertise_host" in other[1]
    leaf = _checks(state, WorkerConfig(accepts_incoming=False))["relay"]
    assert leaf == ("ok", "accepts_incoming=false: a broadcast leaf, nothing to probe")


def test_check_names_a_wrong_token_a_wrong_url_and_another_version(state, monkeypatch):
    wrong_token = _checks(state, WorkerConfig(), token="not-the-join-token-0123456789")
    assert wrong_token["auth"][0] == "failed" and "join token" in wrong_token["auth"][1]
    assert wrong_token["relay"] == ("skipped", "the probe needs the join token")
    nobody = _checks(state, WorkerConfig(), url=NOBODY)
    assert nobody["reach"][0] == "failed" and "check that the coordinator is running" in nobody["reach"][1]
    assert {nobody[name][0] for name in ("protocol", "auth", "relay")} == {"skipped"}
    monkeypatch.setattr(server, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    other = _checks(state, WorkerConfig())
    assert other["protocol"] == ("failed", f"incompatible echo2 versions: this worker speaks protocol "
                                           f"{PROTOCOL_VERSION} (echo2 0.1.0) (protocol {PROTOCOL_VERSION}: "
                                           f"{PROTOCOL_CHANGES[PROTOCOL_VERSION]}), the coordinator speaks protocol "
                                           f"{PROTOCOL_VERSION + 1} (echo2 0.1.0). Run the same echo2 "
                                           "release on the coordinator, the learner and every worker")


def test_the_probe_dials_only_relay_addresses(state):
    async def scenario(session, url):
        return [await _post(session, url, "/v1/probe", {"relay_address": address})
                for address in ("http://127.0.0.1:1/admin", "file:///etc/passwd", "http://127.0.0.1")]

    replies = run_with_server(state, scenario)
    assert [status for status, _ in replies] == [422, 422, 422]
    assert all("expected http://HOST:PORT" in reply["error"] for _, reply in replies)


def test_the_coordinator_logs_who_works_on_the_run():
    from echo2.coordinator.http.log_lines import describe

    joined = describe({"kind": "worker_registered", "worker_id": "w1", "engine": "hf", "price_per_hour": 0.5,
                       "relay_address": "", "source": "10.0.0.9"})
    assert joined[1] == "worker w1 joined from 10.0.0.9 (engine hf, $0.5/h, relay none: a broadcast leaf)"
    activation = {"kind": "activation", "active": ["w1", "w2"], "reason": "cheapest set covering demand",
                  "trigger": "w3 left", "changed": True}
    assert describe(activation)[1] == "active workers now w1, w2 after w3 left: cheapest set covering demand"
    assert describe({**activation, "changed": False}) is None  # re-decided, nothing changed: metrics only
    assert describe({"kind": "lease_requeued", "worker_id": "w1"}) is None


def test_quiet_keeps_only_warnings(capsys):
    import argparse
    import logging

    from echo2.cli.logs import setup_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("echo2").level)
    try:
        setup_logging(argparse.Namespace(quiet=True, log_level="info"))
        logging.getLogger("echo2.worker").info("an info line")
        logging.getLogger("echo2.worker").warning("a warning line")
        setup_logging(argparse.Namespace(quiet=False, log_level="debug"))
        logging.getLogger("echo2.learner").debug("a debug line")
        logging.getLogger("aiohttp.access").info("library noise")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("echo2").setLevel(saved[2])
    err = capsys.readouterr().err
    assert "a warning line" in err and "an info line" not in err
    assert "echo2.learner DEBUG a debug line" in err and "library noise" not in err


def test_a_worker_joins_again_when_a_restarted_coordinator_no_longer_knows_it(state, tmp_path):
    """A restarted coordinator has no registry: the worker's credential gets 401, and the worker
    registers again by itself instead of beating in vain."""
    async def body(url):
        worker = Worker(WorkerConfig(device="cpu", worker_id="w7"), url, TOKEN,
                        MetricsWriter(tmp_path / "m.jsonl", "worker"))
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await _until(lambda: "w7" in state.registry.workers)
            first = state.registry.workers["w7"].credential_digest
            state.registry.workers.clear()  # what a restart leaves: accepted work kept, the registry gone
            state.registry.credentials.clear()
            await _until(lambda: "w7" in state.registry.workers
                         and state.registry.workers["w7"].credential_digest != first)
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)

    _with_coordinator(state, body)


async def _until(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_messages_carry_the_current_protocol_version():
    from typing import get_args

    from echo2.protocol.messages import Message

    assert get_args(Message.model_fields["protocol"].annotation) == (PROTOCOL_VERSION,)
