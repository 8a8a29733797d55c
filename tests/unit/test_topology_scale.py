"""The broadcast topology at 10,000 workers: plan_broadcast, late_joiner_assignment and
BroadcastPlan.for_worker return exactly what the versions before them did (kept in
tests/unit/topology_reference.py) on random peers and configs, and they do bounded work per
worker (counted, not timed: timings are benchmarks/policy_scale.py's)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit import topology_reference as reference

from echo2.broadcast import topology
from echo2.broadcast.topology import fastest_first, late_joiner_assignment, plan_broadcast
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.broadcast import Assignment, BroadcastPlan, OriginInfo, PeerInfo

MBIT = 125_000.0
# a few link speeds shared by many workers make ties in uplink share, where the tie-breaks
# (subtree, depth, placement order) decide; continuous speeds exercise the float arithmetic
LINKS = [20 * MBIT, 50 * MBIT, 100 * MBIT, 200 * MBIT, 1000 * MBIT]
speeds = st.one_of(st.sampled_from(LINKS), st.floats(min_value=1e3, max_value=1e10))


@st.composite
def peer_sets(draw, max_size: int = 300) -> list[PeerInfo]:
    n = draw(st.one_of(st.integers(0, 12), st.integers(13, max_size)))
    unreachable_share = draw(st.sampled_from([0.0, 0.2, 0.9]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    # "links": a few shared speeds; "multiples": equal downlinks and uplinks of 1-4 times them
    # (the shapes where uplink shares tie most, so the tie-breaks decide); else continuous
    speeds_from = draw(st.sampled_from(["links", "multiples", "continuous"]))

    def link(upload: bool) -> float:
        if speeds_from == "links":
            return rng.choice(LINKS)
        if speeds_from == "multiples":
            return 10 * MBIT * (rng.randint(1, 4) if upload else 1)
        return rng.uniform(1e5, 1e9)

    peers = []
    for i in range(n):
        reachable = rng.random() >= unreachable_share
        # an unreachable worker may still have told us a URL (ignored: it is a leaf)
        url = f"http://w{i}:1" if reachable or rng.random() < 0.5 else ""
        peers.append(PeerInfo(peer_id=f"w{rng.randrange(10**6)}-{i}", url=url, upload_bytes_per_s=link(True),
                              download_bytes_per_s=link(False), reachable=reachable))
    return peers


configs = st.builds(
    BroadcastConfig,
    mode=st.sampled_from(["pipelined", "pipelined", "pipelined", "one_to_many"]),
    max_first_hop=st.integers(1, 6),
    max_fanout=st.integers(1, 10),
    max_depth=st.one_of(st.integers(1, 6), st.integers(1, 70)),
    max_sources=st.integers(1, 6),
)
origins = st.builds(OriginInfo, url=st.just("http://learner:1"),
                    upload_bytes_per_s=st.one_of(speeds, st.sampled_from([10 * MBIT, 20 * MBIT, 30 * MBIT])))


def assert_identical(new: BroadcastPlan | Assignment, old: BroadcastPlan | Assignment) -> None:
    """Equal, serialized alike, and the same fields set (model_dump(exclude_unset=True) too)."""
    assert new == old
    assert new.model_dump_json() == old.model_dump_json()
    assert new.model_dump(exclude_unset=True) == old.model_dump(exclude_unset=True)


@settings(max_examples=300, deadline=None)
@given(peers=peer_sets(), origin=origins, config=configs, version=st.integers(0, 10**6))
def test_plan_broadcast_returns_what_the_linear_scan_did(peers, origin, config, version):
    assert_identical(plan_broadcast(version, origin, peers, config),
                     reference.plan_broadcast(version, origin, peers, config))


def test_a_large_fleet_plans_as_before_in_both_shapes():
    """One realistic large fleet (30% behind NAT, mixed links) as a tree and as chains."""
    rng = random.Random(7)
    peers = [PeerInfo(peer_id=f"w{i}", url=f"http://w{i}:1" if (reachable := rng.random() > 0.3) else "",
                      upload_bytes_per_s=rng.choice(LINKS), download_bytes_per_s=rng.choice(LINKS),
                      reachable=reachable) for i in range(2000)]
    origin = OriginInfo(url="http://learner:1", upload_bytes_per_s=1000 * MBIT)
    for config in (BroadcastConfig(), BroadcastConfig(max_fanout=1)):
        assert plan_broadcast(3, origin, peers, config) == reference.plan_broadcast(3, origin, peers, config)


def test_equal_shares_and_subtrees_go_to_the_shallowest_relay_before_the_first_placed():
    """Found by a random search: a relay placed later but shallower wins the tie-break on depth
    (ordering the heap by placement before depth misses it)."""
    uplinks = [3, 3, 3, 1, 1, 3, 3, 2, 3, 2, 2, 3, 3]
    peers = [PeerInfo(peer_id=f"w{i:02d}", url="" if i in (2, 5) else f"http://w{i}:1", reachable=i not in (2, 5),
                      upload_bytes_per_s=up * MBIT, download_bytes_per_s=MBIT) for i, up in enumerate(uplinks)]
    origin = OriginInfo(url="http://learner:1", upload_bytes_per_s=3 * MBIT)
    config = BroadcastConfig(max_first_hop=1, max_fanout=1, max_depth=4, max_sources=2)
    assert_identical(plan_broadcast(1, origin, peers, config), reference.plan_broadcast(1, origin, peers, config))


def test_bad_inputs_fail_as_before():
    origin = OriginInfo(url="http://learner:1", upload_bytes_per_s=MBIT)
    peers = [PeerInfo(peer_id="w", url="http://w:1", upload_bytes_per_s=MBIT, download_bytes_per_s=MBIT)]
    for version, given_peers in ((-1, peers), ("x", peers), (1, peers + peers)):
        with pytest.raises(ValueError) as new:
            plan_broadcast(version, origin, given_peers, BroadcastConfig())
        with pytest.raises(ValueError) as old:
            reference.plan_broadcast(version, origin, given_peers, BroadcastConfig())
        assert type(new.value) is type(old.value) and str(new.value) == str(old.value)


@settings(max_examples=100, deadline=None)
@given(holders=peer_sets(max_size=120), origin=origins, config=configs, version=st.integers(0, 100),
       joiner_index=st.integers(0, 200), copies=st.integers(0, 2))
def test_late_joiner_assignment_returns_what_the_sort_did(holders, origin, config, version, joiner_index, copies):
    # a joiner among the holders (skipped by both), and holders listed twice (ties in input order)
    holders = holders + holders[:copies]
    joiner = holders[joiner_index] if joiner_index < len(holders) else PeerInfo(
        peer_id="joiner", upload_bytes_per_s=MBIT, download_bytes_per_s=MBIT, reachable=False)
    before = reference.late_joiner_assignment(version, joiner, holders, origin=origin, config=config)
    assert_identical(late_joiner_assignment(version, joiner, holders, origin=origin, config=config), before)
    ordered = fastest_first(holders)  # what a caller keeps once per version
    assert_identical(late_joiner_assignment(version, joiner, ordered, origin=origin, config=config,
                                            holders_ordered=True), before)


def test_a_late_joiner_given_ordered_holders_looks_at_the_first_few_only():
    holders = fastest_first([PeerInfo(peer_id=f"w{i}", url="" if i % 3 == 0 else f"http://w{i}:1",
                                      reachable=i % 3 != 0, upload_bytes_per_s=(1 + i % 7) * MBIT,
                                      download_bytes_per_s=MBIT) for i in range(10_000)])
    looked_at = 0

    def counted():
        nonlocal looked_at
        for holder in holders:
            looked_at += 1
            yield holder

    joiner = PeerInfo(peer_id="late", upload_bytes_per_s=MBIT, download_bytes_per_s=MBIT, reachable=False)
    origin = OriginInfo(url="http://learner:1", upload_bytes_per_s=MBIT)
    config = BroadcastConfig(max_sources=4)
    got = late_joiner_assignment(1, joiner, counted(), origin=origin, config=config, holders_ordered=True)
    assert got == reference.late_joiner_assignment(1, joiner, holders, origin=origin, config=config)
    assert looked_at <= 3 + 2  # three usable ones, past at most a couple behind NAT


@settings(max_examples=60, deadline=None)
@given(peers=peer_sets(max_size=80), config=configs, data=st.data())
def test_for_worker_answers_as_the_scan_did(peers, config, data):
    origin = OriginInfo(url="http://learner:1", upload_bytes_per_s=100 * MBIT)
    plan = plan_broadcast(1, origin, peers, config)
    if data.draw(st.booleans()) and plan.assignments:  # a plan from the wire may name a worker twice
        doubled = plan.assignments + [plan.assignments[0].model_copy(update={"depth": 9})]
        plan = BroadcastPlan.model_validate({**plan.model_dump(), "assignments": [a.model_dump() for a in doubled]})
    asked = [p.peer_id for p in peers] + ["nobody", ""]
    for worker_id in data.draw(st.permutations(asked)):
        try:
            expected = reference.for_worker(plan, worker_id)
        except ValueError as missing:
            with pytest.raises(ValueError) as raised:
                plan.for_worker(worker_id)
            assert str(raised.value) == str(missing)
        else:
            assert plan.for_worker(worker_id) is expected


def test_the_index_leaves_equality_json_and_copies_as_they_were():
    peers = [PeerInfo(peer_id=f"w{i}", url=f"http://w{i}:1", upload_bytes_per_s=MBIT, download_bytes_per_s=MBIT)
             for i in range(5)]
    plan = plan_broadcast(1, OriginInfo(url="http://learner:1", upload_bytes_per_s=MBIT), peers, BroadcastConfig())
    untouched = plan.model_copy(deep=True)
    dumped, text = plan.model_dump(), plan.model_dump_json()
    plan.for_worker("w3")  # builds the index
    assert plan == untouched and untouched == plan
    assert plan.model_dump() == dumped and plan.model_dump_json() == text and repr(plan) == repr(untouched)
    assert BroadcastPlan.model_validate_json(plan.model_dump_json()) == plan
    # a copy with other assignments must not answer from the index it copied
    fewer = plan.model_copy(update={"assignments": plan.assignments[:2]})
    with pytest.raises(ValueError, match="'w3' is not in the plan"):
        fewer.for_worker("w3")


class CountingList(list):
    iterations = 0

    def __iter__(self):
        CountingList.iterations += 1
        return super().__iter__()


def test_for_worker_reads_the_assignments_once_not_once_per_call():
    assignments = [Assignment(version=1, worker_id=f"w{i}", mode="one_to_many",
                              sources=[{"peer_id": "origin", "url": "http://learner:1"}],
                              edge_rate_bytes_per_s=1.0, planned_rate_bytes_per_s=1.0) for i in range(1000)]
    plan = BroadcastPlan.model_construct(version=1, mode="one_to_many", stream_rate_bytes_per_s=1.0,
                                         origin_children=[], assignments=CountingList(assignments))
    CountingList.iterations = 0
    for i in range(1000):
        assert plan.for_worker(f"w{i}").worker_id == f"w{i}"
    assert CountingList.iterations == 1  # the index, built on the first call


@pytest.mark.parametrize("max_fanout", [8, 1])
def test_placing_a_worker_looks_at_a_few_relays_not_all_of_them(monkeypatch, max_fanout):
    """The old scan looked at every relay for every worker placed past the free slots (about
    relays x workers); the heap refreshes a few stale entries per placement."""
    rng = random.Random(3)
    peers = [PeerInfo(peer_id=f"w{i}", url=f"http://w{i}:1" if (reachable := rng.random() > 0.3) else "",
                      upload_bytes_per_s=rng.choice(LINKS), download_bytes_per_s=rng.choice(LINKS),
                      reachable=reachable) for i in range(2000)]
    looked_at = []
    cost = topology._cost
    monkeypatch.setattr(topology, "_cost", lambda node: looked_at.append(node) or cost(node))
    plan_broadcast(1, OriginInfo(url="http://learner:1", upload_bytes_per_s=1000 * MBIT), peers,
                   BroadcastConfig(max_fanout=max_fanout))
    assert len(looked_at) < 4 * len(peers)
