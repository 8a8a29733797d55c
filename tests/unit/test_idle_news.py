"""Who hears of a new version at once (`upkeep.version_news_to`): every active worker, then idle
workers by turns (a run of the relay tree's depth-first order, at coordinator.idle_news_per_s),
each after the relays it pulls from; a fleet whose idle workers fit one round hears every
version."""

from __future__ import annotations

import asyncio
import itertools

from tests.unit.coordinator_helpers import FakeClock, make_state, publish

from echo2.coordinator.http.news import WRITES_PER_SLICE, NewsLines
from echo2.coordinator.http.upkeep import version_news_to
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


def _round(state, lines: NewsLines, version: int, since_last_s: float) -> list[str]:
    publish(state, version)
    info = state.learner_desk.unplanned()  # planned as upkeep.plan_newest plans it
    if info is not None:
        dissemination = state.versions.dissemination
        state.learner_desk.adopt_plan(dissemination.make_plan(info.version, info.origin_url, list(
            state.registry.peers()), dissemination.suspects_for(info.version)))
    told = version_news_to(state, lines, since_last_s=since_last_s)
    asyncio.run(lines.tell((w, state.worker_desk.news_of(w)) for w in told))
    return told


def test_active_workers_hear_every_version_and_idle_ones_take_turns_after_their_relays(tmp_path, tiny_model_dir):
    state, lines = _fleet(tmp_path, tiny_model_dir, workers=3_000, active=20, idle_news_per_s=1_000.0)
    told_at: dict[str, list[int]] = {}
    for version in range(1, 9):
        told = _round(state, lines, version, since_last_s=0.5)  # a turn of 500 idle workers
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


def test_a_fleet_whose_idle_workers_fit_a_round_hears_every_version(tmp_path, tiny_model_dir):
    state, lines = _fleet(tmp_path, tiny_model_dir, workers=WRITES_PER_SLICE, active=2, idle_news_per_s=1.0)
    for version in (1, 2, 3):
        assert len(_round(state, lines, version, since_last_s=0.001)) == WRITES_PER_SLICE
