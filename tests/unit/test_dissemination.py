"""The coordinator's broadcast planning: a relay tree per version over live workers, late
joiners pointed at holders, reported peers avoided, and only reports from workers that were
sent to the peer counting, for a bounded number of versions."""

from __future__ import annotations

from tests.unit.coordinator_helpers import FakeClock, make_state, publish, version_info

from echo2.config.broadcast import BroadcastConfig
from echo2.coordinator.parts.dissemination import Dissemination
from echo2.coordinator.parts.peers import Peer
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


MANIFEST = version_info(3).signed.unverified_manifest()
"""What a report is checked against (its version does not matter to Dissemination)."""


def _confirmed(diss: Dissemination, peer_id: str, reporter_id: str, version: int) -> str:
    """A report with standing; the check it asks for (if any) gets bad bytes from the peer."""
    effect = diss.report(peer_id, reporter_id, version, standing=True, manifest=MANIFEST)
    if effect == "check":
        diss.reports.checked(diss.reports.next_check(), "bad")
    return effect


def test_late_joiner_pulls_from_a_holder_and_suspects_are_skipped():
    diss = Dissemination(BroadcastConfig(), learner_upload_bps=1e9)
    diss.plan_version(3, ORIGIN, peers(2))
    live = peers(2, version=3) + [Peer("late", "http://10.0.0.9:80", 1e9, 1e9, -1)]
    assert [s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources][-1] == "origin"
    assert {s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources} >= {"w0"}
    assert [s.peer_id for s in diss.assignment("w1", 3, ORIGIN, live).sources] == ["w0", "origin"]
    assert diss.report("w0", "w1", 3, standing=True) == "reporter"  # one report: only the reporter avoids w0
    assert "w0" not in [s.peer_id for s in diss.assignment("w1", 3, ORIGIN, live).sources]
    assert "w0" in [s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources]
    assert diss.report("w0", "w1", 3, standing=True) == "reporter"  # the same reporter again is still one
    assert _confirmed(diss, "w0", "late", 3) == "check"  # checked, and caught: no one uses it
    assert "w0" not in [s.peer_id for s in diss.assignment("late", 3, ORIGIN, live).sources]
    assert diss.report("w1", "w1", 3, standing=True) == "none"  # reporting oneself means nothing


def test_a_report_counts_only_from_a_worker_sent_to_that_peer_for_that_version():
    """Two ids that were never children of a relay once dropped it for everyone."""
    diss = Dissemination(BroadcastConfig(max_sources=2), learner_upload_bps=1e9)
    diss.plan_version(3, ORIGIN, peers(4))  # a chain w0 -> w1 -> w2 -> w3, each with the origin to fall back on
    given = {w: [s.peer_id for s in diss.assignment(w, 3, ORIGIN, peers(4)).sources] for w in ("w1", "w3")}
    assert given["w1"] == ["w0", "origin"] and "w0" not in given["w3"]
    # w3 and a registered id that never asked for version 3 report w0: neither was sent there
    assert diss.report("w0", "w3", 3, standing=True) == "none" and diss.report("w0", "w2", 3, standing=True) == "none"
    assert diss.report("w0", "w1", 2, standing=True) == "none"  # its real parent, but for a version it was not assigned
    assert diss.report("w0", "w1", 10**9, standing=True) == "none"  # a made-up version has no assignment either
    assert diss.suspects == set() and diss.reports.reporters == {}
    assert [s.peer_id for s in diss.assignment("w1", 3, ORIGIN, peers(4)).sources] == ["w0", "origin"]
    assert [s.peer_id for s in diss.assignment("w3", 3, ORIGIN, peers(4)).sources] == given["w3"]
    assert diss.plan_version(4, ORIGIN, peers(4)).origin_children == ["w0"]  # w0 still relays the next version


def test_reports_from_real_children_drop_a_relay_and_expire():
    config = BroadcastConfig(max_sources=2, report_lifetime_versions=3)
    diss = Dissemination(config, learner_upload_bps=1e9)
    star = [Peer("hub", "http://10.0.0.1:80", 1e10, 1e9, -1)] + \
           [Peer(f"c{i}", f"http://10.0.0.{i + 2}:80", 1e6, 1e9, -1) for i in range(2)]
    plan = diss.plan_version(5, ORIGIN, star)
    assert {a.worker_id: a.sources[0].peer_id for a in plan.assignments} == {"hub": "origin", "c0": "hub", "c1": "hub"}
    for child in ("c0", "c1"):
        assert diss.assignment(child, 5, ORIGIN, star).sources[0].peer_id == "hub"
    assert diss.report("hub", "c0", 5, standing=True) == "reporter"  # no manifest to check against
    assert diss.suspects == set()
    assert _confirmed(diss, "hub", "c1", 5) == "check"
    assert diss.suspects == {"hub"}
    for version in (6, 7):  # the report for version 5 counts for versions 5, 6 and 7
        later = diss.plan_version(version, ORIGIN, [Peer(p.worker_id, p.relay_address, p.upload_bps, p.download_bps,
                                                          version - 1) for p in star])
        assert all("hub" not in [s.peer_id for s in a.sources] for a in later.assignments), version
    assert diss.report("hub", "c0", 5, standing=True) == "everyone"  # within its window a report still counts
    expired = diss.plan_version(8, ORIGIN, star)
    assert diss.suspects == set() and diss.reports.reporters == {}  # version 8: the reports for version 5 are gone
    assert {a.worker_id: a.sources[0].peer_id for a in expired.assignments}["c0"] == "hub"
    assert diss.report("hub", "c0", 5, standing=True) == "none"  # too old to count now
    assert all(version > 5 for version in diss.assigned)  # bounded record



def test_unreachable_worker_is_a_leaf():
    nat = [Peer("nat", "", 1e9, 1e9, -1)] + peers(2)
    plan = Dissemination(BroadcastConfig(), learner_upload_bps=1e9).plan_version(1, ORIGIN, nat)
    assert all("nat" not in [s.peer_id for s in a.sources] for a in plan.assignments)


def test_state_hands_assignments_in_heartbeats_and_takes_bad_peer_reports(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    for i in range(2):
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.{i}:80"))
    publish(state, 0)
    reply = state.worker_desk.heartbeat(Heartbeat(worker_id="w1", version=-1))
    assert reply.assignment is not None and [s.peer_id for s in reply.assignment.sources] == ["w0", "origin"]
    assert reply.learner_public_key == state.versions.public_key_hex
    report = BadPeerReport(version=0, reporter_id="w1", peer_id="w0", url="http://10.0.0.0:80", chunk_index=2,
                           reason="corrupt_chunk", detail="sha256 mismatch")
    state.worker_desk.bad_peer(BadPeerRequest(report=report))
    sources = state.worker_desk.heartbeat(Heartbeat(worker_id="w1", version=-1)).assignment.sources
    assert [s.peer_id for s in sources] == ["origin"]
    assert state.worker_desk.heartbeat(Heartbeat(worker_id="w0", version=0)).assignment is None  # it holds the newest
    assert [e.avoided_by for e in state.events if e.kind == "bad_peer"] == ["reporter"]


def test_a_report_from_a_worker_never_sent_to_the_peer_is_recorded_as_changing_nothing(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    for i in range(3):
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.{i}:80"))
    publish(state, 0)
    sources = state.worker_desk.heartbeat(Heartbeat(worker_id="w1", version=-1)).assignment.sources
    assert [s.peer_id for s in sources] == ["w0", "origin"]
    for liar in ("w2", "w0"):  # w2 never asked for version 0; w0, w1's parent, never had w1 as a source
        report = BadPeerReport(version=0, reporter_id=liar, peer_id="w0" if liar == "w2" else "w1", url="",
                               chunk_index=0, reason="corrupt_chunk")
        state.worker_desk.bad_peer(BadPeerRequest(report=report))
    events = [e for e in state.events if e.kind == "bad_peer"]
    assert [(e.reporter_id, e.took_effect, e.avoided_by) for e in events] == [("w2", False, "none"),
                                                                             ("w0", False, "none")]
    assert state.versions.dissemination.suspects == set()
    sources = state.worker_desk.heartbeat(Heartbeat(worker_id="w1", version=-1)).assignment.sources
    assert [s.peer_id for s in sources] == ["w0", "origin"]
    sources = state.worker_desk.heartbeat(Heartbeat(worker_id="w2", version=-1)).assignment.sources
    assert "w0" in [s.peer_id for s in sources]



def test_bad_peer_reports_are_bounded():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        BadPeerReport(version=0, reporter_id="w1", peer_id="w0", url="", chunk_index=0, reason="corrupt_chunk",
                      detail="x" * 10_000)
    with pytest.raises(ValidationError):
        BadPeerReport(version=0, reporter_id="w1" * 200, peer_id="w0", url="", chunk_index=0, reason="corrupt_chunk")


def test_a_plan_over_the_same_workers_is_the_last_tree_for_the_new_version():
    """The tree is not made again per version when nothing it is made from changed: the result
    equals a plan made from scratch, and a changed link or a new suspect plans anew."""
    fresh = Dissemination(BroadcastConfig(max_fanout=2), learner_upload_bps=1e9)
    diss = Dissemination(BroadcastConfig(max_fanout=2), learner_upload_bps=1e9)
    fleet = peers(6)
    first = diss.make_plan(3, ORIGIN, fleet, set())
    again = diss.make_plan(4, ORIGIN, fleet, set())
    made = fresh.adopt(fresh.make_plan(4, ORIGIN, fleet, set()))
    assert (again.version, again.origin_children) == (made.version, made.origin_children)
    diss.adopt(again)  # each worker is given what a plan made from scratch gives it, for version 4
    for p in fleet:
        given = diss.assignment(p.worker_id, 4, ORIGIN, fleet)
        assert given == made.for_worker(p.worker_id) and given.version == 4
    assert diss._planned_from[1] is first  # the tree was not made again
    slower = [Peer(p.worker_id, p.relay_address, p.upload_bps / 10, p.download_bps, p.version) for p in fleet]
    assert diss.make_plan(5, ORIGIN, slower, set()) == fresh.make_plan(5, ORIGIN, slower, set())
    assert diss._planned_from[1] is not first
    suspected = diss.make_plan(6, ORIGIN, slower, {"w0"})
    assert suspected == fresh.make_plan(6, ORIGIN, slower, {"w0"}) and "w0" not in suspected.origin_children


class _NoPass(dict):
    """A view's workers that fail any pass over them (a plan reused as it should be makes none)."""

    def values(self):
        raise AssertionError("a pass over the fleet")

    def __iter__(self):
        raise AssertionError("a pass over the fleet")


def test_a_steady_fleet_is_planned_without_a_pass_over_it(tmp_path, tiny_model_dir):
    """The registry's view for a plan is the last one while no worker joins or leaves, and a
    plan over it is the last tree without a pass over the workers; a join or a departure
    (leave, timeout, quarantine all go through `depart`) plans anew over the new fleet."""
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    for i in range(4):
        state.worker_desk.register(RegisterRequest(worker_id=f"w{i}", engine="hf", relay_address=f"http://10.0.0.{i}:80"))
    registry, diss = state.registry, Dissemination(BroadcastConfig(max_fanout=2), learner_upload_bps=1e9)
    view = registry.peers_for_plan()
    first = diss.adopt(diss.make_plan(3, ORIGIN, view, set()))
    assert registry.peers_for_plan() is view
    view.by_id = _NoPass(view.by_id)
    again = diss.make_plan(4, ORIGIN, registry.peers_for_plan(), set())
    assert (again.version, again.origin_children) == (4, first.origin_children) and diss._planned_from[1] is first
    state.worker_desk.register(RegisterRequest(worker_id="w4", engine="hf", relay_address="http://10.0.0.4:80"))
    grown = diss.make_plan(5, ORIGIN, registry.peers_for_plan(), set())
    assert {a.worker_id for a in grown.assignments} == {f"w{i}" for i in range(5)}
    registry.depart(registry.workers["w0"])
    shrunk = diss.make_plan(6, ORIGIN, registry.peers_for_plan(), set())
    assert {a.worker_id for a in shrunk.assignments} == {f"w{i}" for i in range(1, 5)}
