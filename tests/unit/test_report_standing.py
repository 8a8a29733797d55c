"""Bad-peer reports ask for the coordinator's check only from reporters with standing (two ids
that joined after the relays held a version, were assigned an honest relay and both reported
it, once dropped it for every worker), and only the check drops a relay for everyone. A
reporter without standing still stops pulling from the peer itself."""

from __future__ import annotations

from tests.unit.coordinator_helpers import FakeClock, make_state, publish

from echo2.policy.trust import REPORT_STANDING_GROUPS
from echo2.protocol.broadcast import BadPeerReport
from echo2.protocol.messages import BadPeerRequest, Heartbeat, LeaveRequest, RegisterRequest


def _fleet(tmp_path, tiny_model_dir, workers: int, clock: FakeClock | None = None):
    state = make_state(tmp_path, tiny_model_dir, clock or FakeClock())
    for i in range(workers):
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.{i}:80"))
    publish(state, 0)
    return state


def _sources(state, worker_id: str) -> list[str]:
    reply = state.worker_desk.heartbeat(Heartbeat(worker_id=worker_id, version=-1))
    return [s.peer_id for s in reply.assignment.sources]


def _report(state, reporter_id: str, peer_id: str) -> str:
    report = BadPeerReport(version=0, reporter_id=reporter_id, peer_id=peer_id, url="http://10.0.0.0:80",
                           chunk_index=0, reason="corrupt_chunk", detail="sha256 mismatch")
    state.worker_desk.bad_peer(BadPeerRequest(report=report))
    return [e.avoided_by for e in state.events if e.kind == "bad_peer"][-1]


def _earn(state, worker_id: str, groups: int) -> None:
    for _ in range(groups):  # what the data plane notes for each of its groups admitted at submission
        state.groups.trust.submitted(worker_id, 1.0, accepted=True)


def test_late_joiners_without_standing_cannot_drop_an_honest_relay_for_everyone(tmp_path, tiny_model_dir):
    clock = FakeClock()
    state = _fleet(tmp_path, tiny_model_dir, workers=3, clock=clock)
    for i in range(3):  # the relays hold version 0 when the late ones join
        state.worker_desk.heartbeat(Heartbeat(worker_id=f"w{i}", version=0))
    clock.now += 5.0  # the live peers are seen afresh (a view is kept a second)
    for late in ("late0", "late1"):  # joined after the plan: given the relay w0 as a source
        state.worker_desk.register(RegisterRequest(worker_id=late, engine="hf", relay_address=""))
        assert "w0" in _sources(state, late)
        _earn(state, late, REPORT_STANDING_GROUPS - 1)  # short of standing by one group
        assert _report(state, late, "w0") == "reporter"
        assert "w0" not in _sources(state, late)  # the reporter itself stops pulling from it
    assert state.versions.dissemination.suspects == set()
    assert _sources(state, "w1")[0] == "w0"  # everyone else still pulls from the honest relay


def test_reports_with_standing_drop_nothing_until_the_coordinators_check_confirms_them(tmp_path, tiny_model_dir):
    """However many reporters with standing: each asks for one check (of that chunk), and only
    the check's verdict drops the relay for everyone (the fetch itself: test_relay_checks.py)."""
    state = _fleet(tmp_path, tiny_model_dir, workers=4)
    for reporter in ("w1", "w2"):
        assert "w0" in _sources(state, reporter)
        _earn(state, reporter, REPORT_STANDING_GROUPS)
    assert _report(state, "w1", "w0") == "check" and _report(state, "w2", "w0") == "check"
    assert state.versions.dissemination.suspects == set()
    reports = state.versions.dissemination.reports
    check = reports.next_check()
    assert check.key == ("w0", 0, "full", 0) and check.reporters == {"w1", "w2"}
    assert reports.next_check() is None  # one check for both reports
    state.worker_desk.relay_checked(check, "bad", "sha256 " + "0" * 64)
    assert state.versions.dissemination.suspects == {"w0"}
    assert "w0" not in _sources(state, "w3")
    assert _report(state, "w2", "w0") == "everyone"  # caught already: no check is asked for


def test_a_relay_that_cannot_be_reached_confirms_nothing(tmp_path, tiny_model_dir):
    state = _fleet(tmp_path, tiny_model_dir, workers=3)
    _earn(state, "w1", REPORT_STANDING_GROUPS)
    assert "w0" in _sources(state, "w1") and _report(state, "w1", "w0") == "check"
    state.worker_desk.relay_checked(state.versions.dissemination.reports.next_check(), "unreachable", "HTTP 503")
    assert state.versions.dissemination.suspects == set() and state.versions.dissemination.reports.refuted == {}
    assert _sources(state, "w2")[0] == "w1" and "w0" in _sources(state, "w2")
    assert _report(state, "w1", "w0") == "reporter"  # the verdict is kept for the version: no second fetch


def test_standing_belongs_to_a_registration(tmp_path, tiny_model_dir):
    """An id that earned standing and registers again starts over: its reports count for itself only."""
    state = _fleet(tmp_path, tiny_model_dir, workers=4)
    _earn(state, "w2", REPORT_STANDING_GROUPS)
    assert "w0" in _sources(state, "w1") and "w0" in _sources(state, "w2")
    _earn(state, "w1", REPORT_STANDING_GROUPS)
    state.worker_desk.leave(LeaveRequest(worker_id="w1"))
    state.worker_desk.register(RegisterRequest(worker_id="w1", engine="hf", relay_address="http://10.0.0.1:80"))
    assert "w0" in _sources(state, "w1")
    assert _report(state, "w1", "w0") == "reporter"  # asks for no check: its standing went with its leave
    assert _report(state, "w2", "w0") == "check"  # w2 kept its registration and its standing
    assert state.versions.dissemination.reports.next_check().reporters == {"w2"}
