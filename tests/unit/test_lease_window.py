"""S is a bound, not a target (policy.window): the lease window shrinks from S steps to the
fewest that keep the learner from waiting, never below the measured S_min, grows at once when
the learner waits, and so groups train fresher at the same utilization; the coordinator and the
simulator drive the same rule."""

from __future__ import annotations

from tests.unit.test_sim_activation import _scenario

from echo2.policy.dataplane import DataPlane
from echo2.policy.window import CALM_STEPS, MAX_CALM_STEPS, LeaseWindow
from echo2.sim.simulator import simulate


def test_the_window_shrinks_when_batches_are_ready_and_grows_when_the_learner_waits():
    window = LeaseWindow(max_staleness=3)
    window.set_floor(1)
    assert window.steps == 3
    for _ in range(CALM_STEPS * 2):
        window.observe(wait_s=0.001, step_time_s=10.0)
    assert window.steps == 1
    window.observe(wait_s=0.4, step_time_s=10.0)  # under 5% of a step: the request's own round trip
    window.observe(wait_s=0.001, step_time_s=10.0)
    assert window.steps == 1
    window.observe(wait_s=2.0, step_time_s=10.0)
    assert window.steps == 2
    window.set_floor(3)  # the fleet's measured latencies need the whole window
    assert window.steps == 3
    for _ in range(CALM_STEPS * 3):
        window.observe(wait_s=0.0, step_time_s=10.0)
    assert window.steps == 3 and window.floor == 3
    window.set_floor(None)  # not measured (yet): the floor is S
    assert window.floor == 3
    synchronous, fixed = LeaseWindow(max_staleness=0), LeaseWindow(max_staleness=2, adaptive=False)
    synchronous.set_floor(5)
    fixed.set_floor(1)
    for _ in range(CALM_STEPS * 2):
        synchronous.observe(0.0, 1.0)
        fixed.observe(0.0, 1.0)
    assert synchronous.steps == 0 and fixed.steps == 2


def test_a_window_one_step_too_small_is_tried_ever_more_rarely():
    """A fleet that needs 2 steps ahead: at 1 the learner waits. Each wait doubles the ready
    batches it takes to shrink again, so 400 steps cost a handful of waits, not one in four."""
    window = LeaseWindow(max_staleness=3)
    window.set_floor(1)
    waits = 0
    for _ in range(400):
        waited = window.steps < 2
        waits += waited
        window.observe(wait_s=1.0 if waited else 0.0, step_time_s=10.0)
    assert window.calm_needed == MAX_CALM_STEPS
    assert waits <= 10, waits  # 5 to reach the cap, then one per MAX_CALM_STEPS + 1 steps
    assert window.steps >= 1


def _fast_fleet(fresh: bool) -> DataPlane:
    """CALM_STEPS + 1 steps of a fleet that fills whatever room it gets before the learner asks."""
    plane = DataPlane(max_staleness=2, groups_per_step=4, version_of=lambda g: g, max_leases_per_worker=100,
                      fresh_leases=fresh)
    plane.window.set_floor(1)
    plane.publish(0)
    for step in range(CALM_STEPS + 1):
        for _ in range(plane.grant(step, 100, leased=0, held_by_worker=0).count):
            plane.add(step)
        plane.advance(step)
        assert plane.take_batch(step, now_s=10.0 * step) is not None
        plane.publish(step + 1)  # step trained: the learner asks for the next batch
    return plane


def test_the_data_plane_leases_one_window_ahead_of_the_batch_in_training():
    fresh, full = _fast_fleet(True), _fast_fleet(False)
    assert fresh.window.steps == 1 and full.window.steps == 2
    version = CALM_STEPS + 1
    assert len(fresh.buffer) == 4  # the next batch is ready...
    # ...and one batch more may be generated at the new version, not S of them
    assert fresh.grant(version, 100, leased=0, held_by_worker=0).count == 4
    assert full.grant(version, 100, leased=0, held_by_worker=0).count == 3 * 4 - len(full.buffer)
    assert fresh.grant(version, 100, leased=4, held_by_worker=4).reason.startswith(
        "window full: waiting for the learner (leasing 1 of S=2 steps ahead)")


def test_in_the_simulator_fresh_leases_train_fresher_groups_at_the_same_utilization():
    """Ten workers of 1 rollout/s against a learner needing 1.6/s (S = 3): the fleet outpaces it."""
    filled = simulate(_scenario("online"))
    fresh_scenario = _scenario("online")
    fresh = simulate(fresh_scenario.model_copy(update={"sim": fresh_scenario.sim.model_copy(
        update={"fresh_leases": True})}))

    def mean(hist: dict[str, int]) -> float:
        return sum(int(k) * v for k, v in hist.items()) / sum(hist.values())

    assert fresh.finished and filled.finished
    assert mean(fresh.staleness_hist) < mean(filled.staleness_hist) - 0.5, (fresh.staleness_hist,
                                                                            filled.staleness_hist)
    assert fresh.utilization_steady >= filled.utilization_steady - 0.02
