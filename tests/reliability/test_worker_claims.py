"""What a worker claims cannot steer the run (issue 11, findings 3 and 5): a report against the
learner's origin changes nothing and leaves no assignment without a source, one lying reporter
cannot cut an honest relay off (one never sent to it changes nothing at all), and activation
prices workers at the throughput the coordinator measures, not what their heartbeats say. (A
declared slow link cannot lower the slow-sender cutoff below its floor:
tests/unit/broadcast/test_broadcast_faults.py, which needs that directory's relay cluster.)"""

from __future__ import annotations

import pytest
from tests.unit.coordinator_helpers import FakeClock, lease, make_state, publish, register, submission

from echo2.config.broadcast import BroadcastConfig
from echo2.coordinator.http.view import snapshot
from echo2.coordinator.parts.dissemination import Dissemination
from echo2.coordinator.parts.peers import Peer
from echo2.protocol.broadcast import BadPeerReport
from echo2.protocol.messages import BadPeerRequest, Heartbeat, RegisterRequest

ORIGIN = "http://learner:1"


def peers(n: int, version: int = -1) -> list[Peer]:
    return [Peer(f"w{i}", f"http://10.0.0.{i}:80", 1e9, 1e9, version) for i in range(n)]


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def state(tmp_path, tiny_model_dir, clock):
    return make_state(tmp_path, tiny_model_dir, clock)


def test_the_origin_cannot_be_reported_and_no_assignment_is_left_without_a_source(tmp_path, tiny_model_dir):
    """A worker reporting the learner's origin once left first-hop workers with an empty source
    list; with max_sources = 1 a reported parent did the same."""
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    for i in range(2):
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.{i}:80"))
    publish(state, 0)
    report = BadPeerReport(version=0, reporter_id="w1", peer_id="origin", url=ORIGIN, chunk_index=0,
                           reason="corrupt_chunk", detail="lies")
    state.worker_desk.bad_peer(BadPeerRequest(report=report))
    sources = state.worker_desk.heartbeat(Heartbeat(worker_id="w0", version=-1)).assignment.sources
    assert [s.peer_id for s in sources] == ["origin"]
    assert "origin" not in state.versions.dissemination.suspects
    single = Dissemination(BroadcastConfig(max_sources=1), learner_upload_bps=1e9)
    single.plan_version(3, ORIGIN, peers(2))
    assert [s.peer_id for s in single.assignment("w1", 3, ORIGIN, peers(2)).sources] == ["w0"]
    assert single.report("w0", "w1", 3, standing=True) == "reporter"
    only = single.assignment("w1", 3, ORIGIN, peers(2)).sources
    assert [(s.peer_id, s.url) for s in only] == [("origin", ORIGIN)]


def test_one_lying_reporter_cannot_cut_an_honest_relay_off():
    diss = Dissemination(BroadcastConfig(), learner_upload_bps=1e9)
    diss.plan_version(3, ORIGIN, peers(4))
    # w3 was not sent to w0 for version 3 (it had not asked yet)
    assert diss.report("w0", "w3", 3, standing=True) == "none"
    assert "w0" in [s.peer_id for s in diss.assignment("w3", 3, ORIGIN, peers(4)).sources]  # a fallback of its
    assert diss.report("w0", "w3", 3, standing=True) == "reporter"  # w3 lies about w0, one of its sources now
    assert [s.peer_id for s in diss.assignment("w1", 3, ORIGIN, peers(4)).sources][0] == "w0"
    plan = diss.plan_version(4, ORIGIN, peers(4))
    assert plan.origin_children == ["w0"]  # w0 still relays the next version
    assert "w0" not in [s.peer_id for s in diss.assignment("w3", 4, ORIGIN, peers(4)).sources]
    diss.forget("w3")  # the liar gone for good: its report goes with it
    assert "w0" in [s.peer_id for s in diss.assignment("w3", 4, ORIGIN, peers(4)).sources]


def test_throughput_is_what_the_coordinator_measures_not_what_a_worker_claims(state, clock):
    publish(state, 0)
    register(state, "boaster")
    state.worker_desk.heartbeat(Heartbeat(worker_id="boaster", version=0, rollouts_total=10**9, busy_s_total=0.001))
    assert state.controller.workers["boaster"].rollouts_per_s.samples == 0  # a claim is not a sample
    task = lease(state, "boaster", 0).tasks[0]
    clock.now += 2.0  # it took two seconds to return a group
    assert state.intake.submit(submission(state, "boaster", task.lease_id, 0)).accepted
    measured = state.controller.workers["boaster"].rollouts_per_s.value
    assert measured == pytest.approx(state.cfg.sampling.group_size / 2.0)
    clock.now += 5.0  # idle time (no lease held) is not counted against it
    task = lease(state, "boaster", 0).tasks[0]
    clock.now += 2.0
    state.intake.submit(submission(state, "boaster", task.lease_id, 0))
    assert state.controller.workers["boaster"].rollouts_per_s.value == pytest.approx(measured)
    row = snapshot(state)["workers"]["boaster"]
    assert (row["rollouts_per_s_claimed"] == pytest.approx(1e12)
            and row["rollouts_per_s_measured"] == pytest.approx(measured))


def test_the_slow_sender_cutoff_follows_measured_rates_above_a_fixed_floor():
    from echo2.broadcast.fetch import slow_sender_floor

    cfg = BroadcastConfig()  # min_rate 125 kB/s, floor 32 kB/s
    assert slow_sender_floor(cfg, planned_rate_bytes_per_s=1e9, measured_rate_bytes_per_s=None) == 125_000
    assert slow_sender_floor(cfg, planned_rate_bytes_per_s=200_000, measured_rate_bytes_per_s=None) == 50_000
    # a plan built on a relay declaring 100 B/s: the floor holds
    assert slow_sender_floor(cfg, planned_rate_bytes_per_s=100, measured_rate_bytes_per_s=None) == 32_000
    # what the worker measured on earlier versions wins over what was declared
    assert slow_sender_floor(cfg, planned_rate_bytes_per_s=100, measured_rate_bytes_per_s=1e8) == 125_000
    assert slow_sender_floor(cfg, planned_rate_bytes_per_s=1e9, measured_rate_bytes_per_s=160_000) == 40_000
