"""`echo2 worker --check`: before renting time on a machine, find out whether this worker can
join its run. One line per check, ok or failed, with the fix:

- reach:    the coordinator answers at the URL given;
- protocol: it speaks this worker's echo2 protocol;
- auth:     it accepts this worker's join token;
- relay:    it can dial this worker's relay address back (else the worker is a broadcast leaf);
            the coordinator dials only the address this machine calls it from.

A check that depends on a failed one is reported as skipped."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from echo2.config.base import validate
from echo2.config.broadcast import BroadcastConfig
from echo2.config.worker import WorkerConfig
from echo2.protocol.http import RefusedError, TransientError, call
from echo2.protocol.messages import ProbeRequest, ProbeResponse, protocol_mismatch
from echo2.rollout.diagnosis import refusal_fix, unreachable_fix
from echo2.rollout.weights import WeightReceiver

CHECK_TIMEOUT_S = 10.0
"""One check's request: a coordinator answers in milliseconds; the relay probe itself waits up
to coordinator.probe.RESOLVE_TIMEOUT_S (3 s) for a name to resolve and PROBE_TIMEOUT_S (5 s) for
an address that never answers."""


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "failed" or "skipped"
    detail: str

    def line(self) -> str:
        return f"{self.status:<7} {self.name:<8} {self.detail}"


async def run_checks(cfg: WorkerConfig, url: str, token: str) -> list[Check]:
    url = url.rstrip("/")
    async with aiohttp.ClientSession() as session:
        reach, health = await _reach(session, url)
        if reach.status != "ok":
            return [reach, *(Check(name, "skipped", "the coordinator is unreachable")
                             for name in ("protocol", "auth", "relay"))]
        protocol = _protocol(health)
        auth, broadcast = await _auth(session, url, token)
        if auth.status != "ok":
            return [reach, protocol, auth, Check("relay", "skipped", "the probe needs the join token")]
        return [reach, protocol, auth, await _relay(session, cfg, url, token=token, broadcast=broadcast)]


async def _reach(session: aiohttp.ClientSession, url: str) -> tuple[Check, dict]:
    started = time.perf_counter()
    try:
        text = await call(session, "GET", url + "/healthz", None, timeout_s=CHECK_TIMEOUT_S)
        health = json.loads(text)
    except TransientError as exc:
        return Check("reach", "failed", f"{exc}; fix: {unreachable_fix(url)}"), {}
    except RefusedError as exc:
        return Check("reach", "failed", f"{url}/healthz answered HTTP {exc.status}: is {url} an echo2 coordinator "
                                        "(http://HOST:PORT, no path)?"), {}
    except ValueError:
        return Check("reach", "failed", f"{url}/healthz answered something that is not JSON: is {url} an echo2 "
                                        "coordinator?"), {}
    elapsed_ms = 1000 * (time.perf_counter() - started)
    return Check("reach", "ok", f"the coordinator at {url} answered in {elapsed_ms:.0f} ms"), health


def _protocol(health: dict) -> Check:
    sent = health.get("protocol") if isinstance(health, dict) else None
    problem = protocol_mismatch(sent, health.get("release", "") if isinstance(health, dict) else "",
                                here="this worker", there="the coordinator")
    if problem:
        return Check("protocol", "failed", problem)
    return Check("protocol", "ok", f"protocol {sent} (echo2 {health.get('release', '?')}) on both sides")


async def _auth(session: aiohttp.ClientSession, url: str, token: str) -> tuple[Check, BroadcastConfig]:
    path = "/v1/broadcast_config"
    try:
        text = await call(session, "GET", url + path, None, timeout_s=CHECK_TIMEOUT_S, token=token)
        broadcast = validate(BroadcastConfig, json.loads(text), source="coordinator broadcast config")
    except RefusedError as exc:
        return Check("auth", "failed", refusal_fix(exc, url, path)), BroadcastConfig()
    except (TransientError, ValueError) as exc:
        return Check("auth", "failed", f"{path}: {exc}"), BroadcastConfig()
    return Check("auth", "ok", "the coordinator accepts this worker's join token"), broadcast


async def _relay(session: aiohttp.ClientSession, cfg: WorkerConfig, url: str, *, token: str,
                 broadcast: BroadcastConfig) -> Check:
    if not cfg.accepts_incoming:
        return Check("relay", "ok", "accepts_incoming=false: a broadcast leaf, nothing to probe")
    receiver = WeightReceiver(cfg, broadcast, token=token, coordinator_url=url, control=session)
    address = await receiver.start()  # the relay this worker would run, at the address it would announce
    try:
        text = await call(session, "POST", url + "/v1/probe", ProbeRequest(relay_address=address),
                          timeout_s=CHECK_TIMEOUT_S, token=token)
        reply = ProbeResponse.model_validate_json(text)
    except RefusedError as exc:  # e.g. 403: the address is not the one this machine calls from
        return Check("relay", "failed", f"the coordinator would not probe {address}: {exc.message}")
    except (TransientError, ValueError) as exc:
        return Check("relay", "failed", f"could not have {address} probed: {exc}")
    finally:
        await receiver.stop()
    if reply.reachable:
        return Check("relay", "ok", f"the coordinator reached this worker's relay at {address}: peers can pull "
                                    "weights from it")
    return Check("relay", "failed", (
        f"the coordinator cannot reach this worker's relay at {address} ({reply.detail}); as it is this worker "
        "would only be a broadcast leaf. Fix: behind NAT or a firewall, set accepts_incoming=false; otherwise "
        "open a port P and set relay_host=0.0.0.0, relay_port=P and relay_advertise_host=<this machine's "
        "public address>"))


def check(cfg: WorkerConfig, url: str, token: str) -> int:
    """Print one line per check; 0 when every check passed."""
    results = asyncio.run(run_checks(cfg, url, token))
    for result in results:
        print(result.line(), flush=True)
    return 0 if all(r.status == "ok" for r in results) else 1
