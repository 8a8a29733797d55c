"""The order news goes out in (`coordinator.parts.news_order`): the relay tree depth first,
ancestors before the workers they feed, and idle turns that wrap around the tree."""

from __future__ import annotations

from echo2.coordinator.parts.dissemination import _for_version
from echo2.coordinator.parts.news_order import IdleTurns, TreeOrder, tree_order
from echo2.protocol.broadcast import Assignment, BroadcastPlan, Source

# the learner feeds a and e; a feeds b and d; b feeds c
TREE = {"a": ["b", "d"], "b": ["c"], "c": [], "d": [], "e": []}


def _plan(version: int = 3) -> BroadcastPlan:
    def assignment(worker_id: str) -> Assignment:
        return Assignment(version=version, worker_id=worker_id, mode="pipelined", children=TREE[worker_id],
                          sources=[Source(peer_id="origin", url="http://learner")], edge_rate_bytes_per_s=1.0,
                          planned_rate_bytes_per_s=1.0)
    return BroadcastPlan(version=version, mode="pipelined", stream_rate_bytes_per_s=1.0, origin_children=["a", "e"],
                         assignments=[assignment(w) for w in ("e", "d", "c", "b", "a")])


def test_the_tree_is_read_depth_first_with_each_workers_parent():
    order = tree_order(_plan())
    assert order.preorder == ("a", "b", "c", "d", "e")
    assert order.parent == {"b": "a", "c": "b", "d": "a"}
    assert tree_order(None) == TreeOrder()


def test_the_order_is_made_once_per_tree_and_rides_along_to_the_next_version():
    plan = _plan()
    order = tree_order(plan)
    assert tree_order(plan) is order
    assert tree_order(_for_version(plan, 4)) is order  # same tree, the next version


def test_a_worker_comes_after_its_ancestors_root_first_each_chosen_once():
    order, chosen = tree_order(_plan()), {}
    order.with_ancestors(["c", "d", "e"], chosen)
    assert list(chosen) == ["a", "b", "c", "d", "e"]


def test_idle_turns_take_runs_of_the_order_and_wrap_around():
    order, turns, nobody = tree_order(_plan()), IdleTurns(), lambda worker_id: False
    assert turns.next_run(order, 2, told=nobody) == ["a", "b"]
    assert turns.next_run(order, 2, told=nobody) == ["c", "d"]
    assert turns.next_run(order, 2, told=nobody) == ["e", "a"]  # wrapped
    assert turns.next_run(order, 9, told=nobody) == ["b", "c", "d", "e", "a"]  # each worker once at most
    assert IdleTurns().next_run(TreeOrder(), 3, told=nobody) == []


def test_idle_turns_pass_over_the_workers_told_already():
    order, turns = tree_order(_plan()), IdleTurns()
    told = {"b", "c"}.__contains__
    assert turns.next_run(order, 2, told=told) == ["a", "d"]
    assert turns.next_run(order, 2, told=told) == ["e", "a"]
    assert turns.next_run(order, 9, told=lambda worker_id: True) == []  # everyone heard: nothing
    chosen = {}
    order.with_ancestors(["c"], chosen, told={"a"}.__contains__)
    assert list(chosen) == ["b", "c"]  # a chain stops at an ancestor told already
