"""Who hears of a new version at once (`upkeep.version_news_to`): every active worker and every
relay of the plan, then idle workers by turns, the ones told longest ago first, at
coordinator.idle_news_per_s; a fleet whose idle workers fit one round hears every version."""

from __future__ import annotations

import asyncio
import itertools

from tests.unit.coordinator_helpers import FakeClock, make_state, publish

from echo2.coordinator.http.news import WRITES_PER_SLICE, NewsLines
from echo2.coordinator.http.upkeep import version_news_to
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


def test_active_workers_and_relays_hear_every_version_and_idle_ones_take_turns(tmp_path, tiny_model_dir):
    state, lines = _fleet(tmp_path, tiny_model_dir, workers=3_000, active=20, idle_news_per_s=1_000.0)
    relays = state.versions.dissemination
    told_at: dict[str, list[int]] = {}
    for version in range(1, 9):
        told = _round(state, lines, version, since_last_s=0.5)  # 500 idle lines a round
        active = {w for w in told if state.controller.is_active(w)}
        assert len(active) == 20 and set(told[:20]) == active  # the active first
        assert relays.relays and relays.relays <= set(told)  # every relay of this version's plan
        idle = [w for w in told if not state.controller.is_active(w) and w not in relays.relays]
        assert len(idle) == 500 and len(told) == len(set(told))
        for w in told:
            told_at.setdefault(w, []).append(version)
    # by turns: after a first round told everyone, every idle worker is told again within
    # ceil(idle / 500) rounds, the one told longest ago first
    assert set(told_at) == {f"w{i}" for i in range(3_000)}
    leaves = [w for w in told_at if w not in relays.relays and not state.controller.is_active(w)]
    gaps = [b - a for w in leaves for a, b in itertools.pairwise(told_at[w])]
    assert max(gaps) <= -(-len(leaves) // 500) + 1


def test_a_fleet_whose_idle_workers_fit_a_round_hears_every_version(tmp_path, tiny_model_dir):
    state, lines = _fleet(tmp_path, tiny_model_dir, workers=WRITES_PER_SLICE, active=2, idle_news_per_s=1.0)
    for version in (1, 2, 3):
        assert len(_round(state, lines, version, since_last_s=0.001)) == WRITES_PER_SLICE
