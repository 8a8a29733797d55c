"""The coordinator's listening socket queues a fleet's connections while its event loop is busy
(`main.LISTEN_BACKLOG`): with aiohttp's default of 128 the kernel dropped the SYNs of 10,000
workers leaving at once, and each came back 1 s, 3 s or 7 s later."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

from echo2.config import RunConfig, validate
from echo2.coordinator.main import serve

CONNECTIONS = min(600, int(Path("/proc/sys/net/core/somaxconn").read_text()))
"""Well past aiohttp's default backlog, under the kernel's cap (net.core.somaxconn, 4096 by default)."""


def test_a_burst_of_connections_is_queued_while_the_loop_is_busy(tmp_path, tiny_model_dir):
    cfg = validate(RunConfig, {"run_dir": str(tmp_path / "run"), "model": {"source": str(tiny_model_dir)},
                               "warmstart": {"steps": 0}, "coordinator": {"auth_token": "test-token-0123456789"}})

    async def burst() -> int:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(cfg, stop))
        path = cfg.run_path / "coordinator.json"
        opened: list[socket.socket] = []
        try:
            while not path.is_file():
                assert not server.done(), server.exception()
                await asyncio.sleep(0.05)
            address = urlsplit(json.loads(path.read_text())["url"])
            # blocking connects from the loop's own thread: nothing is accepted meanwhile, so
            # every handshake waits in the listen queue (a full queue drops the SYN: timeout)
            for _ in range(CONNECTIONS):
                opened.append(socket.create_connection((address.hostname, address.port), timeout=0.5))
            return len(opened)
        finally:
            for sock in opened:
                sock.close()
            stop.set()
            await server

    assert asyncio.run(burst()) == CONNECTIONS
