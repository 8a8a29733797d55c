"""What a worker says of its own work: a line when a lease comes back empty for a new reason (the
same reason many times a second would drown the log), and one throughput line every
`log_every_s` with what it did, or why it did not."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from echo2.rollout.waits import wait_either

log = logging.getLogger("echo2.worker")


class ActivityLog:
    def __init__(self, stats: dict, every_s: float) -> None:
        self.stats, self.every_s = stats, every_s
        self.refusals: Counter[str] = Counter()  # lease refusals since the last throughput line
        self.last_refusal = ""

    def refused(self, reason: str) -> None:
        reason = reason or "refused (see the warning above)"
        self.refusals[reason.split(":")[0]] += 1
        if reason != self.last_refusal:
            log.info("no prompts leased: %s", reason)
            self.last_refusal = reason

    async def run(self, stop: asyncio.Event, version: Callable[[], int], active: Callable[[], bool]) -> None:
        last, last_at = dict(self.stats), time.monotonic()
        while not stop.is_set():
            await wait_either(stop, stop, timeout_s=self.every_s)
            now = time.monotonic()
            rollouts, tokens = (self.stats[k] - last[k] for k in ("rollouts", "tokens"))
            refused = ", ".join(f"{n}x {why}" for why, n in self.refusals.most_common(3)) or "none"
            log.info("last %.0f s: %d rollouts (%.1f/s), %d tokens (%.0f/s), version %d, %s; leases refused: %s",
                     now - last_at, rollouts, rollouts / (now - last_at), tokens, tokens / (now - last_at),
                     version(), "active" if active() else "idle (not activated)", refused)
            last, last_at = dict(self.stats), now
            self.refusals.clear()
