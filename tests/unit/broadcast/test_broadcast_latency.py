"""Latency model: the per-plan prediction reduces to the closed forms of ECHO2.md section 5."""

from __future__ import annotations

import pytest

from echo2.broadcast.latency import (
    chain_s,
    ideal_s,
    one_to_many_s,
    predict_plan_s,
    tree_depth,
    tree_s,
)
from echo2.broadcast.topology import OriginInfo, PeerInfo, plan_broadcast
from echo2.config.broadcast import BroadcastConfig

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
    assert chain_s(M, C, n, B, B) == pytest.approx(expected)
    assert chain_s(M, C, n, B, B, hop_latency_s=0.01) == pytest.approx(expected + n * 0.01)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_to_many_plan_is_linear_in_workers(n: int) -> None:
    assert predict_plan_s(_plan(n, "one_to_many"), M, C) == pytest.approx(n * M / B)
    assert one_to_many_s(M, n, B) == pytest.approx(n * M / B)


def test_one_to_many_cannot_beat_the_downlink() -> None:
    assert one_to_many_s(M, 2, 100 * B, worker_download_bytes_per_s=B) == pytest.approx(ideal_s(M, B))


def test_tree_plan_with_wider_uplinks_matches_tree_formula() -> None:
    plan = _plan(21, up=4 * B)
    depth = max(a.depth for a in plan.assignments)
    assert depth == tree_depth(21, 4, first_hop=1) == 3
    assert predict_plan_s(plan, M, C) == pytest.approx(M / B + (depth - 1) * C / B)
    assert tree_s(M, C, 21, 4, 4 * B, B) == pytest.approx(M / B + (tree_depth(21, 4) - 1) * C / B)


def test_tree_sharing_the_uplink_costs_d_copies() -> None:
    # ECHO2.md: d*M/b + fill; the fill counts d chunk times per level (the parent interleaves)
    assert tree_s(M, C, 14, 2, B, B) == pytest.approx(2 * M / B + (tree_depth(14, 2) - 1) * 2 * C / B)
    assert tree_depth(14, 2) == 3 and tree_depth(1, 3) == 1 and tree_depth(0, 3) == 0
