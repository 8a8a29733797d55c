"""Each role can do its own job and nothing more (echo2.coordinator.parts.credentials), on a real
coordinator over loopback. Every case is one of the attacks a review found with a single shared
token: with only the join token a client publishes, takes the learner's batches, registers as
`origin`, or speaks for another worker. Publishes are checked against the pinned learner key and
the version sequence, and a refused one changes nothing."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest
from tests.unit.coordinator_helpers import FakeClock, make_state, past_slow_start, publish, version_info
from tests.unit.test_coordinator_http import AUTH, LEARNER, OPERATOR, _join, _post, run_with_server

from echo2.broadcast.signing import generate_private_key, public_key_hex, sign_manifest
from echo2.coordinator.parts.credentials import Secrets, coordinator_secrets, key_file
from echo2.coordinator.records.errors import RequestError
from echo2.protocol.messages import VersionInfo
from echo2.report.metrics import MetricsWriter, read_metrics
from echo2.rollout.follower import VersionFollower


async def _get(session, url, path, headers):
    async with session.get(url + path, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.fixture
def state(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    publish(state, 0)
    return state


def test_the_join_token_alone_cannot_act_as_the_learner_or_operator(state):
    forged = version_info(1).model_dump(mode="json")
    body = {"info": forged, "public_key_hex": state.versions.public_key_hex}

    async def scenario(session, url):
        return {
            "publish": (await _post(session, url, "/v1/publish", body, AUTH))[0],
            "batch": (await _post(session, url, "/v1/batch", {"step": 0, "wait_s": 0}, AUTH))[0],
            "reject": (await _post(session, url, "/v1/batch/reject", {"step": 0}, AUTH))[0],
            "state": (await _get(session, url, "/v1/state", AUTH))[0],
            "state as learner": (await _get(session, url, "/v1/state", LEARNER))[0],
            "batch as operator": (await _post(session, url, "/v1/batch", {"step": 0, "wait_s": 0}, OPERATOR))[0],
            "state as operator": (await _get(session, url, "/v1/state", OPERATOR))[0],
            "heartbeat with the learner token": (await _post(session, url, "/v1/heartbeat",
                                                             {"worker_id": "w1", "version": 0}, LEARNER))[0],
        }

    statuses = run_with_server(state, scenario)
    assert statuses == {"publish": 401, "batch": 401, "reject": 401, "state": 401, "state as learner": 401,
                        "batch as operator": 401, "state as operator": 200, "heartbeat with the learner token": 401}
    assert state.versions.current == 0


def test_a_worker_speaks_only_for_itself(state):
    async def scenario(session, url):
        victim = await _join(session, url, "victim")
        past_slow_start(state, "victim")
        await _post(session, url, "/v1/lease", {"worker_id": "victim", "version": 0, "max_tasks": 2}, victim)
        attacker = await _join(session, url, "attacker")
        return {
            "register as origin": (await _post(session, url, "/v1/register",
                                               {"worker_id": "origin", "engine": "hf"}))[0],
            "take over a live id": (await _post(session, url, "/v1/register",
                                                {"worker_id": "victim", "engine": "hf", "relay_address": "http://evil"}))[0],
            "leave as the victim": (await _post(session, url, "/v1/leave", {"worker_id": "victim"}, attacker))[0],
            "heartbeat as the victim": (await _post(session, url, "/v1/heartbeat",
                                                    {"worker_id": "victim", "version": 0}, attacker))[0],
            "lease as the victim": (await _post(session, url, "/v1/lease", {"worker_id": "victim", "version": 0},
                                                attacker))[0],
            "no credential": (await _post(session, url, "/v1/heartbeat", {"worker_id": "victim", "version": 0}, {}))[0],
            "the join token as a credential": (await _post(session, url, "/v1/heartbeat",
                                                           {"worker_id": "victim", "version": 0}, AUTH))[0],
            "its own heartbeat": (await _post(session, url, "/v1/heartbeat", {"worker_id": "attacker", "version": 0},
                                              attacker))[0],
        }

    statuses = run_with_server(state, scenario)
    assert statuses == {"register as origin": 422, "take over a live id": 409, "leave as the victim": 403,
                        "heartbeat as the victim": 403, "lease as the victim": 403, "no credential": 401,
                        "the join token as a credential": 401, "its own heartbeat": 200}
    victim = state.registry.workers["victim"]
    assert victim.alive and victim.relay_address == "" and "origin" not in state.registry.workers
    assert sum(1 for lease in state.leases_book.leases.values() if lease.worker_id == "victim") == 2  # leases untouched


def test_an_evicted_worker_joins_again_with_a_new_credential(state, tmp_path):
    async def scenario(session, url):
        old = await _join(session, url, "w1")
        state.registry.workers["w1"].alive = False  # timed out
        new = await _join(session, url, "w1")
        return (await _post(session, url, "/v1/heartbeat", {"worker_id": "w1", "version": 0}, old))[0], \
            (await _post(session, url, "/v1/heartbeat", {"worker_id": "w1", "version": 0}, new))[0]

    assert run_with_server(state, scenario) == (401, 200)


def test_publishes_follow_the_pinned_key_and_the_version_sequence(state, tmp_path, tiny_model_dir):
    before = (state.versions.latest, state.store.get_meta("latest"))
    stranger = generate_private_key()
    with pytest.raises(RequestError, match="this run's learner key is"):
        state.learner_desk.publish(_signed(1, stranger), public_key_hex(stranger.public_key()))
    with pytest.raises(RequestError, match="refused: manifest signed by key"):
        state.learner_desk.publish(_signed(1, stranger), state.versions.public_key_hex)  # claims the learner's key
    with pytest.raises(RequestError, match="skips ahead: the newest is 0, so the next is 1"):
        publish(state, 10**9)
    assert (state.versions.latest, state.store.get_meta("latest")) == before  # refusals change nothing
    publish(state, 1)
    publish(state, 0)  # a resumed learner replaying an older version: nothing changes
    assert state.versions.current == 1
    moved = version_info(1).model_copy(update={"origin_url": "http://learner:2"})
    # the newest again, from a restarted learner's origin
    state.learner_desk.publish(moved, state.versions.public_key_hex)
    assert state.versions.current == 1 and state.versions.latest.origin_url == "http://learner:2"
    state.store.close()
    revived = make_state(tmp_path, tiny_model_dir, FakeClock())  # the pin survives a restart
    with pytest.raises(RequestError, match="this run's learner key is"):
        revived.learner_desk.publish(_signed(2, stranger), public_key_hex(stranger.public_key()))
    publish(revived, 2)
    assert revived.versions.current == 2


def _signed(version: int, key) -> VersionInfo:
    honest = version_info(version)
    manifest = honest.signed.unverified_manifest()
    return honest.model_copy(update={"signed": sign_manifest(manifest, key)})


def test_a_worker_keeps_the_first_learner_key_it_was_told(tmp_path):
    metrics = tmp_path / "m.jsonl"
    follower = VersionFollower(SimpleNamespace(worker_id="w0"), MetricsWriter(metrics, "worker"))
    follower.note(None, None, "a" * 64)
    follower.note(None, None, "b" * 64)
    follower.note(None, None, "b" * 64)
    assert follower.learner_key == "a" * 64
    refused = [r for r in read_metrics(metrics) if r["kind"] == "learner_key_refused"]
    assert len(refused) == 1 and refused[0]["announced"] == "b" * 16


def test_secrets_come_from_the_environment_or_private_files(tmp_path, monkeypatch):
    for name in ("AUTH_TOKEN", "LEARNER_TOKEN", "OPERATOR_TOKEN"):
        monkeypatch.delenv(f"ECHO2_{name}", raising=False)
        monkeypatch.delenv(f"ECHO2_{name}_FILE", raising=False)
    secrets = coordinator_secrets(tmp_path, "join-token-0123456789")
    for role in ("learner", "operator"):
        path = key_file(tmp_path, role)
        assert path.read_text().strip() == getattr(secrets, role)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert coordinator_secrets(tmp_path, "join-token-0123456789") == secrets  # stable across restarts
    monkeypatch.setenv("ECHO2_LEARNER_TOKEN", "from-the-environment-0123")
    assert coordinator_secrets(tmp_path, "join-token-0123456789").learner == "from-the-environment-0123"
    with pytest.raises(ValueError, match="must differ"):
        Secrets(join="same-token-0123456789", learner="same-token-0123456789", operator="other-token-0123456")
    with pytest.raises(ValueError, match="shorter than 16"):
        Secrets(join="short", learner="learner-token-0123456", operator="operator-token-0123456")


def test_the_learner_without_its_token_says_where_to_get_it(tmp_path, monkeypatch, capsys):
    from echo2.cli import main
    from echo2.config.run import RunConfig
    from echo2.config.run_dir import write_resolved

    monkeypatch.delenv("ECHO2_LEARNER_TOKEN", raising=False)
    monkeypatch.delenv("ECHO2_LEARNER_TOKEN_FILE", raising=False)
    write_resolved(RunConfig(run_dir=str(tmp_path / "run")))
    assert main(["learner", "--run-dir", str(tmp_path / "run"), "--coordinator", "http://127.0.0.1:9"]) == 2
    assert "no learner token: set $ECHO2_LEARNER_TOKEN" in capsys.readouterr().err
