"""The simulated broadcast against the planner's closed forms: equal in the simple cases the
formulas are exact for, never below the ideal network, and one-to-many linear in N."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2.planner import dissemination as closed
from echo2.sim.broadcast import Network, simulate_round

GB16 = 16e9
MIB64 = 64 << 20
WHOLE_CHUNKS = 250 * MIB64  # 16.8 GB: the closed forms count whole chunks


def last(topology, n, learner_bps, worker_bps, chunk=MIB64, fanout=2, hop=0.05, size=GB16):
    return simulate_round(Network(topology, size, learner_bps, chunk, fanout, hop), [worker_bps] * n).last_s


def formula(topology, n, learner_bps, worker_bps, chunk=MIB64, fanout=2, hop=0.05, size=GB16):
    return closed.dissemination_s(
        topology, size, n, learner_bytes_per_s=learner_bps / 8, worker_bytes_per_s=worker_bps / 8,
        chunk_bytes=chunk, fanout=fanout, hop_latency_s=hop,
    )


@pytest.mark.parametrize("n", [1, 2, 5, 17, 64, 300])
@pytest.mark.parametrize("learner_bps", [1e9, 2.5e9, 10e9, 0.2e9])
def test_one_to_many_chain_and_ideal_equal_the_closed_form(n, learner_bps):
    for topology in ("one_to_many", "chain", "ideal"):
        simulated = last(topology, n, learner_bps, 1e9, size=WHOLE_CHUNKS)
        assert simulated == pytest.approx(formula(topology, n, learner_bps, 1e9, size=WHOLE_CHUNKS), rel=1e-9)


@pytest.mark.parametrize(
    ("fanout", "n"), [(2, 1), (2, 2), (2, 6), (2, 14), (2, 62), (2, 126), (3, 12), (3, 39), (4, 20)]
)
def test_tree_equals_the_closed_form_for_complete_trees_when_learner_and_worker_links_match(fanout, n):
    simulated = last("tree", n, 1e9, 1e9, fanout=fanout, size=WHOLE_CHUNKS)
    assert simulated == pytest.approx(formula("tree", n, 1e9, 1e9, fanout=fanout, size=WHOLE_CHUNKS))


def test_tree_never_exceeds_the_closed_form():
    # incomplete trees and fast learners leave relays with fewer children, which only helps
    for n in (3, 5, 9, 100):
        for learner_bps in (1e9, 10e9):
            assert last("tree", n, learner_bps, 1e9) <= formula("tree", n, learner_bps, 1e9) * (1 + 1e-12)


def test_hand_computed_chain_with_a_partial_last_chunk():
    # 100 MB in 64 MiB chunks: 1 full chunk + a 32.9 MB tail; 3 hops at 800 Mbit/s, 10 ms each
    size, chunk, bps = 100e6, 64 << 20, 0.8e9
    expected = size * 8 / bps + 2 * chunk * 8 / bps + 3 * 0.01
    assert last("chain", 3, bps, bps, chunk=chunk, hop=0.01, size=size) == pytest.approx(expected)


def test_arrivals_are_per_worker_in_the_callers_order():
    net = Network("ideal", GB16, 1e9, MIB64, hop_latency_s=0.0)
    trip = simulate_round(net, [1e9, 4e9, 2e9])
    assert trip.arrival_s == pytest.approx((128.0, 32.0, 64.0))
    chain = simulate_round(Network("chain", GB16, 10e9, MIB64, hop_latency_s=0.0), [1e9, 4e9, 2e9])
    # fastest first: the 4 Gbit/s worker heads the chain, the slow one is last and latest
    assert chain.arrival_s[1] < chain.arrival_s[2] < chain.arrival_s[0]


def test_one_to_many_fair_share_with_mixed_downlinks():
    # 10 Gbit/s learner, one 1 Gbit/s worker and two 10 Gbit/s ones: the slow one is capped at
    # 1 Gbit/s, the others split 9 Gbit/s until the 16 GB are through, then the slow one
    # finishes alone at 1 Gbit/s: 128 s; the fast ones at 16e9*8 / 4.5e9
    trip = simulate_round(Network("one_to_many", GB16, 10e9, MIB64, hop_latency_s=0.0), [1e9, 10e9, 10e9])
    assert trip.arrival_s == pytest.approx((128.0, 16e9 * 8 / 4.5e9, 16e9 * 8 / 4.5e9))


def test_paper_shape_one_to_many_grows_pipelined_stays_near_ideal():
    ideal = last("ideal", 64, 1e9, 1e9)
    one_to_many = [last("one_to_many", n, 1e9, 1e9) for n in (4, 16, 64)]
    assert one_to_many[2] > 10 * one_to_many[0]
    assert last("chain", 64, 1e9, 1e9) < 1.3 * ideal


@settings(max_examples=60, deadline=None)
@given(
    bandwidths=st.lists(st.sampled_from([1e8, 5e8, 1e9, 2.5e9, 1e10]), min_size=1, max_size=40),
    learner_bps=st.sampled_from([1e9, 1e10]),
    topology=st.sampled_from(closed.TOPOLOGIES),
    fanout=st.integers(2, 4),
)
def test_no_worker_beats_its_own_downlink_and_slowest_formula_bounds_the_rest(
    bandwidths, learner_bps, topology, fanout
):
    net = Network(topology, 1e9, learner_bps, 16 << 20, fanout, 0.01)
    trip = simulate_round(net, bandwidths)
    for bps, arrival in zip(bandwidths, trip.arrival_s, strict=True):
        assert arrival >= 1e9 * 8 / bps + 0.01 - 1e-9
    # every worker no later than the closed form evaluated with the slowest worker's link
    bound = closed.dissemination_s(
        topology,
        1e9,
        len(bandwidths),
        learner_bytes_per_s=learner_bps / 8,
        worker_bytes_per_s=min(bandwidths) / 8,
        chunk_bytes=16 << 20,
        fanout=fanout,
        hop_latency_s=0.01,
    )
    assert trip.last_s <= bound * (1 + 1e-9)
