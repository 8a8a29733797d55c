"""What an untrusted worker sends cannot forge the coordinator's console or turn its relay probe
into a port scanner (issue 24, findings 1 and 2), against a real coordinator on loopback: an
engine or relay address with control characters is refused at registration naming the field,
every console line built from worker fields is one line with its control characters escaped,
and the probe dials only the caller's own address, presents no credential and gives one answer
for every kind of failure. (False relay reports, finding 3: tests/unit/test_dissemination.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket

import pytest
from aiohttp import web
from tests.unit.coordinator_helpers import FakeClock, make_state, publish
from tests.unit.test_coordinator_http import TOKEN, _post, run_with_server

from echo2.broadcast.relay import RelayServer
from echo2.broadcast.wire import STATUS_PATH
from echo2.config.broadcast import BroadcastConfig
from echo2.coordinator.http.log_lines import describe
from echo2.coordinator.parts.probe import NOT_REACHED, REACHED, own_address
from echo2.coordinator.records import events as ev
from echo2.coordinator.records import relay_events
from echo2.protocol.messages import PROTOCOL_VERSION

EVIL = "w1\nFAKE LINE: worker w9 joined\r\x1b[31m\x00\x07\x7f\x9b[2J\u2028end"
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Linux routes all of 127/8 to lo, so 127.0.0.2 is a listening address that is not the caller's
# (a client on loopback calls from 127.0.0.1)
OTHER = "127.0.0.2"


@pytest.fixture
def state(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    publish(state, 0)
    return state


# ---- finding 1: log injection ----------------------------------------------------------------


def test_an_engine_with_control_characters_is_refused_naming_the_field(state):
    async def scenario(session, url):
        bad = await _post(session, url, "/v1/register", {"worker_id": "w1", "engine": "hf\nFAKE LINE"})
        good = await _post(session, url, "/v1/register", {"worker_id": "w2", "engine": "vllm-0.9+cpu"})
        return bad, good

    (status, reply), good = run_with_server(state, scenario)
    assert status == 422 and "engine='hf\\nFAKE LINE'" in reply["error"] and "\n" not in reply["error"]
    assert good[0] == 200 and set(state.registry.workers) == {"w2"}


@pytest.mark.parametrize("address", [
    "http://10.0.0.1:80\nFAKE LINE",
    "http://10.0.0.1\n:80",  # urlsplit drops the newline silently: http://10.0.0.1:80 to it
    "http://10.0.0.1:80/admin",
    "http://10.0.0.1:80?x=1",
    "http://10.0.0.1:99999",
    "http://10.0.0.1:port",
    "http://10.0.0.1 :80",
    "ftp://10.0.0.1:80",
])
def test_a_bad_relay_address_is_refused_at_registration_naming_field_value_and_fix(state, address):
    async def scenario(session, url):
        return await _post(session, url, "/v1/register", {"worker_id": "w1", "engine": "hf", "relay_address": address})

    status, reply = run_with_server(state, scenario)
    assert status == 422, reply
    assert "relay_address" in reply["error"] and repr(address) in reply["error"] and "fix:" in reply["error"]
    assert state.registry.workers == {} and not [e for e in state.events if e.kind == "worker_registered"]


def test_a_relay_address_or_none_still_registers(state):
    async def scenario(session, url):
        return [(await _post(session, url, "/v1/register", {"worker_id": f"w{i}", "engine": "hf",
                                                             "relay_address": address}))[0]
                for i, address in enumerate(["", "http://10.0.0.1:80", "https://relay.example.org:8471/"])]

    assert run_with_server(state, scenario) == [200, 200, 200]
    assert state.registry.workers["w0"].relay_address == ""  # a broadcast leaf


def _evil_event(cls: type[ev.Event]) -> dict:
    """The record of a `cls` event with control characters in every string (and list of strings)."""
    values = {"str": EVIL, "int": 3, "float": 0.5, "bool": True, "list[str]": [EVIL, EVIL],
              "float | None": 0.5, "dict[str, float]": {}}
    return cls(**{f.name: values[f.type] for f in dataclasses.fields(cls)}).record()


@pytest.mark.parametrize("cls", [ev.WorkerRegistered, ev.WorkerLeft, ev.WorkerLost, ev.VersionPublished,
                                 ev.Activation, relay_events.BadPeer, relay_events.RelayChecked])
def test_every_console_line_from_worker_fields_is_one_line_with_control_characters_escaped(cls):
    level, text = describe(_evil_event(cls))
    assert CONTROL.search(text) is None, repr(text)
    assert text.splitlines() == [text]
    assert "w1\\nFAKE LINE: worker w9 joined\\r\\x1b[31m\\x00\\x07\\x7f\\x9b[2J\\u2028end" in text


def test_the_console_lines_read_as_before_for_honest_fields():
    joined = ev.WorkerRegistered(worker_id="w1", engine="hf", price_per_hour=0.5, relay_address="http://10.0.0.1:80",
                                 source="10.0.0.9").record()
    assert describe(joined)[1] == "worker w1 joined from 10.0.0.9 (engine hf, $0.5/h, relay http://10.0.0.1:80)"
    report = dict(version=4, reporter_id="w2", peer_id="w1", url="", chunk_index=0, form="full", got_sha256="",
                  reason="corrupt_chunk", detail="")
    ignored = describe(relay_events.BadPeer(**report, took_effect=False, avoided_by="none").record())[1]
    assert ignored.startswith("bad peer reported: w1 by w2 (version 4, chunk 0): no effect")
    checking = describe(relay_events.BadPeer(**report, took_effect=True, avoided_by="check").record())[1]
    assert checking == ("bad peer reported: w1 by w2 (version 4, chunk 0): the reporter is not sent to it again; "
                        "the coordinator fetches the chunk itself to check")
    checked = dict(peer_id="w1", version=4, form="full", chunk_index=0, seen="sha256 " + "ab" * 32,
                   reporters=["w2", "w3"])
    caught = describe(relay_events.RelayChecked(**checked, verdict="bad", refuted=[]).record())[1]
    assert caught == f"checked w1's chunk 0 of version 4 (sha256 {'ab' * 32}): bad bytes; no one is sent to it now"
    genuine = describe(relay_events.RelayChecked(**checked, verdict="good", refuted=["w2", "w3"]).record())[1]
    assert genuine.endswith("genuine; the reports of w2, w3 count against them")


# ---- finding 2: the probe as a port scanner --------------------------------------------------


class _Listener:
    """A TCP server on loopback that counts connections and answers each with `reply` (None:
    an aiohttp app instead, `app`)."""

    def __init__(self, host: str = "127.0.0.1", reply: bytes = b"", app: web.Application | None = None) -> None:
        self.host, self.reply, self.app = host, reply, app
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def __aenter__(self) -> str:
        if self.app is not None:
            self.runner = web.AppRunner(self.app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, self.host, 0)
            await site.start()
            self.port = self.runner.addresses[0][1]
        else:
            self.server = await asyncio.start_server(self._answer, self.host, 0)
            self.port = self.server.sockets[0].getsockname()[1]
        return f"http://{self.host}:{self.port}"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(self.reply)
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    async def __aexit__(self, *exc) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self.runner is not None:
            await self.runner.cleanup()


def _recording_relay(seen: list[dict[str, str]], body: dict | None = None, status: int = 200) -> web.Application:
    """An HTTP server answering every path, recording each request's headers."""
    async def anything(request: web.Request) -> web.Response:
        seen.append({"path": request.path, **request.headers})
        if status == 302:
            raise web.HTTPFound("http://127.0.0.1:1/elsewhere")
        return web.json_response(body if body is not None else {"relay": "echo2"}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


def _probe(session, url, address):
    return _post(session, url, "/v1/probe", {"relay_address": address})


def test_the_probe_refuses_another_address_and_dials_nothing(state):
    listener = _Listener(OTHER, b"SSH-2.0-OpenSSH_9.6\r\n")

    async def scenario(session, url):
        async with listener as other:
            replies = [await _probe(session, url, other), await _probe(session, url, "http://no-such-host.invalid:22")]
            return replies, listener.connections

    replies, connections = run_with_server(state, scenario)
    for status, reply in replies:
        assert status == 403 and "the probe only dials back the caller's own address" in reply["error"], reply
        assert "(127.0.0.1)" in reply["error"] and "fix:" in reply["error"]
    assert connections == 0


def test_the_probe_answers_alike_for_a_closed_port_an_ssh_server_and_any_other_server(state):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now

    async def scenario(session, url):
        async with _Listener(reply=b"SSH-2.0-OpenSSH_9.6\r\n") as ssh, \
                _Listener(app=_recording_relay([], {"status": "ok"})) as web_server, \
                _Listener(app=_recording_relay([], status=401)) as locked, \
                _Listener(app=_recording_relay([], status=302)) as redirect:
            addresses = [f"http://127.0.0.1:{closed_port}", ssh, web_server, locked, redirect,
                         web_server.replace("http://", "https://")]  # a TLS handshake with a plain server
            return [await _probe(session, url, address) for address in addresses]

    replies = run_with_server(state, scenario)
    assert replies == [(200, {"protocol": PROTOCOL_VERSION, "kind": "probe_result", "reachable": False,
                              "detail": NOT_REACHED})] * 6


def test_the_probe_reaches_a_relay_at_the_callers_own_address_with_no_credential(state):
    seen: list[dict[str, str]] = []

    async def scenario(session, url):
        relay = RelayServer(BroadcastConfig(), auth_token=TOKEN)
        await relay.start()
        try:
            async with _Listener(app=_recording_relay(seen)) as fake:
                named = fake.replace("127.0.0.1", "localhost")  # a name that resolves to the caller
                return [await _probe(session, url, address) for address in (relay.url, fake, named)]
        finally:
            await relay.stop()

    replies = run_with_server(state, scenario)
    assert [(status, reply["reachable"], reply["detail"]) for status, reply in replies] == [(200, True, REACHED)] * 3
    assert [request["path"] for request in seen] == [STATUS_PATH] * 2
    assert all("Authorization" not in request for request in seen)


def test_a_relay_tells_a_caller_without_the_token_only_that_it_is_a_relay():
    async def scenario():
        import aiohttp

        relay = RelayServer(BroadcastConfig(), auth_token=TOKEN)
        await relay.start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(relay.url + STATUS_PATH) as resp:
                    anonymous = await resp.json()
                async with session.get(relay.url + STATUS_PATH, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                    peer = await resp.json()
                async with session.get(relay.url + "/v1/broadcast/chunks?version=0") as resp:
                    chunks = resp.status
            return anonymous, peer, chunks
        finally:
            await relay.stop()

    anonymous, peer, chunks = asyncio.run(scenario())
    assert anonymous == {"relay": "echo2"}
    assert peer["relay"] == "echo2" and "held_version" in peer and "streams" in peer
    assert chunks == 401  # chunks still need the token


def test_the_callers_own_address_is_recognised_in_every_spelling():
    async def scenario():
        return [await own_address("http://127.0.0.1:80", "::ffff:127.0.0.1"),
                await own_address("http://localhost:80", "127.0.0.1"),
                await own_address("http://[::1]:80", "::1")]

    assert asyncio.run(scenario()) == ["127.0.0.1", "127.0.0.1", "::1"]
