"""The staleness rules shared by the coordinator and the simulator."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from echo2.policy.admission import is_admissible, lease_capacity, worker_may_lease


def test_admission_boundary():
    assert is_admissible(step=5, version=3, max_staleness=2)
    assert not is_admissible(step=6, version=3, max_staleness=2)
    assert is_admissible(step=4, version=4, max_staleness=0)
    assert not is_admissible(step=5, version=4, max_staleness=0)


def test_worker_may_lease_boundary():
    assert worker_may_lease(current_version=7, worker_version=5, max_staleness=2)
    assert not worker_may_lease(current_version=8, worker_version=5, max_staleness=2)


def test_capacity_synchronous_window():
    # S = 0, learner waiting for step 3 with version 3 out: exactly one batch may be generated
    assert lease_capacity(max_staleness=0, groups_per_step=16, worker_version=3, steps_taken=3,
                          outstanding_groups=0) == 16
    # ... and none while it trains step 3 (batch taken), until version 4 is published
    assert lease_capacity(max_staleness=0, groups_per_step=16, worker_version=3, steps_taken=4,
                          outstanding_groups=0) == 0


@given(
    s=st.integers(0, 6), b=st.integers(1, 8), v=st.integers(0, 30), taken=st.integers(0, 40),
    outstanding=st.integers(0, 100),
)
def test_capacity_never_admits_a_group_that_would_be_trained_too_late(s, b, v, taken, outstanding):
    capacity = lease_capacity(max_staleness=s, groups_per_step=b, worker_version=v, steps_taken=taken,
                              outstanding_groups=outstanding)
    # the k-th new group (k = capacity) is trained in the batch holding position taken*b + outstanding + k - 1
    if capacity > 0:
        position = taken * b + outstanding + capacity - 1
        assert is_admissible(position // b, v, s)
    # one more group would be trained too late
    position = taken * b + outstanding + capacity
    assert not is_admissible(position // b, v, s)
