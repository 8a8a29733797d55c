"""TLS on real loopback servers: the coordinator, the learner's origin and a worker's relay serve
https with certificates from `echo2 certs`; a version travels origin -> relay -> worker over TLS;
a client holding the wrong CA, or dialing a name the certificate lacks, fails at once with a
message naming the URL, the failure and the fix; plain HTTP off loopback is warned about."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from echo2.broadcast import Origin, RelayServer, fetch_version, generate_private_key
from echo2.broadcast.fetch import new_session
from echo2.broadcast.lab.payload import synthetic_payload
from echo2.broadcast.topology import plan_broadcast
from echo2.broadcast.wire import BroadcastFailed
from echo2.config.base import validate
from echo2.config.broadcast import BroadcastConfig
from echo2.config.run import RunConfig
from echo2.config.tls import TLSConfig
from echo2.config.worker import WorkerConfig
from echo2.coordinator.main import serve
from echo2.protocol import certs
from echo2.protocol.broadcast import OriginInfo, PeerInfo
from echo2.protocol.http import TransientError, call
from echo2.protocol.tls import TLSError, base_url, client_context, server_context, warn_plain_url
from echo2.report.metrics import MetricsWriter
from echo2.rollout.worker import Worker

TOKEN = "tls-test-token-0123456789"
CONFIG = BroadcastConfig(chunk_bytes=4096, connect_timeout_s=2.0, stall_timeout_s=2.0, retry_backoff_s=0.05,
                         source_rounds=3)


def run(coro, timeout_s: float = 30.0):
    """A hang fails the test instead of stalling the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Our CA with a loopback certificate (what `echo2 run` uses) and one for a remote worker's
    address only; a second, unrelated CA."""
    root = tmp_path_factory.mktemp("pki")
    certs.make_ca(root / "ca")
    certs.make_ca(root / "other")
    certs.issue(root / "ca", "local", ["127.0.0.1", "localhost"])
    certs.issue(root / "ca", "worker-3", ["10.0.0.7"])
    ca = str(root / "ca" / certs.CA_CERT)
    return {
        "root": root,
        "local": TLSConfig(cert_file=str(root / "ca/local.pem"), key_file=str(root / "ca/local.key"), ca_file=ca),
        "far": TLSConfig(cert_file=str(root / "ca/worker-3.pem"), key_file=str(root / "ca/worker-3.key"), ca_file=ca),
        "client": TLSConfig(ca_file=ca),
        "wrong_ca": TLSConfig(ca_file=str(root / "other" / certs.CA_CERT)),
    }


async def _fetch_through(origin: Origin, relay: RelayServer, client: TLSConfig, payload: bytes):
    """w0 pulls version 1 from the origin into its relay, then w1 pulls it from w0's relay."""
    signed = origin.publish(1, payload)
    peers = [PeerInfo(peer_id=w, url=url, upload_bytes_per_s=1e8, download_bytes_per_s=1e8, reachable=bool(url))
             for w, url in (("w0", relay.url), ("w1", ""))]
    plan = plan_broadcast(1, OriginInfo(url=origin.url, upload_bytes_per_s=1e8), peers, CONFIG)
    results = []
    for worker, into in (("w0", relay), ("w1", None)):
        session = new_session(CONFIG, client_context(client))
        try:
            results.append(await fetch_version(signed, plan.for_worker(worker), public_key=origin.public_key,
                                               held_version=None, config=CONFIG, relay=into, auth_token=TOKEN,
                                               worker_id=worker, session=session))
        finally:
            await session.close()
    return results


def test_a_version_travels_origin_to_relay_to_worker_over_tls(pki):
    async def scenario():
        origin = Origin(generate_private_key(), CONFIG, auth_token=TOKEN, ssl_context=server_context(pki["local"]))
        relay = RelayServer(CONFIG, auth_token=TOKEN, ssl_context=server_context(pki["local"]))
        await origin.start()
        await relay.start()
        try:
            assert origin.url.startswith("https://127.0.0.1:") and relay.url.startswith("https://127.0.0.1:")
            payload = synthetic_payload(10 * 4096 + 100, seed=0)
            first, second = await _fetch_through(origin, relay, pki["client"], payload)
            assert first.payload == payload and second.payload == payload
            assert first.metrics.bytes_by_source == {"origin": len(payload)}
            assert second.metrics.bytes_by_source == {"w0": len(payload)}  # through the TLS relay
        finally:
            await relay.stop()
            await origin.stop()

    run(scenario())


def _sources_fail(pki, server: TLSConfig, client: TLSConfig) -> str:
    async def scenario():
        relay = RelayServer(CONFIG, auth_token=TOKEN, ssl_context=server_context(server))
        await relay.start()
        origin = Origin(generate_private_key(), CONFIG, auth_token=TOKEN, ssl_context=server_context(server))
        await origin.start()
        try:
            started = time.monotonic()
            with pytest.raises(BroadcastFailed) as failed:
                await _fetch_through(origin, relay, client, synthetic_payload(10_000, seed=1))
            # refused sources are not retried: no source_rounds of backoff, no hang
            assert time.monotonic() - started < 5
            return str(failed.value)
        finally:
            await origin.stop()
            await relay.stop()

    return run(scenario())


def test_a_worker_with_the_wrong_ca_fails_fast_and_says_why(pki):
    message = _sources_fail(pki, pki["local"], pki["wrong_ca"])
    assert "https://127.0.0.1:" in message and "TLS certificate verification failed" in message
    assert "unable to get local issuer certificate" in message and "set tls.ca_file" in message


def test_a_certificate_without_the_dialed_address_is_refused(pki):
    message = _sources_fail(pki, pki["far"], pki["client"])  # issued for 10.0.0.7, served on 127.0.0.1
    assert "mismatch" in message and "does not name '127.0.0.1'" in message and "echo2 certs issue" in message


@pytest.fixture
def coordinator_cfg(pki, tmp_path, tiny_model_dir, monkeypatch):
    for name in ("LEARNER_TOKEN", "OPERATOR_TOKEN"):
        monkeypatch.delenv(f"ECHO2_{name}", raising=False)
    return validate(RunConfig, {"run_dir": str(tmp_path / "run"), "model": {"source": str(tiny_model_dir)},
                                "warmstart": {"steps": 0}, "coordinator": {"auth_token": TOKEN},
                                "tls": pki["local"].model_dump()})


async def _with_coordinator(cfg: RunConfig, scenario):
    stop = asyncio.Event()
    server = asyncio.create_task(serve(cfg, stop))
    path = cfg.run_path / "coordinator.json"
    try:
        while not path.is_file():
            assert not server.done(), server.exception()
            await asyncio.sleep(0.05)
        return await scenario(json.loads(path.read_text())["url"])
    finally:
        stop.set()
        await server


def test_the_coordinator_serves_https_and_a_worker_with_the_wrong_ca_stops_with_the_fix(pki, coordinator_cfg):
    async def scenario(url):
        assert url.startswith("https://127.0.0.1:")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(pki["client"]))) as s:
            assert json.loads(await call(s, "GET", url + "/healthz", None, timeout_s=10))
        plain = url.replace("https://", "http://")
        async with aiohttp.ClientSession() as s:
            with pytest.raises(TransientError, match="is this URL https://"):
                await call(s, "GET", plain + "/healthz", None, timeout_s=10)
        worker = Worker(WorkerConfig(worker_id="w0", tls=pki["wrong_ca"]), url, TOKEN, MetricsWriter(None, "worker"))
        with pytest.raises(TLSError) as refused:
            await asyncio.wait_for(worker.run(asyncio.Event()), 10)  # not retried as if transient
        return str(refused.value)

    message = run(_with_coordinator(coordinator_cfg, scenario))
    assert message.startswith("https://127.0.0.1:") and "TLS certificate verification failed" in message
    assert "set tls.ca_file to the CA that signed" in message


def test_private_keys_others_can_read_are_refused(pki, tmp_path):
    key = tmp_path / "k.key"
    key.write_bytes(open(pki["local"].key_file, "rb").read())
    for mode, refused in ((0o644, True), (0o604, True), (0o640, False), (0o600, False)):
        key.chmod(mode)
        tls = TLSConfig(cert_file=pki["local"].cert_file, key_file=str(key))
        if refused:
            with pytest.raises(ValueError, match=f"accessible to every user.*mode {mode:04o}.*chmod 600"):
                server_context(tls)
        else:
            assert server_context(tls) is not None


def test_unusable_certificates_keys_and_cas_are_named(pki, tmp_path):
    mismatched = TLSConfig(cert_file=pki["local"].cert_file, key_file=pki["far"].key_file)
    with pytest.raises(ValueError, match="could not be loaded.*made together"):
        server_context(mismatched)
    with pytest.raises(ValueError, match="tls.cert_file is set but tls.key_file is not"):
        TLSConfig(cert_file=pki["local"].cert_file)
    with pytest.raises(ValueError, match="tls.ca_file=.*could not be loaded"):
        client_context(TLSConfig(ca_file=str(tmp_path / "missing.pem")))
    expired = _expired_certificate(tmp_path)
    with pytest.raises(ValueError, match="is valid from .* not now"):
        server_context(expired)
    assert TLSConfig(ca_file="rel/ca.pem").ca_file.startswith("/")  # children of `echo2 run` find it too


def _expired_certificate(tmp_path) -> TLSConfig:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=10))
            .not_valid_after(now - datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    (tmp_path / "old.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "old.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    (tmp_path / "old.key").chmod(0o600)
    return TLSConfig(cert_file=str(tmp_path / "old.pem"), key_file=str(tmp_path / "old.key"))


def test_plain_http_off_loopback_is_warned_about(pki, caplog):
    caplog.set_level(logging.WARNING, logger="echo2.tls")

    async def scenario():
        for ssl_context in (server_context(pki["local"]), None):
            relay = RelayServer(CONFIG, host="0.0.0.0", ssl_context=ssl_context)
            await relay.start()
            await relay.stop()

    run(scenario())
    bind_warnings = [r.getMessage() for r in caplog.records if "serves plain HTTP on 0.0.0.0" in r.getMessage()]
    assert len(bind_warnings) == 1  # the plain relay only, not the TLS one
    caplog.clear()
    for url in ("https://10.9.9.9:1", "http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1",
                "http://0.0.0.0:1", "http://10.9.9.9:1", "http://10.9.9.9:2"):
        warn_plain_url(url, "a test server")
    assert [r.getMessage().split(" over")[0] for r in caplog.records] == ["calling a test server at http://10.9.9.9:1"]
    assert [base_url(h, 8470, tls=True) for h in ("0.0.0.0", "::1", "10.0.0.7")] == [
        "https://127.0.0.1:8470", "https://[::1]:8470", "https://10.0.0.7:8470"]


def test_the_coordinator_probes_an_https_relay_against_its_ca(pki):
    """`echo2 worker --check` asks the coordinator to dial the worker's relay back; a TLS relay
    is checked against the coordinator's CA like any other client would (a failed handshake is
    one more "not reachable": the probe's answer does not tell failures apart)."""
    from echo2.coordinator.parts.probe import NOT_REACHED, probe_relay

    async def scenario():
        relay = RelayServer(CONFIG, auth_token=TOKEN, ssl_context=server_context(pki["local"]))
        await relay.start()
        try:
            address = base_url("127.0.0.1", relay.port, tls=True)
            trusted = await probe_relay(address, pki["local"])
            wrong_ca = await probe_relay(address, pki["wrong_ca"])
            return trusted, wrong_ca
        finally:
            await relay.stop()

    trusted, wrong_ca = run(scenario())
    assert trusted == (True, "the relay answered")
    assert wrong_ca == (False, NOT_REACHED) and "certificate" in wrong_ca[1].lower()
