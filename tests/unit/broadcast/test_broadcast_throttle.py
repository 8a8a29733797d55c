"""The emulated link: transfers sharing one Throttle never exceed its rate in aggregate."""

from __future__ import annotations

import asyncio

import pytest

from echo2.broadcast.throttle import Throttle


def test_shared_throttle_paces_concurrent_transfers():
    async def scenario() -> float:
        throttle = Throttle(bytes_per_s=4 << 20, burst_bytes=64 << 10)  # 4 MiB/s, 64 KiB bucket
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def transfer() -> None:
            for _ in range(8):
                await throttle.consume(64 << 10)

        await asyncio.gather(transfer(), transfer())  # 1 MiB in all, through one link
        return loop.time() - started

    elapsed_s = asyncio.run(scenario())
    # 1 MiB at 4 MiB/s is 0.25 s; the bucket lets one burst through early
    assert elapsed_s >= 0.25 - (64 << 10) / (4 << 20) - 0.01


def test_rate_must_be_positive():
    with pytest.raises(ValueError, match="> 0"):
        Throttle(bytes_per_s=0)
