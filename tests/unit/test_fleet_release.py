"""The coordinator's side of fleet release: with a releasable provider an idle worker that leaves
stays a candidate (the launcher can bring it back); an active one leaving, or any worker under the
static provider, is simply gone."""

from __future__ import annotations

import itertools

import pytest
from tests.unit.coordinator_helpers import FakeClock, event_records, make_state

from echo2.config.activation import ActivationConfig
from echo2.coordinator.http.view import snapshot
from echo2.protocol.messages import LeaveRequest, RegisterRequest


def _state(tmp_path, tiny_model_dir, provider: str):
    clock = FakeClock()
    # max_worker_share 1: one measured worker may cover the demand alone (here: the cheap one)
    state = make_state(tmp_path, tiny_model_dir, clock,
                       activation=ActivationConfig(provider=provider, max_worker_share=1.0))
    for worker_id, price in (("cheap", 1.0), ("dear", 5.0)):
        state.worker_desk.register(RegisterRequest(worker_id=worker_id, engine="hf", price_per_hour=price))
    seqs, buffered = itertools.count(), {}  # the run's buffer order; each worker's newest group in it
    for beat in range(1, 4):  # both measured at 100 rollouts/s, a group each beat; demand is 4 rollouts/s
        state.controller.observe_step_time(1.0)
        for worker_id in ("cheap", "dear"):
            state.controller.observe_busy(worker_id, rollouts_total=100 * beat, busy_s_total=float(beat))
            buffered[worker_id] = next(seqs)
            state.controller.observe_buffered(worker_id, buffered[worker_id])
    for worker_id in ("cheap", "dear"):  # and checked: the audit passed their groups (policy.credit)
        state.controller.observe_audit(worker_id, audited=2, failed=0, newest_passed_seq=buffered[worker_id])
    clock.now += 60  # past scale_down_after_s: the cheaper set may replace run-all
    state.fleet_desk.control()
    assert state.controller.is_active("cheap") and not state.controller.is_active("dear")
    return state


def _left(state, worker_id: str) -> dict:
    return [e for e in event_records(state) if e["kind"] == "worker_left" and e["worker_id"] == worker_id][-1]


@pytest.mark.parametrize("provider, released", [("local", True), ("static", False)])
def test_an_idle_worker_leaving_is_released_only_with_a_releasable_provider(tmp_path, tiny_model_dir, provider,
                                                                            released):
    state = _state(tmp_path, tiny_model_dir, provider)
    state.worker_desk.leave(LeaveRequest(worker_id="dear"))
    assert _left(state, "dear")["released"] is released
    assert state.controller.is_released("dear") is released
    assert snapshot(state)["cost"]["workers"]["dear"]["released"] is released


def test_an_active_worker_leaving_is_gone_and_a_released_one_is_chosen_in_its_place(tmp_path, tiny_model_dir):
    state = _state(tmp_path, tiny_model_dir, "local")
    state.worker_desk.leave(LeaveRequest(worker_id="dear"))
    state.worker_desk.leave(LeaveRequest(worker_id="cheap"))
    state.fleet_desk.sweep()  # the decision a departure calls for: one at the next sweep, however many left
    assert _left(state, "cheap")["released"] is False and not state.controller.is_released("cheap")
    decision = [e for e in event_records(state) if e["kind"] == "activation"][-1]
    assert decision["active"] == ["dear"]  # the provider is asked to acquire it
