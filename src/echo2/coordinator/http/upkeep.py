"""The coordinator's own loops, beside the requests it answers: the sweep of silent workers and
overdue leases (which excuses the coordinator's own stalls) with the activation decisions and
the gauges; the news crier, which tells every open news line of a new version and each worker
whose activation changed; the keepalive of the news lines; and the load watch, which measures
how late the event loop runs and stretches spare heartbeats (and refuses registrations) while
it is behind, so that rollouts and the learner's batches keep their pace."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from echo2.coordinator.http.base import HISTORY_KEY, METRICS_KEY, NEWS_KEY, STATE_KEY, write_events
from echo2.coordinator.http.news import NEWS_KEEPALIVE_S
from echo2.coordinator.http.view import snapshot, stats_event

log = logging.getLogger("echo2.coordinator")

SWEEP_INTERVAL_S = 0.25
"""How often overdue leases are looked for (silent workers once a second: WorkerDesk.sweep)."""
STALL_S = 0.5
"""A sweep woken this much later than asked means the event loop was blocked (by us)."""
LOAD_TICK_S = 0.05
"""The load watch's clock: how late this tick runs is the loop's lag."""
LAG_DECAY = 0.9
"""The lag remembered decays by this each tick (a burst is forgotten in about a second)."""
LOAD_STRETCHES = ((0.2, 4.0), (0.05, 2.0))
"""Loop lag (s) -> how much longer spare heartbeats are told to wait: a loop 50 ms late doubles
the interval, 200 ms late quadruples it and refuses registrations for a while
(desks.workers.OVERLOADED)."""


async def housekeeping(app: web.Application) -> None:
    state = app[STATE_KEY]
    loop = asyncio.get_running_loop()
    next_control = loop.time()
    while True:
        slept_from = loop.time()
        await asyncio.sleep(SWEEP_INTERVAL_S)
        # woken late: the loop itself was blocked, and the heartbeats that came meanwhile are
        # still unread; the coordinator's own stall must not evict the workers that sent them
        stall_s = loop.time() - slept_from - SWEEP_INTERVAL_S
        if stall_s > STALL_S:
            state.fleet_desk.excuse_stall(stall_s)
        decided = state.fleet_desk.control_due
        state.fleet_desk.sweep()
        if loop.time() >= next_control:
            state.fleet_desk.control()
            state.events.append(stats_event(state))
            next_control = loop.time() + state.cfg.activation.control_period_s
            decided = True
        write_events(app)
        if decided:
            app[NEWS_KEY].announce(activity=True)


async def cry_news(app: web.Application) -> None:
    """Tell the open news lines what changed: every line a newly published version (with its
    fetch and sources), the workers whose activation changed theirs. What changes during a
    round is told in the next (each round tells the news as of its start)."""
    state, lines = app[STATE_KEY], app[NEWS_KEY]
    while True:
        version, activity = await lines.next_round()
        desk = state.worker_desk
        if version:
            await lines.tell((w, desk.news_of(w)) for w in lines.open_for())
        elif activity:
            await lines.tell_changed_activity(state.controller.is_active, desk.news_of)


async def keep_lines_alive(app: web.Application) -> None:
    while True:
        await asyncio.sleep(NEWS_KEEPALIVE_S)
        await app[NEWS_KEY].keep_alive()


async def watch_load(app: web.Application) -> None:
    """Measure how late the loop runs and tell the worker desk how much to stretch heartbeats."""
    desk = app[STATE_KEY].worker_desk
    loop = asyncio.get_running_loop()
    lag_s = 0.0
    while True:
        asked = loop.time()
        await asyncio.sleep(LOAD_TICK_S)
        lag_s = max(loop.time() - asked - LOAD_TICK_S, lag_s * LAG_DECAY)
        stretch = next((factor for threshold, factor in LOAD_STRETCHES if lag_s > threshold), 1.0)
        if stretch != desk.load_stretch:
            log.info("event loop %.0f ms behind: heartbeats stretched %gx%s", lag_s * 1e3, stretch,
                     ", registrations deferred" if stretch >= LOAD_STRETCHES[0][1] else "")
            desk.load_stretch = stretch


async def run_upkeep(app: web.Application):
    """Start the loops with the app; on shutdown stop them and write the final state."""
    tasks = [asyncio.create_task(loop(app)) for loop in (housekeeping, cry_news, keep_lines_alive, watch_load)]
    stop_history = asyncio.Event()
    history = asyncio.create_task(app[HISTORY_KEY].follow(stop_history))
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stop_history.set()
    await history  # its file read in a thread: let it finish before the files close
    app[METRICS_KEY].write("coordinator_final", **snapshot(app[STATE_KEY]))
