"""Dissemination latency model: hand-computed values and the scaling each topology promises.
Rates are bytes/s (1 Gbit/s = 125 MB/s); every rate is keyword-only, named with its unit."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo2.planner import dissemination as dis

GB16 = 16e9  # bf16 8B model, ~16 GB
MIB64 = 64 << 20
GBIT = dis.bytes_per_s(1e9)  # 125e6 bytes/s


def test_one_copy_at_one_gigabit_takes_128_seconds():
    assert GBIT == 125e6
    assert dis.ideal_s(GB16, worker_bytes_per_s=GBIT) == pytest.approx(128.0)
    # the worker link binds
    assert dis.one_to_many_s(GB16, 1, learner_bytes_per_s=10 * GBIT, worker_bytes_per_s=GBIT) == pytest.approx(128.0)
    assert dis.chain_s(GB16, 1, learner_bytes_per_s=GBIT, worker_bytes_per_s=GBIT,
                       chunk_bytes=MIB64) == pytest.approx(128.0)


def test_rates_are_keyword_only_so_bits_per_second_cannot_slip_in():
    with pytest.raises(TypeError):
        dis.dissemination_s("chain", GB16, 3, 1e9, 1e9)  # type: ignore[misc]


def test_one_to_many_is_linear_in_workers():
    # 10 Gbit/s learner: 12.8 s per copy once the learner link binds
    for n in (20, 40):
        got = dis.one_to_many_s(GB16, n, learner_bytes_per_s=10 * GBIT, worker_bytes_per_s=10 * GBIT)
        assert got == pytest.approx(n * 12.8)


def test_chain_by_hand():
    # M/min(b_L, b) + (N-1) c/b + N hop = 128 + 9 * 0.536870912 + 10 * 0.05
    expected = 128 + 9 * MIB64 / GBIT + 10 * 0.05
    got = dis.chain_s(GB16, 10, learner_bytes_per_s=10 * GBIT, worker_bytes_per_s=GBIT, chunk_bytes=MIB64,
                      hop_latency_s=0.05)
    assert got == pytest.approx(expected)


def test_tree_by_hand():
    # 6 workers, fanout 2: levels 2 + 4 -> L = 2; stream 2 * 128 s, one extra level of 2 chunks
    assert dis.tree_levels(6, 2) == 2
    expected = 2 * 128 + 1 * 2 * MIB64 / GBIT + 2 * 0.1
    got = dis.tree_s(GB16, 6, learner_bytes_per_s=10 * GBIT, worker_upload_bytes_per_s=GBIT, chunk_bytes=MIB64,
                     fanout=2, hop_latency_s=0.1)
    assert got == pytest.approx(expected)


def test_tree_with_uplinks_d_times_the_downlink_streams_at_the_downlink():
    # the case the topology picks a tree for: each child still gets its full downlink
    got = dis.tree_s(GB16, 21, learner_bytes_per_s=4 * GBIT, worker_upload_bytes_per_s=4 * GBIT,
                     worker_download_bytes_per_s=GBIT, chunk_bytes=MIB64, fanout=4)
    assert got == pytest.approx(GB16 / GBIT + (dis.tree_levels(21, 4) - 1) * MIB64 / GBIT)


def test_tree_levels():
    assert [dis.tree_levels(n, 2) for n in (1, 2, 3, 6, 7, 14, 15)] == [1, 1, 2, 2, 3, 3, 4]
    assert dis.tree_levels(5, 1) == 5
    assert dis.tree_levels(0, 3) == 0
    assert dis.tree_levels(21, 4, first_hop=1) == 3  # 1 + 4 + 16


def test_peer_assisted_stays_near_ideal_while_one_to_many_grows():
    rates = {"learner_bytes_per_s": 2.5 * GBIT, "worker_bytes_per_s": GBIT}
    one_to_many = [dis.one_to_many_s(GB16, n, **rates) for n in (4, 16, 64)]
    chain = [dis.chain_s(GB16, n, **rates, chunk_bytes=MIB64) for n in (4, 16, 64)]
    assert one_to_many[2] > 10 * one_to_many[0]
    assert chain[2] < 1.3 * dis.ideal_s(GB16, worker_bytes_per_s=GBIT)


@given(
    n=st.integers(1, 500),
    fanout=st.integers(2, 8),
    learner_bytes_per_s=st.floats(1e7, 1e10),
    worker_bytes_per_s=st.floats(1e6, 1e9),
)
def test_latency_grows_with_workers_and_never_beats_ideal(n, fanout, learner_bytes_per_s, worker_bytes_per_s):
    rates = {"learner_bytes_per_s": learner_bytes_per_s, "worker_bytes_per_s": worker_bytes_per_s}
    ideal = dis.ideal_s(GB16, worker_bytes_per_s=worker_bytes_per_s)
    for topology in ("one_to_many", "chain", "tree"):
        now = dis.dissemination_s(topology, GB16, n, **rates, fanout=fanout)
        later = dis.dissemination_s(topology, GB16, n + 1, **rates, fanout=fanout)
        assert now >= ideal * (1 - 1e-12)
        assert later >= now * (1 - 1e-12)


def test_chain_is_a_tree_of_fanout_one():
    assert dis.chain_s(GB16, 7, learner_bytes_per_s=5 * GBIT, worker_bytes_per_s=GBIT, chunk_bytes=MIB64,
                       hop_latency_s=0.02) == pytest.approx(
        dis.tree_s(GB16, 7, learner_bytes_per_s=5 * GBIT, worker_upload_bytes_per_s=GBIT, chunk_bytes=MIB64,
                   fanout=1, hop_latency_s=0.02)
    )


def test_leaf_slots():
    assert dis.leaf_slots("chain", 10) == 1  # only the tail can be behind NAT
    assert dis.leaf_slots("tree", 3, fanout=4) == 4 * 4 - 3
    assert dis.leaf_slots("one_to_many", 0) == float("inf")


def test_unknown_topology_and_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="topology must be one of"):
        dis.dissemination_s("mesh", GB16, 3, learner_bytes_per_s=GBIT, worker_bytes_per_s=GBIT)
    with pytest.raises(ValueError, match="snapshot_bytes"):
        dis.chain_s(0, 3, learner_bytes_per_s=GBIT, worker_bytes_per_s=GBIT, chunk_bytes=MIB64)
    with pytest.raises(ValueError, match="learner_bytes_per_s must be > 0"):
        dis.one_to_many_s(GB16, 3, learner_bytes_per_s=0, worker_bytes_per_s=GBIT)
