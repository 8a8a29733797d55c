"""A lease allowance sized by delivery (issue 44, "trust is spent faster than it is earned"):
five ids that each answered 4 leases honestly once held 48 of a 64-group lease window, because
the allowance doubled with every accepted group. Now a worker holds no more than its measured
delivery returns within a lease's deadline, plus a margin, and what it delivered ages out."""

from __future__ import annotations

from tests.unit.coordinator_helpers import FakeClock, lease, make_state, publish, register
from tests.unit.test_lease_trust import work

from echo2.policy.trust import DELIVERY_MARGIN_GROUPS, DELIVERY_WINDOW_S, LeaseTrust
from echo2.protocol.messages import Heartbeat

ATTACKERS = [f"sybil{i}" for i in range(5)]


def _hold_all(state, worker_ids: list[str], version: int) -> dict[str, int]:
    for worker_id in worker_ids:
        for _ in range(4):
            lease(state, worker_id, version, max_tasks=100)
    return {w: len(state.leases_book.held_by(w)) for w in worker_ids}


def _beat(state, worker_ids: list[str], version: int) -> None:
    for worker_id in worker_ids:
        state.worker_desk.heartbeat(Heartbeat(worker_id=worker_id, version=version))


def test_standing_earned_then_hoarded_is_bounded_by_delivery_and_the_learner_keeps_its_pace(tmp_path,
                                                                                               tiny_model_dir):
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=3, groups_per_step=16)  # a 64-group window
    publish(state, 0)
    register(state, "honest")
    for worker_id in ATTACKERS:
        register(state, worker_id)
        for _ in range(4):  # four leases answered honestly: the standing the attack had
            assert work(state, worker_id, max_tasks=1) == 1
    held = _hold_all(state, ATTACKERS, 0)  # then the ids lease all they may and return nothing
    assert min(held.values()) >= 1  # the window had room: they were limited by what they earned
    assert max(held.values()) <= 4 + DELIVERY_MARGIN_GROUPS, held  # slow start alone: 2**4 = 16 each
    assert sum(held.values()) <= 30, held  # 44, all the room the window had, before

    steps = 0
    for version in range(1, 4):  # the learner keeps its pace on the honest worker's groups
        for _ in range(20):
            if state.learner_desk.take_batch(version - 1):
                break
            work(state, "honest", version=version - 1, max_tasks=100, gen_s=1.0)
            _beat(state, ["honest", *ATTACKERS], version - 1)
        else:
            raise AssertionError(f"no batch for step {version - 1}")
        steps += 1
        publish(state, version)
    assert steps == 3

    # what the ids delivered ages out: past the delivery window they may hold the margin only
    for _ in range(int(DELIVERY_WINDOW_S // 4) + 2):
        clock.now += 4.0  # beating, so they are live, while their leases expire and come back
        _beat(state, ["honest", *ATTACKERS], 3)
        state.fleet_desk.sweep()
    held = _hold_all(state, ATTACKERS, 3)
    assert max(held.values()) <= DELIVERY_MARGIN_GROUPS, held


def test_a_rate_measured_over_at_least_a_deadline_and_forgotten_after_the_window():
    now = [100.0]
    trust = LeaseTrust(clock=lambda: now[0], lease_timeout_s=600.0)
    assert trust.allowance("w", 64) == 1  # nothing answered yet: slow start's one lease
    for _ in range(8):  # eight groups, each answered 2 s after its lease, all within 16 s
        now[0] += 2.0
        trust.submitted("w", 2.0, accepted=True)
    # 8 groups in 16 s, over a 30 s deadline (the floor): 8 * 30 / 30 + the margin
    assert trust.delivered("w") == 8 + DELIVERY_MARGIN_GROUPS and trust.allowance("w", 64) == 10
    now[0] += 44.0  # 60 s after the first lease, 8 groups: 4 per 30 s deadline
    assert trust.delivered("w") == 4 + DELIVERY_MARGIN_GROUPS
    now[0] += DELIVERY_WINDOW_S
    assert trust.allowance("w", 64) == DELIVERY_MARGIN_GROUPS
    assert LeaseTrust().allowance("w", 64) == 1 and LeaseTrust().delivered("w") is None  # no clock: slow start
