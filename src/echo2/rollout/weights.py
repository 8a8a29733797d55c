"""How a worker receives policy versions: through the peer-assisted broadcast. It runs a relay
server (peers pull verified chunks from it while it is still receiving), verifies each version's
signed manifest against the learner's key, pulls from the sources the coordinator assigned with
failover, and reports peers that send bad bytes. With `tls` set the relay serves https and
sources are verified against `tls.ca_file`."""

from __future__ import annotations

import aiohttp

from echo2.broadcast.fetch import fetch_version, new_session
from echo2.broadcast.metrics import FetchResult
from echo2.broadcast.relay import RelayServer
from echo2.broadcast.signing import load_public_key, public_key_from_hex
from echo2.broadcast.throttle import Throttle
from echo2.config.broadcast import BroadcastConfig
from echo2.config.worker import WorkerConfig
from echo2.protocol.broadcast import Assignment, BadPeerReport
from echo2.protocol.http import call
from echo2.protocol.messages import BadPeerRequest, VersionInfo
from echo2.protocol.tls import base_url, client_context, server_context


class WeightReceiver:
    def __init__(self, cfg: WorkerConfig, broadcast: BroadcastConfig, *, token: str, coordinator_url: str,
                 control: aiohttp.ClientSession) -> None:
        self.cfg, self.broadcast, self.token = cfg, broadcast, token
        self.coordinator_url, self.control = coordinator_url, control
        # one shared link for downloads and relay uploads, like an access line (emulation only)
        self.throttle = Throttle(cfg.bandwidth_bps / 8) if cfg.emulate_bandwidth else None
        self.relay: RelayServer | None = None
        self.pinned_key = load_public_key(cfg.learner_public_key) if cfg.learner_public_key else None
        self.worker_id = ""
        self.session: aiohttp.ClientSession | None = None  # made by `start`, on the worker's loop
        self.measured_rate_bytes_per_s: float | None = None
        """What this worker received its recent versions at (an EWMA over versions): the
        slow-sender cutoff follows it rather than the declared rates the plan was built from."""

    async def start(self) -> str:
        """Start the relay (unless behind NAT) and return the address peers should pull from."""
        self.session = new_session(self.broadcast, client_context(self.cfg.tls))
        if not self.cfg.accepts_incoming:
            return ""
        context = server_context(self.cfg.tls)
        self.relay = RelayServer(self.broadcast, auth_token=self.token, host=self.cfg.relay_host,
                                 port=self.cfg.relay_port, throttle=self.throttle, ssl_context=context)
        await self.relay.start()
        return base_url(self.cfg.relay_advertise_host or self.cfg.relay_host, self.relay.port, tls=context is not None)

    async def stop(self) -> None:
        await self.session.close()
        if self.relay is not None:
            await self.relay.stop()

    async def fetch(self, info: VersionInfo, assignment: Assignment, held: int, announced_key: str) -> FetchResult:
        """The verified payload of `info.version`. Raises ManifestRejected (bad signature or not
        newer: never retried), BroadcastFailed (every source failed) or FetchAborted."""
        key = self.pinned_key or _announced(announced_key)
        result = await fetch_version(
            info.signed, assignment, public_key=key, held_version=held if held >= 0 else None,
            config=self.broadcast, relay=self.relay, auth_token=self.token, worker_id=self.worker_id,
            report_bad_peer=self._report, session=self.session, throttle=self.throttle,
            measured_rate_bytes_per_s=self.measured_rate_bytes_per_s,
        )
        self._measure(result.metrics)
        return result

    def _measure(self, metrics) -> None:
        began = metrics.first_chunk_at or metrics.started_at
        if metrics.verified_at > began and metrics.total_bytes:
            rate = metrics.total_bytes / (metrics.verified_at - began)
            previous = self.measured_rate_bytes_per_s
            self.measured_rate_bytes_per_s = rate if previous is None else 0.5 * rate + 0.5 * previous

    def bytes_relayed(self, version: int) -> int:
        return self.relay.bytes_sent(version) if self.relay is not None else 0

    def bytes_relayed_total(self) -> int:
        return self.relay.bytes_sent_total() if self.relay is not None else 0

    async def _report(self, report: BadPeerReport) -> None:
        await call(self.control, "POST", self.coordinator_url + "/v1/bad_peer", BadPeerRequest(report=report),
                   timeout_s=self.broadcast.report_timeout_s)


def _announced(key_hex: str):
    if not key_hex:
        raise ValueError("no learner public key yet: the coordinator has not seen a publish")
    return public_key_from_hex(key_hex)
