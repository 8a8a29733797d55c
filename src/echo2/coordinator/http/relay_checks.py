"""The coordinator's checks of reported relays, one at a time beside the requests it answers:
each fetches the chunk a bad-peer report names from the reported peer's relay address, with the
relay token every worker presents (the join token), and hands the verdict to the worker desk
(`parts.relay_reports` says what it does). A check follows no redirect, reads one frame header
and at most one chunk of the size the signed manifest gives, and gives up after
`broadcast.report_check_timeout_s`; the reporter never sees its verdict."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from echo2.broadcast.chunk_check import check_chunk
from echo2.broadcast.wire import bearer_headers
from echo2.coordinator.http.base import RELAY_TOKEN_KEY, STATE_KEY, TLS_KEY, write_events
from echo2.protocol import tls

CHECKS_WAKE_KEY = web.AppKey("relay_checks_wake", asyncio.Event)
CHECKER_PEER_ID = "coordinator"
"""What the checks call themselves to a relay (its per-child byte accounting; never authorization)."""


def wake_checks(app: web.Application) -> None:
    """A report asked for a check: the checker runs it next."""
    app[CHECKS_WAKE_KEY].set()


async def check_reported_relays(app: web.Application) -> None:
    state, wake = app[STATE_KEY], app[CHECKS_WAKE_KEY]
    headers = bearer_headers(app[RELAY_TOKEN_KEY], CHECKER_PEER_ID)
    timeout_s = state.cfg.broadcast.report_check_timeout_s
    async with aiohttp.ClientSession(connector=tls.connector(app[TLS_KEY])) as session:
        while True:
            check = state.versions.dissemination.reports.next_check()
            if check is None:
                wake.clear()
                await wake.wait()
                continue
            peer = state.registry.workers.get(check.peer_id)
            if peer is None or not peer.relay_address:
                verdict, seen = "unreachable", "no relay address"
            else:
                verdict, seen = await check_chunk(session, peer.relay_address, check.manifest, check.chunk_index,
                                                  headers=headers, timeout_s=timeout_s)
            state.worker_desk.relay_checked(check, verdict, seen)
            write_events(app)
