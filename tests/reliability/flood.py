"""A flood of bad requests against a live coordinator, for reliability tests and the chaos
benchmark: wrong and missing tokens, another role's routes, malformed and oversized bodies,
submissions for tasks never leased, fabricated log-probs, reports against the learner's origin,
a burst of registrations. Every request is one a hostile client could send; none may succeed in
changing what the run trains, and none may crash or stall the coordinator.

Requests come from their own loopback address (127.0.0.2 by default), as a different host's
would, so the per-address registration limit meets the flood and not the honest workers."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import Counter

import aiohttp

WRONG = {"Authorization": "Bearer not-a-token-0123456789"}


def _cases(join: dict, credential: dict, worker_id: str, seq: int) -> list[tuple[str, str, str, object, dict]]:
    """(name, method, path, body, headers); body None/bytes/dict."""
    completion = {"token_ids": [5, 6], "logprobs": [-100.0, -0.5]}
    return [
        ("wrong token", "POST", "/v1/register", {"worker_id": f"f{seq}", "engine": "hf"}, WRONG),
        ("no token", "POST", "/v1/heartbeat", {"worker_id": worker_id, "version": 0}, {}),
        ("join token takes a batch", "POST", "/v1/batch", {"step": 0, "wait_s": 0}, join),
        ("join token publishes", "POST", "/v1/publish", {"info": {}, "public_key_hex": "00"}, join),
        ("worker reads state", "GET", "/v1/state", None, credential),
        ("malformed json", "POST", "/v1/lease", b"{not json", credential),
        ("wrong schema", "POST", "/v1/lease", {"worker_id": worker_id, "version": "x"}, credential),
        ("oversized body", "POST", "/v1/heartbeat", b"x" * (9 << 20), credential),
        ("rollout never leased", "POST", "/v1/rollout",
         {"worker_id": worker_id, "lease_id": f"L{seq:016x}", "version": 0, "gen_time_s": 0.1,
          "completions": [completion] * 4}, credential),
        ("speak for another worker", "POST", "/v1/leave", {"worker_id": "w0"}, credential),
        ("report the origin", "POST", "/v1/bad_peer",
         {"report": {"version": 0, "reporter_id": worker_id, "peer_id": "origin", "chunk_index": 0,
                     "reason": "corrupt_chunk"}}, credential),
        ("registration burst", "POST", "/v1/register", {"worker_id": f"flood-{seq}", "engine": "hf"}, join),
    ]


async def _request(session, url, method, path, body, headers) -> int:
    data = body if isinstance(body, bytes) else (json.dumps(body) if body is not None else None)
    try:
        async with session.request(method, url + path, data=data, headers={"Content-Type": "application/json",
                                                                         **headers}) as resp:
            await resp.read()
            return resp.status
    except (aiohttp.ClientError, TimeoutError):
        return 0  # refused at the connection (e.g. the oversized body cut off mid-upload)


async def flood(url: str, join_token: str, duration_s: float, requests_per_s: float = 20.0,
                source_host: str = "127.0.0.2", stop: threading.Event | None = None) -> dict:
    """Send the bad requests round-robin for `duration_s`; returns counts by outcome. A "report
    the origin" reply of 200 is accepted but changes nothing (the origin is never dropped);
    registrations in the burst that get through are real (idle) workers the coordinator forgets.
    `stop` (set from another thread) ends it early."""
    outcomes: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(local_addr=(source_host, 0))
    timeout = aiohttp.ClientTimeout(total=10)
    join = {"Authorization": f"Bearer {join_token}"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        reply = await _request_json(session, url, "/v1/register", {"worker_id": "flooder", "engine": "hf"}, join)
        credential = {"Authorization": f"Bearer {reply['credential']}"}
        deadline = time.monotonic() + duration_s
        for seq in itertools.count():
            if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                break
            for name, method, path, body, headers in _cases(join, credential, "flooder", seq):
                status = await _request(session, url, method, path, body, headers)
                statuses[f"{name}: {status}"] += 1
                outcomes["sent"] += 1
                if status == 0:
                    outcomes["connection_failed"] += 1  # cut off mid-request, or the run has ended
                elif 400 <= status < 500:
                    outcomes["rejected"] += 1
                elif status >= 500:
                    outcomes["server_errors"] += 1
                elif name in ("report the origin", "registration burst"):
                    outcomes["accepted_without_effect"] += 1
                else:
                    outcomes["accepted"] += 1
                await asyncio.sleep(1.0 / requests_per_s)
    return {**outcomes, "by_case": dict(sorted(statuses.items()))}


async def _request_json(session, url, path, body, headers) -> dict:
    async with session.post(url + path, data=json.dumps(body),
                            headers={"Content-Type": "application/json", **headers}) as resp:
        resp.raise_for_status()
        return await resp.json()
