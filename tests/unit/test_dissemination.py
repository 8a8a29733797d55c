"""The coordinator's broadcast planning: a relay tree per version over live workers, late
joiners pointed at holders, reported peers never used as a source again."""

from __future__ import annotations

from tests.unit.coordinator_helpers import FakeClock, make_state, publish

from echo2.config.broadcast import BroadcastConfig
from echo2.coordinator.dissemination import Dissemination, Peer
from echo2.protocol.broadcast import BadPeerReport
from echo2.protocol.messages import BadPeerRequest, Heartbeat, RegisterRequest

ORIGIN = "http://learner:1"


def peers(n: int, version: int = -1) -> list[Peer]:
    return [Peer(f"w{i}", f"http://10.0.0.{i}:80", 1e9, 1e9, version) for i in range(n)]


def test_equal_links_make_a_chain_with_ancestors_as_fallbacks():
    plan = Dissemination(BroadcastConfig(), learner_upload_bps=1e9).plan_version(3, ORIGIN, peers(3))
    by_worker = {a.worker_id: [s.peer_id for s in a.sources] for a in plan.assignments}
    assert plan.origin_children == ["w0"]
    assert by_worker == {"w0": ["origin"], "w1": ["w0", "origin"], "w2": ["w1", "w0", "origin"]}


def test_late_joiner_pulls_from_a_holder_and_suspects_are_skipped():
    diss = Dissemination(BroadcastConfig(), learner_upload_bps=1e9)
    diss.plan_version(3, ORIGIN, peers(2))
    live = peers(2, version=3) + [Peer("late", "http://10.0.0.9:80", 1e9, 1e9, -1)]
    assert [s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources][-1] == "origin"
    assert {s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources} >= {"w0"}
    assert diss.report("w0", "w1") == "reporter"  # one report: only the reporter avoids w0
    assert "w0" not in [s.peer_id for s in diss.assignment("w1", 3, ORIGIN, live).sources]
    assert "w0" in [s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources]
    assert diss.report("w0", "w1") == "reporter"  # the same reporter again is still one
    assert diss.report("w0", "late") == "everyone"  # a second, different reporter: no one uses it
    assert "w0" not in [s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources]
    assert diss.report("w1", "w1") == "none"  # reporting oneself means nothing



def test_unreachable_worker_is_a_leaf():
    nat = [Peer("nat", "", 1e9, 1e9, -1)] + peers(2)
    plan = Dissemination(BroadcastConfig(), learner_upload_bps=1e9).plan_version(1, ORIGIN, nat)
    assert all("nat" not in [s.peer_id for s in a.sources] for a in plan.assignments)


def test_state_hands_assignments_in_heartbeats_and_takes_bad_peer_reports(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    for i in range(2):
        state.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.{i}:80"))
    publish(state, 0)
    reply = state.heartbeat(Heartbeat(worker_id="w1", version=-1))
    assert reply.assignment is not None and [s.peer_id for s in reply.assignment.sources] == ["w0", "origin"]
    assert reply.learner_public_key == state.public_key_hex
    report = BadPeerReport(version=0, reporter_id="w1", peer_id="w0", url="http://10.0.0.0:80", chunk_index=2,
                           reason="corrupt_chunk", detail="sha256 mismatch")
    state.bad_peer(BadPeerRequest(report=report))
    assert [s.peer_id for s in state.heartbeat(Heartbeat(worker_id="w1", version=-1)).assignment.sources] == ["origin"]
    assert state.heartbeat(Heartbeat(worker_id="w0", version=0)).assignment is None  # it holds the newest



def test_bad_peer_reports_are_bounded():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        BadPeerReport(version=0, reporter_id="w1", peer_id="w0", url="", chunk_index=0, reason="corrupt_chunk",
                      detail="x" * 10_000)
    with pytest.raises(ValidationError):
        BadPeerReport(version=0, reporter_id="w1" * 200, peer_id="w0", url="", chunk_index=0, reason="corrupt_chunk")
