"""Dissemination latency models: hand-computed values and the scaling each topology promises."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo2.planner import dissemination as dis

GB16 = 16e9  # bf16 8B model, ~16 GB
MIB64 = 64 << 20


def test_one_copy_at_one_gigabit_takes_128_seconds():
    assert dis.ideal_s(GB16, 1e9) == pytest.approx(128.0)
    assert dis.one_to_many_s(GB16, 1, 10e9, 1e9) == pytest.approx(128.0)  # the worker link binds
    assert dis.chain_s(GB16, 1, 1e9, 1e9, MIB64) == pytest.approx(128.0)


def test_one_to_many_is_linear_in_workers():
    # 10 Gbit/s learner: 12.8 s per copy once the learner link binds
    assert dis.one_to_many_s(GB16, 20, 10e9, 10e9) == pytest.approx(20 * 12.8)
    assert dis.one_to_many_s(GB16, 40, 10e9, 10e9) == pytest.approx(40 * 12.8)


def test_chain_by_hand():
    # M/min(b_L, b) + (N-1) c/b + N hop = 128 + 9 * 0.536870912 + 10 * 0.05
    expected = 128 + 9 * MIB64 * 8 / 1e9 + 10 * 0.05
    assert dis.chain_s(GB16, 10, 10e9, 1e9, MIB64, 0.05) == pytest.approx(expected)


def test_tree_by_hand():
    # 6 workers, fanout 2: levels 2 + 4 -> L = 2; stream 2 * 128 s, one extra level of 2 chunks
    assert dis.tree_levels(6, 2) == 2
    expected = 2 * 128 + 1 * 2 * MIB64 * 8 / 1e9 + 2 * 0.1
    assert dis.tree_s(GB16, 6, 10e9, 1e9, MIB64, 2, 0.1) == pytest.approx(expected)


def test_tree_levels():
    assert [dis.tree_levels(n, 2) for n in (1, 2, 3, 6, 7, 14, 15)] == [1, 1, 2, 2, 3, 3, 4]
    assert dis.tree_levels(5, 1) == 5
    assert dis.tree_levels(0, 3) == 0


def test_peer_assisted_stays_near_ideal_while_one_to_many_grows():
    one_to_many = [dis.one_to_many_s(GB16, n, 2.5e9, 1e9) for n in (4, 16, 64)]
    chain = [dis.chain_s(GB16, n, 2.5e9, 1e9, MIB64) for n in (4, 16, 64)]
    assert one_to_many[2] > 10 * one_to_many[0]
    assert chain[2] < 1.3 * dis.ideal_s(GB16, 1e9)


@given(
    n=st.integers(1, 500),
    fanout=st.integers(2, 8),
    learner_bps=st.floats(1e8, 1e11),
    worker_bps=st.floats(1e7, 1e10),
)
def test_latency_grows_with_workers_and_never_beats_ideal(n, fanout, learner_bps, worker_bps):
    ideal = dis.ideal_s(GB16, worker_bps)
    for topology in ("one_to_many", "chain", "tree"):
        now = dis.dissemination_s(topology, GB16, n, learner_bps, worker_bps, fanout=fanout)
        later = dis.dissemination_s(topology, GB16, n + 1, learner_bps, worker_bps, fanout=fanout)
        assert now >= ideal * (1 - 1e-12)
        assert later >= now * (1 - 1e-12)


def test_chain_is_a_tree_of_fanout_one():
    assert dis.chain_s(GB16, 7, 5e9, 1e9, MIB64, 0.02) == pytest.approx(
        dis.tree_s(GB16, 7, 5e9, 1e9, MIB64, 1, 0.02)
    )


def test_leaf_slots():
    assert dis.leaf_slots("chain", 10) == 1  # only the tail can be behind NAT
    assert dis.leaf_slots("tree", 3, fanout=4) == 4 * 4 - 3
    assert dis.leaf_slots("one_to_many", 0) == float("inf")


def test_unknown_topology_and_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="topology must be one of"):
        dis.dissemination_s("mesh", GB16, 3, 1e9, 1e9)
    with pytest.raises(ValueError, match="snapshot_bytes"):
        dis.chain_s(0, 3, 1e9, 1e9, MIB64)
    with pytest.raises(ValueError, match="bandwidths"):
        dis.one_to_many_s(GB16, 3, 0, 1e9)
