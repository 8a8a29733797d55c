"""Latency of a concrete plan: on the plans `plan_broadcast` makes, the per-plan prediction
equals the planner's closed forms (one model, bytes per second, ECHO2.md section 5)."""

from __future__ import annotations

import pytest

from echo2.broadcast.latency import predict_plan_s
from echo2.broadcast.topology import plan_broadcast
from echo2.config.broadcast import BroadcastConfig
from echo2.planner.dissemination import chain_s, ideal_s, one_to_many_s, tree_levels, tree_s
from echo2.protocol.broadcast import OriginInfo, PeerInfo

B = 12.5e6  # 100 Mbit/s in bytes per second
M, C = 64 << 20, 1 << 20


def _plan(n: int, mode: str = "pipelined", up: float = B, origin_up: float = B):
    peers = [PeerInfo(peer_id=f"w{i}", url=f"http://w{i}:1", upload_bytes_per_s=up, download_bytes_per_s=B)
             for i in range(n)]
    return plan_broadcast(1, OriginInfo(url="http://o:1", upload_bytes_per_s=origin_up), peers,
                          BroadcastConfig(mode=mode, max_depth=64))  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_chain_plan_matches_relay_race_formula(n: int) -> None:
    expected = M / B + (n - 1) * C / B
    assert predict_plan_s(_plan(n), M, C) == pytest.approx(expected)
    assert chain_s(M, n, learner_bytes_per_s=B, worker_bytes_per_s=B, chunk_bytes=C) == pytest.approx(expected)
    assert predict_plan_s(_plan(n), M, C, hop_latency_s=0.01) == pytest.approx(expected + n * 0.01)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_to_many_plan_is_linear_in_workers(n: int) -> None:
    predicted = predict_plan_s(_plan(n, "one_to_many"), M, C)
    assert predicted == pytest.approx(n * M / B)
    assert one_to_many_s(M, n, learner_bytes_per_s=B, worker_bytes_per_s=B) == pytest.approx(predicted)


def test_one_to_many_cannot_beat_the_downlink() -> None:
    got = one_to_many_s(M, 2, learner_bytes_per_s=100 * B, worker_bytes_per_s=B)
    assert got == pytest.approx(ideal_s(M, worker_bytes_per_s=B))


def test_tree_plan_with_wider_uplinks_matches_tree_formula() -> None:
    plan = _plan(21, up=4 * B)
    depth = max(a.depth for a in plan.assignments)
    assert depth == tree_levels(21, 4, first_hop=1) == 3
    assert predict_plan_s(plan, M, C) == pytest.approx(M / B + (depth - 1) * C / B)
    full_tree = tree_s(M, 21, learner_bytes_per_s=4 * B, worker_upload_bytes_per_s=4 * B,
                       worker_download_bytes_per_s=B, chunk_bytes=C, fanout=4)
    assert full_tree == pytest.approx(M / B + (tree_levels(21, 4) - 1) * C / B)


def test_tree_sharing_the_uplink_costs_d_copies() -> None:
    # ECHO2.md: d*M/b + fill; the fill counts d chunk times per level (the parent interleaves)
    got = tree_s(M, 14, learner_bytes_per_s=B, worker_upload_bytes_per_s=B, chunk_bytes=C, fanout=2)
    assert got == pytest.approx(2 * M / B + (tree_levels(14, 2) - 1) * 2 * C / B)
    assert tree_levels(14, 2) == 3 and tree_levels(1, 3) == 1 and tree_levels(0, 3) == 0
