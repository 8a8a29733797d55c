"""The policy core's data plane on plain data (groups are their versions here): refusals and
their reasons, lease room counting leased plus buffered, the per-worker cap, admission, stale
drops and oldest-first batches."""

import pytest

from echo2.policy import DataPlane, too_stale


def plane(max_staleness=1, groups_per_step=2, **kw) -> DataPlane[int]:
    return DataPlane(max_staleness, groups_per_step, lambda v: v, **kw)


def test_refusals_say_why_and_when_to_ask_again():
    p = plane()
    assert p.grant(0, 1, leased=0, held_by_worker=0).reason == "no policy version published yet"
    p.publish(3)
    stale = p.grant(1, 1, leased=0, held_by_worker=0)
    assert stale.count == 0 and stale.reason == "weights too stale: load version >= 2" and stale.retry_after_s > 0
    assert p.may_lease(2) and not p.may_lease(1)


def test_room_counts_leased_and_buffered_and_the_worker_cap():
    p = plane(max_staleness=1, groups_per_step=2)  # (S + v + 1) * B = 4 groups for v = 0
    p.publish(0)
    assert p.grant(0, 9, leased=0, held_by_worker=0).count == 2  # per-worker cap: B
    assert p.grant(0, 9, leased=3, held_by_worker=0).count == 1
    p.add(0)
    assert p.grant(0, 9, leased=3, held_by_worker=0).reason == "window full: waiting for the learner"
    assert p.grant(0, 9, leased=0, held_by_worker=2).reason == "holding 2 leases: return some first"
    assert plane(max_leases_per_worker=5, max_staleness=4).grant(-1, 1, leased=0, held_by_worker=0).count == 0


def test_stale_groups_are_dropped_on_advance_and_batches_are_oldest_first():
    p = plane(max_staleness=1, groups_per_step=2)
    p.publish(0)
    for v in (0, 0, 0):
        assert p.admits(v)
        p.add(v)
    assert p.advance(0) == [] and p.take_batch(0) == [0, 0] and p.steps_taken == 1
    p.publish(1)
    p.add(1)
    assert p.advance(2) == [0]  # version 0 at step 2: staleness 2 > S
    assert p.buffer == [1] and p.take_batch(2) is None
    assert not p.admits(0)


def test_requeued_groups_are_checked_again_and_take_needs_advance():
    p = plane(max_staleness=0, groups_per_step=1)
    p.publish(1)
    p.advance(1)
    p.requeue_front([0])  # a rejected batch's group, now too old for step 1
    assert p.advance(1) == [0]
    with pytest.raises(ValueError, match="before advance"):
        p.take_batch(2)


def test_the_worker_asks_the_same_rule():
    assert not too_stale(None, -1, 2)  # nothing heard of yet
    assert not too_stale(5, 3, 2) and too_stale(6, 3, 2)
    p = plane(max_staleness=2)
    p.publish(6)
    assert too_stale(6, 3, 2) == (not p.may_lease(3))
