"""What a worker id earns by delivering (issue 24, "Trust, round two"): slow start for new ids,
whose leases share a quarter of the window; lease deadlines that follow the worker's measured
generation time; and no worker filling more than activation.max_worker_share of a batch while
others deliver. Against the coordinator's state machine and the policy objects directly."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from tests.unit.coordinator_helpers import (
    FakeClock,
    event_records,
    lease,
    make_state,
    past_slow_start,
    publish,
    register,
    submission,
)
from tests.unit.metrics_fixtures import synthetic_run

from echo2.policy import DataPlane
from echo2.policy.trust import (
    DEADLINE_FACTOR,
    DEADLINE_FLOOR_S,
    DELIVERY_MARGIN_GROUPS,
    LeaseTrust,
    batch_share_cap,
)
from echo2.protocol.messages import Heartbeat, LeaveRequest
from echo2.report.render import render_summary
from echo2.report.summary import summarize


@pytest.fixture
def clock():
    return FakeClock()


def work(state, worker_id: str, *, version: int = 0, max_tasks: int = 1, gen_s: float = 0.0) -> int:
    """One lease round of an honest worker: lease, generate for `gen_s`, submit; returns the groups."""
    tasks = lease(state, worker_id, version, max_tasks=max_tasks).tasks
    state.clock.now += gen_s
    for task in tasks:
        assert state.intake.submit(submission(state, worker_id, task.lease_id, version)).accepted
    return len(tasks)


def test_fresh_ids_cannot_starve_an_honest_worker_of_leases(tmp_path, tiny_model_dir, clock):
    """Four new ids once held 59 of a 64-group window and returned nothing: no batch for 20 s.
    Now each new id holds one lease, and all of them together a quarter of the window."""
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=1, groups_per_step=8)  # a 16-group window
    publish(state, 0)
    register(state, "honest")
    assert work(state, "honest") == 1  # measured: one group accepted
    hoarders = [f"fresh{i}" for i in range(6)]
    for worker_id in hoarders:
        register(state, worker_id)
    for _ in range(3):
        for worker_id in hoarders:
            lease(state, worker_id, 0, max_tasks=100)
    held = {w: len(state.leases_book.held_by(w)) for w in hoarders}
    assert max(held.values()) == 1 and sum(held.values()) == 4  # a quarter of 16
    refused = lease(state, "fresh5", 0, max_tasks=100)
    assert refused.tasks == [] and refused.reason.startswith("new workers hold their share of the window")
    batch = None
    for _ in range(6):  # the honest worker keeps leasing and delivering while the hoarders sit
        work(state, "honest", max_tasks=100, gen_s=0.5)
        batch = batch or state.learner_desk.take_batch(0)
    assert batch is not None and {g.worker_id for g in batch} == {"honest"}


def test_a_new_id_gets_one_lease_until_a_group_of_it_is_accepted_then_more(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=3, groups_per_step=8)
    publish(state, 0)
    register(state, "new")
    assert len(lease(state, "new", 0, max_tasks=10).tasks) == 1
    again = lease(state, "new", 0, max_tasks=10)
    assert again.tasks == [] and "holding 1 leases (allowed 1 until more of its groups are accepted)" in again.reason
    state.intake.submit(submission(state, "new", state.leases_book.held_by("new")[0].lease_id, 0))
    assert work(state, "new", max_tasks=10) == 2  # one group accepted: twice the allowance
    # three accepted: slow start allows 2**3, its delivery 3 groups within a deadline plus the margin
    assert work(state, "new", max_tasks=10) == 3 + DELIVERY_MARGIN_GROUPS
    assert work(state, "new", max_tasks=10) == 8  # eight delivered: the per-worker cap (P = 8)
    # standing belongs to a registration: the same id registered again starts over
    state.worker_desk.leave(LeaveRequest(worker_id="new"))
    register(state, "new")
    assert len(lease(state, "new", 0, max_tasks=10).tasks) == 1


def test_a_lease_deadline_follows_measured_generation_time(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=1, groups_per_step=4)  # lease_timeout_s 60
    publish(state, 0)
    register(state, "quick")
    task = lease(state, "quick", 0).tasks[0]
    assert state.leases_book.leases[task.lease_id].expires_at == clock.now + 60.0  # never measured: lease_timeout_s
    clock.now += 2.0
    state.intake.submit(submission(state, "quick", task.lease_id, 0))
    task = lease(state, "quick", 0).tasks[0]
    # 4 x 2 s is under the floor
    assert state.leases_book.leases[task.lease_id].expires_at == clock.now + DEADLINE_FLOOR_S
    clock.now += DEADLINE_FLOOR_S + 1
    state.worker_desk.heartbeat(Heartbeat(worker_id="quick", version=0))  # alive, but far past its own pace
    state.fleet_desk.sweep()
    assert task.lease_id not in state.leases_book.leases
    assert [e for e in event_records(state) if e["kind"] == "lease_requeued"][-1]["reason"] == "lease_timeout"

    trust = LeaseTrust()
    assert trust.deadline_s("w", lease_timeout_s=120.0) == 120.0
    for held_s in (10.0, 12.0, 11.0):
        trust.submitted("w", held_s, accepted=True)
    assert trust.deadline_s("w", lease_timeout_s=120.0) == DEADLINE_FACTOR * 12.0  # the slowest recent lease
    trust.submitted("w", 40.0, accepted=False)  # a slow lease dropped as stale still measures the worker
    assert trust.deadline_s("w", lease_timeout_s=120.0) == 120.0  # never above lease_timeout_s


def test_no_worker_fills_more_than_its_share_of_a_batch_while_others_deliver(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=2, groups_per_step=4)  # at most 2 of 4
    publish(state, 0)
    for worker_id in ("fast", "slow"):
        register(state, worker_id)
    past_slow_start(state, "fast", "slow")
    work(state, "fast", max_tasks=4)  # the four oldest groups are all the fast worker's
    held = lease(state, "slow", 0, max_tasks=2).tasks
    assert state.learner_desk.take_batch(0) is None  # the slow worker is generating: its groups are waited for
    for task in held:
        state.intake.submit(submission(state, "slow", task.lease_id, 0))
    batch = state.learner_desk.take_batch(0)
    assert [g.worker_id for g in batch].count("fast") == 2 and [g.worker_id for g in batch].count("slow") == 2
    assert [e for e in event_records(state) if e["kind"] == "batch_assigned"][-1]["max_worker_share"] == 0.5

    # a worker that stops delivering costs at most the share wait (1 s before the step time is known)
    publish(state, 1)
    work(state, "fast", version=1, max_tasks=4)
    lease(state, "slow", 1)
    assert state.learner_desk.take_batch(1) is None
    clock.now += 1.5
    # filled from the fast worker's groups
    assert [g.worker_id for g in state.learner_desk.take_batch(1)] == ["fast"] * 4


def test_a_one_worker_run_still_forms_batches(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=1, groups_per_step=4)
    publish(state, 0)
    register(state, "alone")
    past_slow_start(state, "alone")
    work(state, "alone", max_tasks=4)
    lease(state, "alone", 0)  # holding a lease itself: nobody else to wait for
    assert [g.worker_id for g in state.learner_desk.take_batch(0)] == ["alone"] * 4


def test_the_share_cap_on_plain_data():
    plane: DataPlane[tuple[int, str]] = DataPlane(2, 4, lambda g: g[0], worker_of=lambda g: g[1],
                                                   max_worker_share=0.5)
    plane.publish(0)
    for worker in "aaaab":
        plane.add((0, worker))
    plane.advance(0)
    # b's first, then a's oldest: nobody else is coming
    assert plane.take_batch(0, now_s=0.0) == [(0, "a")] * 3 + [(0, "b")]
    assert batch_share_cap(0.5, 4) == 2 and batch_share_cap(0.1, 4) == 1 and batch_share_cap(1.0, 4) == 4
    # new ids are never waited for: a fresh id holding a lease cannot hold batches back
    for worker in "aaaa":
        plane.add((0, worker))
    plane.advance(1)
    assert plane.take_batch(1, now_s=5.0, producing={"sybil"}) is not None


def test_the_new_workers_pool_on_plain_data():
    plane: DataPlane[int] = DataPlane(1, 8, lambda v: v)
    plane.publish(0)
    assert plane.window_groups() == 16 and plane.trust.new_pool(plane.window_groups()) == 4
    assert plane.grant(0, 9, leased=0, held_by_worker=0, worker_id="n").count == 1
    assert plane.grant(0, 9, leased=4, held_by_worker=0, worker_id="m", held_by_new=4).count == 0
    assert plane.grant(0, 9, leased=4, held_by_worker=0, held_by_new=4).count == 8  # no id: no slow start
    plane.trust.submitted("m", 1.0, accepted=True)
    assert plane.grant(0, 9, leased=4, held_by_worker=0, worker_id="m", held_by_new=4).count == 2


def test_the_run_summary_shows_the_largest_share_of_a_batch():
    records = synthetic_run(steps=3)
    t = records[-1]["time"]
    for share in (0.5, 0.75):
        records.append({"time": t, "role": "coordinator", "kind": "batch_assigned", "step": 0,
                        "max_worker_share": share,
                        "staleness_hist": {"0": 4}, "max_staleness_seen": 0, "lease_window_steps": 1, "buffered": 0,
                        "leased": 0})
    summary = summarize(records)
    assert summary["max_worker_share_in_batch"] == 0.75
    out = io.StringIO()
    render_summary(summary, Console(file=out, width=200))
    assert "largest share of a batch from one worker" in out.getvalue() and "75%" in out.getvalue()
