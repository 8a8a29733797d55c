"""Staleness admission in the simulator: the policy core the coordinator drives (the same
object, not a copy), and no trained group is ever older than S, whatever the timing, noise or
churn."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2.config.sim import ScenarioConfig
from echo2.policy import DataPlane
from echo2.sim.dataplane import SimDataPlane
from echo2.sim.simulator import simulate


def test_the_simulator_drives_the_coordinators_data_plane():
    data = SimDataPlane(2, 4)
    assert type(data.core) is DataPlane
    data.publish(0)
    assert data.lease(0, 3) == 3 and data.lease(0, 9, held_by_worker=3) == 1  # per-worker cap: B = 4


@settings(max_examples=200, deadline=None)
@given(
    max_staleness=st.integers(0, 4),
    ops=st.lists(
        st.tuples(st.sampled_from(["lease", "submit", "step", "release"]), st.integers(0, 6)), max_size=80
    ),
)
def test_dataplane_never_trains_a_group_older_than_s(max_staleness, ops):
    data, groups_per_step = SimDataPlane(max_staleness, 4, max_leases_per_worker=64), 4
    data.publish(0)
    in_flight: list[tuple[int, int]] = []  # (version, groups)
    step = 0
    for op, arg in ops:
        if op == "lease":
            version = max(0, data.current_version - arg % (max_staleness + 2))
            granted = data.lease(version, 1 + arg % 3)
            if granted:
                in_flight.append((version, granted))
        elif op == "submit" and in_flight:
            data.submit(*in_flight.pop(arg % len(in_flight)))
        elif op == "release" and in_flight:
            data.release(in_flight.pop(arg % len(in_flight))[1])
        elif op == "step":
            batch = data.take_batch(step)
            if batch is not None:
                assert len(batch) == groups_per_step
                assert all(step - g.version <= max_staleness for g in batch)
                step += 1
                data.publish(step)
        assert data.outstanding >= 0
    assert all(int(k) <= max_staleness for k in data.counters.staleness_hist)


def _scenario(max_staleness, **sim):
    return ScenarioConfig.model_validate(
        {
            "learner": {"price_per_hour": 10.0, "uplink_bps": 1e9},
            "workers": {
                "fast": {
                    "count": 3,
                    "price_per_hour": 1.0,
                    "rollouts_per_s": 2.0,
                    "bandwidth_bps": 1e9,
                    "mean_uptime_s": 400.0,
                    "mean_downtime_s": 100.0,
                },
                "slow": {"count": 4, "price_per_hour": 0.3, "rollouts_per_s": 0.5, "bandwidth_bps": 2e8},
            },
            "workload": {
                "params": 1e9,
                "prompts_per_step": 4,
                "group_size": 4,
                "step_time_s": 10.0,
                "max_staleness": max_staleness,
                "generation_time_s": 20.0,
                "load_time_s": 1.0,
            },
            "sim": {"steps": 40, "activation": "all", "generation_cv": 0.8, "step_time_cv": 0.3, **sim},
        }
    )


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
@pytest.mark.parametrize("retry", [{}, {"lease_retry_s": 0.5, "stale_retry_s": 1.0}])
def test_simulated_runs_never_train_stale_groups(max_staleness, retry):
    result = simulate(_scenario(max_staleness, **retry))
    assert result.finished and result.steps_done == 40
    assert max(int(k) for k in result.staleness_hist) <= max_staleness
    assert sum(result.staleness_hist.values()) == 40 * 4 == result.groups["trained"]


def test_s0_is_synchronous_on_policy():
    result = simulate(_scenario(0))
    assert result.staleness_hist == {"0": 160}
