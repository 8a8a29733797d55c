"""A shared link of fixed rate, for EMULATING slow workers on one machine (local runs only).

Every transfer through one `Throttle` (a worker's downloads and its relay uploads share it, like
one access link) is delayed so the aggregate never exceeds `bytes_per_s`. It only delays, it
never drops, so the protocol sees a slow peer exactly as it would on a real slow link. Real
deployments leave it off; the netns lab shapes real links with tc instead.
"""

from __future__ import annotations

import asyncio


class Throttle:
    def __init__(self, bytes_per_s: float, burst_bytes: int = 256 << 10) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"throttle rate must be > 0 bytes/s, got {bytes_per_s}")
        self.bytes_per_s = bytes_per_s
        # up to one burst may go out at once, as a tbf bucket allows
        self.burst_s = burst_bytes / bytes_per_s
        self._free_at = 0.0

    async def consume(self, nbytes: int) -> None:
        """Account `nbytes` just moved; sleep until the link would have carried them."""
        now = asyncio.get_running_loop().time()
        start = max(now - self.burst_s, self._free_at)
        self._free_at = start + nbytes / self.bytes_per_s
        delay = self._free_at - now
        if delay > 0:
            await asyncio.sleep(delay)
