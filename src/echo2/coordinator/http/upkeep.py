"""The coordinator's own loops, beside the requests it answers: the sweep of silent workers and
overdue leases (which excuses the coordinator's own stalls) with the activation decisions and
the gauges; the news criers, which tell open news lines of a new version (the active workers at
once, `version_news_to`; the idle ones by turns, `cry_idle_news`) and each worker whose
activation changed; the keepalive of the news lines; and the load watch, which measures
how late the event loop runs and stretches spare heartbeats (and refuses registrations) while
it is behind, so that rollouts and the learner's batches keep their pace."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web

from echo2.coordinator.http.base import HISTORY_KEY, METRICS_KEY, NEWS_KEY, STATE_KEY, write_events
from echo2.coordinator.http.news import NEWS_KEEPALIVE_S, WRITES_PER_SLICE, NewsLines
from echo2.coordinator.http.relay_checks import check_reported_relays
from echo2.coordinator.http.view import snapshot, stats_event
from echo2.coordinator.parts.news_order import tree_order

if TYPE_CHECKING:
    from echo2.coordinator.state import CoordinatorState

log = logging.getLogger("echo2.coordinator")

SWEEP_INTERVAL_S = 0.25
"""How often overdue leases are looked for (silent workers once a second: WorkerDesk.sweep)."""
STALL_S = 0.5
"""A sweep woken this much later than asked means the event loop was blocked (by us)."""
LONG_GC_PASS_S = 0.1
"""A full garbage collection longer than this is logged."""
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
        app[COLLECTIONS_KEY].freeze_survivors()
        if decided:
            app[NEWS_KEY].announce(activity=True)


async def cry_news(app: web.Application) -> None:
    """Tell the open news lines what changed: a newly published version (with its fetch and
    sources) to the active workers and the relays they pull from at once, then to the idle
    workers by turns (`cry_idle_news`); the workers whose activation changed theirs. What
    changes during a round is told in the next (each round tells the news as of its start)."""
    state, lines = app[STATE_KEY], app[NEWS_KEY]
    while True:
        version, activity = await lines.next_round()
        desk = state.worker_desk
        if version:
            await plan_newest(app)
            lines.pieces.clear()  # the JSON of the last plan's objects: let them go
            await lines.tell((w, desk.news_of(w)) for w in version_news_to(state, lines))
            lines.idle_due.set()
        elif activity:
            await lines.tell_changed_activity(state.controller.is_active, desk.news_of)


def version_news_to(state: CoordinatorState, lines: NewsLines) -> list[str]:
    """Who hears of a new version as soon as it is published: the active workers (the learner's
    next batches wait on their fetch), each after the relays it pulls from (`parts.news_order`)."""
    is_active = state.controller.is_active
    active = [w for w in lines.open_for() if is_active(w)]
    chosen: dict[str, None] = {}
    tree_order(state.versions.dissemination.plan).with_ancestors(active, chosen)
    return [w for w in chosen if w in lines.lines]


async def cry_idle_news(app: web.Application) -> None:
    """The idle workers hear of the newest version by turns, paced at coordinator.idle_news_per_s
    (the whole fleet together): a slice of lines, then a pause as long as the rate allows. A
    publish to 10,000 workers so costs the event loop a slice at a time, spread over the version,
    not a burst that the learner's batch and the active workers' rollouts queue behind. A fleet
    whose idle workers all fit in a version's time hears every version; a larger one hears
    every few (a heartbeat's reply carries the newest too)."""
    state, lines = app[STATE_KEY], app[NEWS_KEY]
    while True:
        await lines.idle_due.wait()
        run = idle_news_next(state, lines, WRITES_PER_SLICE)
        if not run:  # every open line has heard of the newest version
            lines.idle_due.clear()
            continue
        written = await lines.tell((w, state.worker_desk.news_of(w)) for w in run)
        await asyncio.sleep(max(written, 1) / state.cfg.coordinator.idle_news_per_s)


def idle_news_next(state: CoordinatorState, lines: NewsLines, count: int) -> list[str]:
    """The next `count` open lines not yet told of the newest version, in the relay tree's
    depth-first order from where the last turn stopped, each after the relays it pulls from that
    were not told either (none until the newest version's tree is planned)."""
    plan = state.versions.dissemination.plan
    if plan is None or plan.version != state.versions.current:
        return []  # its tree is being planned: cry_news tells the active workers, then wakes us
    told = lines.told_of(state.versions.current)
    order = tree_order(plan)
    if not order.preorder:
        return lines.longest_untold(count, told=told)
    chosen: dict[str, None] = {}
    order.with_ancestors(lines.idle_turns.next_run(order, count, told=told), chosen, told)
    return [w for w in chosen if w in lines.lines]


async def plan_newest(app: web.Application) -> None:
    """The newest version's relay tree, planned on a thread over the workers live now: the
    event loop keeps answering meanwhile (the plan is pure; the interpreter switches between
    the two every few milliseconds), and the learner's publish was answered before it."""
    state = app[STATE_KEY]
    info = state.learner_desk.unplanned()
    if info is None:
        return
    dissemination = state.versions.dissemination
    peers, suspects = state.registry.peers_for_plan(), dissemination.suspects_for(info.version)
    plan = await asyncio.to_thread(dissemination.make_plan, info.version, info.origin_url, peers, suspects)
    state.learner_desk.adopt_plan(plan)
    write_events(app)


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


class FullCollections:
    """The garbage collector's full passes, timed (a gc callback), and what survives each one
    frozen (`gc.freeze`, from the housekeeping loop): with tens of thousands of open connections
    the coordinator tracks over a million objects, almost all of them as long-lived as their
    connections, and a full pass over them holds the event loop a second or more. Frozen, they
    are never scanned again, and a full pass covers only what came since the last one. The
    price: a reference cycle among frozen objects that later becomes garbage is not reclaimed
    (asyncio and aiohttp break the cycles of a closed connection themselves, so little is).
    A pass over LONG_GC_PASS_S is logged, so a stall has a named cause."""

    def __init__(self) -> None:
        self.started = 0.0
        self.count, self.total_s, self.longest_s = 0, 0.0, 0.0
        self.freeze_due = False

    def __call__(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self.started = time.perf_counter()
            return
        took_s = time.perf_counter() - self.started
        self.count, self.total_s, self.longest_s = self.count + 1, self.total_s + took_s, max(self.longest_s, took_s)
        self.freeze_due = True
        if took_s > LONG_GC_PASS_S:
            log.info("a full garbage collection held the event loop %.2f s", took_s)

    def freeze_survivors(self) -> None:
        if self.freeze_due:
            self.freeze_due = False
            gc.freeze()


COLLECTIONS_KEY = web.AppKey("full_collections", FullCollections)


async def run_upkeep(app: web.Application):
    """Start the loops with the app; on shutdown stop them and write the final state."""
    collections = app[COLLECTIONS_KEY] = FullCollections()
    gc.callbacks.append(collections)
    tasks = [asyncio.create_task(loop(app)) for loop in (housekeeping, cry_news, cry_idle_news, keep_lines_alive,
                                                          watch_load, check_reported_relays)]
    stop_history = asyncio.Event()
    history = asyncio.create_task(app[HISTORY_KEY].follow(stop_history))
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stop_history.set()
    await history  # its file read in a thread: let it finish before the files close
    gc.callbacks.remove(collections)
    app[METRICS_KEY].write("coordinator_final", **snapshot(app[STATE_KEY]))
