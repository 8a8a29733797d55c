"""Who hears of a new version, and when: every active worker at once (`upkeep.version_news_to`),
then the idle workers by turns (`upkeep.idle_news_next`: a run of the relay tree's depth-first
order), each after the relays it pulls from, paced at coordinator.idle_news_per_s
(`upkeep.cry_idle_news`); a fleet whose idle workers fit in a version's time hears every
version."""

from __future__ import annotations

import asyncio
import itertools

from aiohttp import web
from tests.unit.coordinator_helpers import FakeClock, make_state, publish

from echo2.coordinator.http.base import NEWS_KEY, STATE_KEY
from echo2.coordinator.http.news import WRITES_PER_SLICE, NewsLines
from echo2.coordinator.http.upkeep import cry_idle_news, idle_news_next, version_news_to
from echo2.coordinator.parts.news_order import tree_order
from echo2.protocol.messages import RegisterRequest


class Socket:
    """An open connection that takes every write (the lines' writes go through the real code)."""

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    async def write(self, data: bytes) -> None:
        self.sent = data


def _fleet(tmp_path, tiny_model_dir, workers: int, active: int, idle_news_per_s: float):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), registrations_per_s=1e9, registrations_per_minute=1e9,
                       config={"coordinator": {"idle_news_per_s": idle_news_per_s}})
    publish(state, 0)
    for i in range(workers):
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.1:{i}"))
    for i, view in enumerate(state.controller.workers.values()):
        view.active = i < active
    lines = NewsLines()
    for i in range(workers):
        socket = Socket()
        lines.open(f"w{i}", socket, socket)
    return state, lines


def _tell(state, lines: NewsLines, workers: list[str]) -> None:
    asyncio.run(lines.tell((w, state.worker_desk.news_of(w)) for w in workers))


def _round(state, lines: NewsLines, version: int, idle_lines: int) -> list[str]:
    """Publish `version`, tell the active workers, then `idle_lines` idle ones: who was told, in order."""
    publish(state, version)
    info = state.learner_desk.unplanned()  # planned as upkeep.plan_newest plans it
    if info is not None:
        dissemination = state.versions.dissemination
        state.learner_desk.adopt_plan(dissemination.make_plan(info.version, info.origin_url, list(
            state.registry.peers()), dissemination.suspects_for(info.version)))
    told = version_news_to(state, lines)
    _tell(state, lines, told)
    idle = idle_news_next(state, lines, idle_lines)
    _tell(state, lines, idle)
    return told + idle


def test_active_workers_hear_every_version_and_idle_ones_take_turns_after_their_relays(tmp_path, tiny_model_dir):
    state, lines = _fleet(tmp_path, tiny_model_dir, workers=3_000, active=20, idle_news_per_s=1_000.0)
    told_at: dict[str, list[int]] = {}
    for version in range(1, 9):
        told = _round(state, lines, version, idle_lines=500)  # the crier's lines before the next version
        order = tree_order(state.versions.dissemination.plan)
        active = {w for w in told if state.controller.is_active(w)}
        assert len(active) == 20 and len(told) == len(set(told))
        # no one before the relay it pulls from: each parent in the plan told earlier this round
        place = {w: i for i, w in enumerate(told)}
        assert all(place.get(order.parent[w], -1) < place[w] for w in told if w in order.parent)
        # the turn and the relays above it: a few lines more than the turn, not half the tree
        assert 500 <= len(told) - len(active) <= 500 + 20 * 12 + 12
        for w in told:
            told_at.setdefault(w, []).append(version)
    # by turns: every worker is told within ceil(3,000 / 500) rounds of the last time
    assert set(told_at) == {f"w{i}" for i in range(3_000)}
    assert all(told_at[w] == list(range(1, 9)) for w in active)
    gaps = [b - a for w in told_at for a, b in itertools.pairwise(told_at[w])]
    assert max(gaps) <= 6


def test_idle_workers_all_hear_a_version_once_when_they_fit_in_its_time(tmp_path, tiny_model_dir):
    state, lines = _fleet(tmp_path, tiny_model_dir, workers=600, active=2, idle_news_per_s=1.0)
    for version in (1, 2, 3):
        told = _round(state, lines, version, idle_lines=WRITES_PER_SLICE)
        while more := idle_news_next(state, lines, WRITES_PER_SLICE):
            _tell(state, lines, more)
            told += more
        assert sorted(told) == sorted(lines.lines)  # each open line once
        assert all(v == version for v in lines.told_version.values())


def test_the_idle_crier_keeps_its_pace(tmp_path, tiny_model_dir):
    """At 1,000 lines a second, 0.3 s into a version 3,000 idle workers are not all told: about
    300 are, a slice at a time, and the loop is free between slices."""
    state, lines = _fleet(tmp_path, tiny_model_dir, workers=3_000, active=0, idle_news_per_s=1_000.0)
    _round(state, lines, 1, idle_lines=0)
    app = web.Application()
    app[STATE_KEY], app[NEWS_KEY] = state, lines

    async def a_while() -> int:
        lines.idle_due.set()
        crier = asyncio.create_task(cry_idle_news(app))
        await asyncio.sleep(0.3)
        crier.cancel()
        return sum(1 for v in lines.told_version.values() if v == 1)

    told = asyncio.run(a_while())
    assert WRITES_PER_SLICE <= told <= 300 + 2 * WRITES_PER_SLICE, told
