"""The worker's line to the coordinator: calls retried with backoff through transient failures,
the time of the last answer, and giving up (with the fix to try) once the coordinator has been
silent for `coordinator_unreachable_s`."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from pydantic import BaseModel

from echo2.config.worker import WorkerConfig
from echo2.protocol.http import TransientError, call
from echo2.rollout.diagnosis import WorkerFailed, unreachable_fix
from echo2.rollout.waits import wait_either

log = logging.getLogger("echo2.worker")

# backoff between retries of a call that failed in transit: from the first to the longest pause
FIRST_RETRY_S, LONGEST_RETRY_S = 0.2, 5.0


class Stopping(Exception):
    """Raised out of a retry loop when the worker has been asked to stop."""


class CoordinatorLink:
    """The real echo2.protocol.links.WorkerLink."""

    def __init__(self, url: str, cfg: WorkerConfig, stop: asyncio.Event) -> None:
        self.url, self.cfg, self.stop = url, cfg, stop
        self.session: aiohttp.ClientSession | None = None  # the worker's, set once it opens
        self.last_contact_s = time.monotonic()  # of any answer from the coordinator

    async def once(self, method: str, path: str, body: BaseModel | None, *, timeout_s: float,
                   token: str | None = None) -> str:
        """One call; an answer counts as contact. Failures propagate."""
        text = await call(self.session, method, self.url + path, body, timeout_s=timeout_s, token=token)
        self.last_contact_s = time.monotonic()
        return text

    async def retrying(self, method: str, path: str, body: BaseModel | None, *, token: str | None = None) -> str:
        """Transient failures are logged and retried with backoff until the worker is told to
        stop (Stopping) or has not reached the coordinator for cfg.coordinator_unreachable_s
        (WorkerFailed); refusals propagate. A busy coordinator's Retry-After is followed (it
        answered: that is contact)."""
        delay_s = FIRST_RETRY_S
        while True:
            try:
                return await self.once(method, path, body, timeout_s=self.cfg.request_timeout_s, token=token)
            except TransientError as exc:
                if self.stop.is_set():
                    raise Stopping from None
                wait_s = delay_s
                if exc.retry_after_s is not None:
                    self.last_contact_s, wait_s = time.monotonic(), max(delay_s, exc.retry_after_s)
                self.check_reachable(exc, next_try_s=wait_s)
                await wait_either(self.stop, self.stop, timeout_s=wait_s)
                delay_s = min(2 * delay_s, LONGEST_RETRY_S)

    def check_reachable(self, exc: TransientError, *, next_try_s: float) -> None:
        """Log a failed call; give up once the coordinator has been silent too long."""
        silent_s, limit_s = time.monotonic() - self.last_contact_s, self.cfg.coordinator_unreachable_s
        if silent_s > limit_s:
            raise WorkerFailed(f"no answer from the coordinator at {self.url} for {silent_s:.0f} s "
                               f"(coordinator_unreachable_s={limit_s:g}; last error: {exc}): "
                               f"{unreachable_fix(self.url)}")
        log.warning("cannot reach the coordinator: %s; next try in %.1f s (giving up after %.0f s without an "
                    "answer)", exc, next_try_s, limit_s)
