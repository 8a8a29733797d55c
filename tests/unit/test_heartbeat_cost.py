"""A heartbeat's reply costs the same work with 10 registered workers as with 10,000: counted as
Python and C function calls (a profiler's call events), not timed. What is built once per
version (the plan, each version's holders, the first step of the way from each version held,
the JSON of the version and of each assignment) or once a second (the view of the live
workers) is built by a warm-up reply; every reply after it is lookups."""

from __future__ import annotations

import sys

import pytest
from tests.unit.coordinator_helpers import FakeClock, make_state, publish

from echo2.coordinator.http.news import JsonPieces, reply_bytes
from echo2.protocol.messages import Heartbeat, LeaveRequest, RegisterRequest


def _calls(work) -> int:
    counted = 0

    def count(frame, event, arg):
        nonlocal counted
        if event in ("call", "c_call"):
            counted += 1

    sys.setprofile(count)
    try:
        work()
    finally:
        sys.setprofile(None)
    return counted


def _fleet(tmp_path, tiny_model_dir, workers: int):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), registrations_per_s=1e9,
                       registrations_per_minute=1e9)
    publish(state, 0)
    for i in range(workers):
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.1:{i}"))
    publish(state, 1)  # a plan over every one of them
    state.worker_desk.register(RegisterRequest(worker_id="late", engine="hf"))  # not in the plan
    return state


def _reply_calls(state, worker_id: str) -> int:
    pieces = JsonPieces()
    beat = Heartbeat(worker_id=worker_id, version=0)

    def reply():
        reply_bytes(pieces, state.worker_desk.heartbeat(beat))

    reply()  # the warm-up: builds what every later reply shares
    return _calls(reply)


@pytest.mark.parametrize("worker", ["w3", "late"])
def test_a_heartbeat_reply_does_the_same_work_at_10_and_10000_workers(tmp_path, tiny_model_dir, worker):
    small = _reply_calls(_fleet(tmp_path / "small", tiny_model_dir, 10), worker)
    large = _reply_calls(_fleet(tmp_path / "large", tiny_model_dir, 10_000), worker)
    print(f"\n{worker}: {small} calls at 10 workers, {large} at 10,000")
    assert large == small, (small, large)


def test_the_count_sees_work_that_grows_with_the_fleet(tmp_path, tiny_model_dir):
    """The measure has teeth: a reply that also lists the live workers, as every reply once did
    (a peer list built per heartbeat), counts about one call more per worker."""
    state = _fleet(tmp_path, tiny_model_dir, 1_000)
    beat = Heartbeat(worker_id="w3", version=0)
    state.worker_desk.heartbeat(beat)  # the warm-up
    plain = _calls(lambda: state.worker_desk.heartbeat(beat))
    walking = _calls(lambda: (state.worker_desk.heartbeat(beat), state.registry.peers(max_age_s=0)))
    assert walking > plain + 900, (plain, walking)


def _leave_calls(state, worker_id: str) -> int:
    return _calls(lambda: state.worker_desk.leave(LeaveRequest(worker_id=worker_id)))


def test_a_leave_does_the_same_work_at_10_and_10000_workers(tmp_path, tiny_model_dir):
    """A whole fleet stopping sends its leaves at once: each must cost the coordinator the same
    few lookups however many are registered, and no store write when it held no lease."""
    small = _fleet(tmp_path / "small", tiny_model_dir, 10)
    large = _fleet(tmp_path / "large", tiny_model_dir, 10_000)
    _leave_calls(small, "w0"), _leave_calls(large, "w0")  # the first leave's one-time imports and caches
    writes = large.store.db.total_changes
    assert _leave_calls(small, "w3") == _leave_calls(large, "w3")
    assert large.store.db.total_changes == writes
