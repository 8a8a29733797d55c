"""Waiting on asyncio events without polling: sleep until one of two events, and run a request
that an event may cut short (a long poll given up when the worker stops, or when it has
something newer to ask)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_either(event: asyncio.Event, stop: asyncio.Event, timeout_s: float, *, consume: bool = True) -> None:
    """Sleep until `event` or `stop` is set or the timeout passes; consume `event` (clear it)
    unless told not to."""
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())}
    _, pending = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for waiter in pending:
        waiter.cancel()
    if consume and event is not stop:
        event.clear()


async def unless_set(event: asyncio.Event, work: Awaitable[T]) -> tuple[bool, T | None]:
    """Run `work` until it finishes or `event` is set, whichever comes first: (True, its result),
    or (False, None) having cancelled it. Its exceptions propagate. An event already set
    cancels it at once."""
    job = asyncio.ensure_future(work)
    if event.is_set():
        job.cancel()
    watcher = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not job.done():
            job.cancel()
    if job.cancelled() or not job.done():
        await asyncio.gather(job, return_exceptions=True)
        return False, None
    return True, job.result()
