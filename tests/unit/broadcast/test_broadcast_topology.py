"""Topology: chains for equal links, d-ary trees for larger uplinks, NAT'd workers as leaves,
ancestors as fallbacks, and structural invariants for any peer set (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2.broadcast.topology import late_joiner_assignment, plan_broadcast
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.broadcast import ORIGIN_ID, Assignment, BroadcastPlan, OriginInfo, PeerInfo

MBIT = 125_000.0
B = 100 * MBIT
ORIGIN = OriginInfo(url="http://learner:1", upload_bytes_per_s=B)


def _peers(n: int, up: float = B, down: float = B, reachable: bool = True, prefix: str = "w") -> list[PeerInfo]:
    return [
        PeerInfo(peer_id=f"{prefix}{i:02d}", url=f"http://{prefix}{i}:1" if reachable else "",
                 upload_bytes_per_s=up, download_bytes_per_s=down, reachable=reachable)
        for i in range(n)
    ]


def _parent(plan: BroadcastPlan, worker: str) -> str:
    return plan.for_worker(worker).sources[0].peer_id


def test_equal_links_give_a_chain_with_ancestors_as_fallbacks() -> None:
    plan = plan_broadcast(7, ORIGIN, _peers(6), BroadcastConfig(max_sources=3))
    assert plan.origin_children == ["w00"]
    assert [_parent(plan, f"w{i:02d}") for i in range(1, 6)] == ["w00", "w01", "w02", "w03", "w04"]
    last = plan.for_worker("w05")
    assert [s.peer_id for s in last.sources] == ["w04", "w03", ORIGIN_ID]
    assert last.depth == 6 and last.planned_rate_bytes_per_s == B and last.version == 7
    assert plan.for_worker("w02").children == ["w03"]


def test_larger_uplinks_give_a_d_ary_tree() -> None:
    plan = plan_broadcast(1, ORIGIN, _peers(21, up=4 * B), BroadcastConfig(max_fanout=8))
    children = {a.worker_id: a.children for a in plan.assignments}
    assert plan.origin_children == ["w00"]
    assert len(children["w00"]) == 4 and all(len(c) <= 4 for c in children.values())
    assert max(a.depth for a in plan.assignments) == 3  # 1 + 4 + 16 workers
    assert all(a.planned_rate_bytes_per_s == B for a in plan.assignments)


def test_learner_feeds_a_few_first_hop_peers_when_its_uplink_allows() -> None:
    fast_origin = OriginInfo(url="http://learner:1", upload_bytes_per_s=10 * B)
    plan = plan_broadcast(1, fast_origin, _peers(8), BroadcastConfig(max_first_hop=3))
    assert len(plan.origin_children) == 3


def test_unreachable_and_slow_workers_are_leaves() -> None:
    peers = _peers(4) + _peers(2, reachable=False, prefix="nat") + _peers(1, down=B / 10, prefix="slow")
    plan = plan_broadcast(1, ORIGIN, peers, BroadcastConfig())
    for leaf in ("nat00", "nat01", "slow00"):
        assert plan.for_worker(leaf).children == []
        assert all(leaf not in [s.peer_id for s in a.sources] for a in plan.assignments)
    assert plan.for_worker("slow00").planned_rate_bytes_per_s == B / 10


def test_extra_leaves_load_the_chain_tail_not_the_learner() -> None:
    plan = plan_broadcast(1, ORIGIN, _peers(4) + _peers(3, reachable=False, prefix="nat"), BroadcastConfig())
    assert plan.origin_children == ["w00"]  # the whole chain keeps the learner's full uplink
    assert {_parent(plan, f"nat{i:02d}") for i in range(3)} <= {"w03", "w02", "w01"}


def test_max_depth_caps_the_chain() -> None:
    plan = plan_broadcast(1, ORIGIN, _peers(10), BroadcastConfig(max_depth=4))
    assert max(a.depth for a in plan.assignments) == 4


def test_one_to_many_serves_everyone_from_the_learner() -> None:
    plan = plan_broadcast(2, ORIGIN, _peers(5), BroadcastConfig(mode="one_to_many"))
    assert all([s.peer_id for s in a.sources] == [ORIGIN_ID] for a in plan.assignments)
    assert all(a.planned_rate_bytes_per_s == pytest.approx(B / 5) for a in plan.assignments)


def test_assignment_roundtrips_through_json() -> None:
    assignment = plan_broadcast(3, ORIGIN, _peers(3), BroadcastConfig()).for_worker("w02")
    assert Assignment.model_validate_json(assignment.model_dump_json()) == assignment
    assert '"kind":"broadcast_assignment"' in assignment.model_dump_json()


def test_bad_peer_lists_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        plan_broadcast(1, ORIGIN, _peers(2) + _peers(1), BroadcastConfig())
    with pytest.raises(ValueError, match="reachable=False"):
        plan_broadcast(1, ORIGIN, [PeerInfo(peer_id="x", upload_bytes_per_s=1, download_bytes_per_s=1)],
                       BroadcastConfig())


def test_late_joiner_pulls_from_fastest_reachable_holders_then_learner() -> None:
    holders = _peers(2, up=B) + _peers(1, up=3 * B, prefix="fast") + _peers(1, reachable=False, prefix="nat")
    joiner = _peers(1, prefix="late")[0]
    assignment = late_joiner_assignment(4, joiner, holders, origin=ORIGIN,
                                        config=BroadcastConfig(max_sources=3))
    assert [s.peer_id for s in assignment.sources] == ["fast00", "w00", ORIGIN_ID]
    alone = late_joiner_assignment(4, joiner, [], origin=ORIGIN, config=BroadcastConfig())
    assert [s.peer_id for s in alone.sources] == [ORIGIN_ID]


peer_sets = st.lists(
    st.tuples(st.floats(1e5, 1e9), st.floats(1e5, 1e9), st.booleans()), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(specs=peer_sets, origin_up=st.floats(1e5, 1e10), fanout=st.integers(1, 6), sources=st.integers(1, 5),
       depth=st.integers(1, 10))
def test_any_plan_is_a_tree_rooted_at_the_learner(
    specs: list[tuple[float, float, bool]], origin_up: float, fanout: int, sources: int, depth: int
) -> None:
    peers = [PeerInfo(peer_id=f"p{i}", url=f"http://p{i}:1" if ok else "", upload_bytes_per_s=up,
                      download_bytes_per_s=down, reachable=ok) for i, (up, down, ok) in enumerate(specs)]
    config = BroadcastConfig(max_fanout=fanout, max_sources=sources, max_depth=depth)
    plan = plan_broadcast(1, OriginInfo(url="http://o:1", upload_bytes_per_s=origin_up), peers, config)
    by_id = {a.worker_id: a for a in plan.assignments}
    assert sorted(by_id) == sorted(p.peer_id for p in peers)
    unreachable = {p.peer_id for p in peers if not p.reachable}
    for assignment in plan.assignments:
        ids = [s.peer_id for s in assignment.sources]
        assert len(ids) <= sources and len(set(ids)) == len(ids)
        assert ids[-1] == ORIGIN_ID or (sources == 1 and assignment.depth > 1)
        assert not unreachable & set(ids) and not (assignment.worker_id in unreachable and assignment.children)
        # walking parents reaches the learner in exactly `depth` hops, through the listed fallbacks
        node, hops, ancestors = assignment, 0, []
        while node.sources[0].peer_id != ORIGIN_ID:
            ancestors.append(node.sources[0].peer_id)
            node, hops = by_id[node.sources[0].peer_id], hops + 1
        assert hops + 1 == assignment.depth <= depth
        assert [i for i in ids if i != ORIGIN_ID] == ancestors[: len([i for i in ids if i != ORIGIN_ID])]
