"""Slowloris: clients that open connections and then crawl. Children that never read cannot
hold a relay's stream slots (each write has a deadline), and half-sent requests do not stop the
coordinator from answering everyone else."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from tests.unit.coordinator_helpers import FakeClock, make_state, publish
from tests.unit.test_coordinator_http import run_with_server

from echo2.broadcast import Origin, fetch_version, generate_private_key
from echo2.broadcast.lab.payload import synthetic_payload
from echo2.broadcast.topology import plan_broadcast
from echo2.broadcast.wire import CHUNKS_PATH, STATUS_PATH
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.broadcast import OriginInfo, PeerInfo

TOKEN = "slow-clients-token-0123456789"
# two stream slots, short timeouts: a stuck child must be dropped within a couple of seconds
# (min_rate_bytes_per_s 1 MB/s: a 1 MiB chunk's write deadline is 1 s + 1.05 s; loopback moves the
# honest child's 64 MiB far faster)
CONFIG = BroadcastConfig(chunk_bytes=1 << 20, max_children=2, connect_timeout_s=1.0, stall_timeout_s=1.0,
                         keepalive_interval_s=0.2, progress_timeout_s=3.0, announce_wait_s=1.0,
                         retry_backoff_s=0.2, source_rounds=10, min_rate_bytes_per_s=1_000_000)


async def _never_reading_child(host: str, port: int, version: int):
    """Asks for the whole stream, then never reads a byte (its socket buffers fill up)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write((f"GET {CHUNKS_PATH}?version={version}&start=0 HTTP/1.1\r\nHost: {host}\r\n"
                  f"Authorization: Bearer {TOKEN}\r\n\r\n").encode())
    await writer.drain()
    return reader, writer


async def _streams(url: str) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(url + STATUS_PATH, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            return (await resp.json())["streams"]


def test_children_that_never_read_lose_their_slots_to_honest_ones():
    async def scenario():
        origin = Origin(generate_private_key(), CONFIG, auth_token=TOKEN)
        await origin.start()
        stuck = []
        try:
            data = synthetic_payload(64 << 20, seed=1)  # far more than loopback socket buffers hold
            signed = origin.publish(1, data)
            port = int(origin.url.rsplit(":", 1)[1])
            stuck = [await _never_reading_child("127.0.0.1", port, 1) for _ in range(CONFIG.max_children)]
            assert await _streams(origin.url) == CONFIG.max_children  # both slots taken, writes blocked
            deadline = time.monotonic() + 30
            while await _streams(origin.url) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            freed_s = time.monotonic() - deadline + 30
            plan = plan_broadcast(1, OriginInfo(url=origin.url, upload_bytes_per_s=1e9),
                                  [PeerInfo(peer_id="honest", url="", upload_bytes_per_s=1e9,
                                            download_bytes_per_s=1e9, reachable=False)], CONFIG)
            started = time.monotonic()
            result = await fetch_version(signed, plan.for_worker("honest"), public_key=origin.public_key,
                                         held_version=None, config=CONFIG, relay=None, auth_token=TOKEN,
                                         worker_id="honest")
            return result, freed_s, time.monotonic() - started
        finally:
            for _, writer in stuck:
                writer.close()
            await origin.stop()

    result, freed_s, fetch_s = asyncio.run(asyncio.wait_for(scenario(), 90))
    # the stuck children were cut at their write deadline (stall_timeout_s + a chunk at
    # min_rate_bytes_per_s: 2.05 s here), freeing the slots; an honest child then got the version
    assert freed_s < 12
    assert len(result.payload) == 64 << 20 and fetch_s < 20


def test_half_sent_requests_do_not_stop_the_coordinator(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    publish(state, 0)

    async def scenario(session, url):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        crawlers = []
        for _ in range(200):  # each sends part of its headers, then nothing
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Le")
            await writer.drain()
            crawlers.append(writer)
        try:
            started = time.monotonic()
            async with session.get(url + "/healthz") as resp:
                status = resp.status
            return status, time.monotonic() - started
        finally:
            for writer in crawlers:
                writer.close()

    status, elapsed_s = run_with_server(state, scenario)
    assert status == 200 and elapsed_s < 2.0
