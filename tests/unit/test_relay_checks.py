"""Bad-peer reports checked by the coordinator itself, end to end: a real coordinator app (its
checker running beside the requests), real relays on loopback holding the version the learner
published, and reports posted by workers with their credentials. A relay whose chunk really
fails its hash is dropped for everyone; two late joiners with standing that report an honest
relay leave it a source for everyone, and the check's verdict counts against them."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from tests.unit.coordinator_helpers import FakeClock, make_state
from tests.unit.test_coordinator_http import TOKEN, _post, _serve

from echo2.broadcast import fetch_version, generate_private_key
from echo2.broadcast.faults import Fault, FaultKind
from echo2.broadcast.lab.payload import synthetic_payload
from echo2.broadcast.origin import Origin
from echo2.broadcast.relay import RelayServer
from echo2.broadcast.signing import public_key_hex
from echo2.config.broadcast import BroadcastConfig
from echo2.policy.trust import REPORT_STANDING_GROUPS
from echo2.protocol.messages import VersionInfo
from echo2.protocol.release import RELEASE

CHUNK = 4096
CONFIG = BroadcastConfig(chunk_bytes=CHUNK)
CORRUPT_CHUNK = 2


async def _relays_holding(state, origin: Origin, signed, relays: dict[str, RelayServer]) -> None:
    """Each relay fetches the version as the coordinator's plan says (in tree order)."""
    for worker, relay in relays.items():
        assignment = state.versions.dissemination.plan.for_worker(worker)
        await fetch_version(signed, assignment, public_key=origin.public_key, held_version=None, config=CONFIG,
                            relay=relay, auth_token=TOKEN, worker_id=worker)


async def _join(session, url: str, worker_id: str, relay_address: str = "") -> dict[str, str]:
    status, reply = await _post(session, url, "/v1/register", {"worker_id": worker_id, "engine": "hf",
                                                                "relay_address": relay_address, "release": RELEASE})
    assert status == 200, reply
    return {"Authorization": f"Bearer {reply['credential']}"}


async def _sources(session, url: str, worker_id: str, auth: dict[str, str]) -> list[str]:
    status, reply = await _post(session, url, "/v1/heartbeat", {"worker_id": worker_id, "version": -1}, headers=auth)
    assert status == 200, reply
    return [s["peer_id"] for s in reply["assignment"]["sources"]]


def _events(metrics_path, kind: str) -> list[dict]:
    lines = metrics_path.read_text().splitlines() if metrics_path.exists() else []
    return [e for e in map(json.loads, lines) if e.get("kind") == kind]


async def _report(session, url, metrics_path, reporter: str, peer: str, auth: dict) -> tuple[str, dict | None]:
    """Post a report; its effect, and the check's event once the checker is done with it."""
    checks_before = len(_events(metrics_path, "relay_checked"))
    report = {"version": 0, "reporter_id": reporter, "peer_id": peer, "url": "", "chunk_index": CORRUPT_CHUNK,
              "reason": "corrupt_chunk", "detail": "sha256 mismatch"}
    status, reply = await _post(session, url, "/v1/bad_peer", {"report": report}, headers=auth)
    assert status == 200, reply
    effect = _events(metrics_path, "bad_peer")[-1]["avoided_by"]
    if effect != "check":
        return effect, None
    deadline = time.monotonic() + 10.0
    while len(_events(metrics_path, "relay_checked")) == checks_before:
        assert time.monotonic() < deadline, "the coordinator never checked the report"
        await asyncio.sleep(0.05)
    return effect, _events(metrics_path, "relay_checked")[-1]


async def _scenario(tmp_path, model_dir) -> None:
    clock = FakeClock()
    state = make_state(tmp_path, model_dir, clock, config={"broadcast": {"chunk_bytes": CHUNK}})
    key = generate_private_key()
    origin = Origin(key, CONFIG, auth_token=TOKEN)
    relays = {"w0": RelayServer(CONFIG, auth_token=TOKEN),
              "w1": RelayServer(CONFIG, auth_token=TOKEN, fault=Fault(FaultKind.CORRUPT, at_chunk=CORRUPT_CHUNK))}
    await origin.start()
    for relay in relays.values():
        await relay.start()
    metrics_path = tmp_path / "metrics.jsonl"
    runner, url = await _serve(state, metrics_path=metrics_path)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
            auth = {w: await _join(session, url, w, relay.url) for w, relay in relays.items()}
            signed = origin.publish(0, synthetic_payload(int(6.5 * CHUNK), seed=1))
            info = VersionInfo(version=0, signed=signed, origin_url=origin.url, published_at=time.time())
            state.learner_desk.publish(info, public_key_hex(key.public_key()))
            await _relays_holding(state, origin, signed, relays)
            for worker in relays:  # they say they hold it: late joiners are sent to them
                await _post(session, url, "/v1/heartbeat", {"worker_id": worker, "version": 0}, headers=auth[worker])
            clock.now += 5.0  # the live peers are seen afresh (a view is kept a second)
            for late in ("late0", "late1", "late2"):
                auth[late] = await _join(session, url, late)
                assert {"w0", "w1"} <= set(await _sources(session, url, late, auth[late]))
                for _ in range(REPORT_STANDING_GROUPS):  # groups of theirs accepted: reports with standing
                    state.groups.trust.submitted(late, 1.0, accepted=True)

            # the corrupt relay, reported once: the coordinator's own fetch of the chunk confirms it
            effect, checked = await _report(session, url, metrics_path, "late0", "w1", auth["late0"])
            assert effect == "check" and checked["verdict"] == "bad" and checked["peer_id"] == "w1"
            assert state.versions.dissemination.suspects == {"w1"}
            assert "w1" not in await _sources(session, url, "late2", auth["late2"])

            # two late joiners report the honest relay: the check finds the chunk genuine
            effect, checked = await _report(session, url, metrics_path, "late1", "w0", auth["late1"])
            assert effect == "check" and checked["verdict"] == "good" and checked["refuted"] == ["late1"]
            assert await _report(session, url, metrics_path, "late2", "w0", auth["late2"]) == ("refuted", None)
            assert state.versions.dissemination.reports.refuted == {"late1": 1, "late2": 1}
            assert "w0" in await _sources(session, url, "late0", auth["late0"])  # still a source for everyone
            assert "w0" not in await _sources(session, url, "late1", auth["late1"])  # but for the reporter
            # a refuted reporter's reports ask for no check again, nor count against it twice
            assert await _report(session, url, metrics_path, "late1", "w0", auth["late1"]) == ("reporter", None)
            assert state.versions.dissemination.reports.refuted["late1"] == 1
    finally:
        await runner.cleanup()
        for relay in relays.values():
            await relay.stop()
        await origin.stop()


def test_reports_drop_a_relay_only_when_the_coordinators_own_check_confirms_them(tmp_path, tiny_model_dir):
    asyncio.run(asyncio.wait_for(_scenario(tmp_path, tiny_model_dir), timeout=60))
