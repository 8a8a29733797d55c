"""Latency model of weight dissemination: how long until every worker holds a version.

Symbols (ECHO2.md section 5): M payload bytes, c chunk bytes, N workers, b_L learner uplink,
b worker bandwidth (up = down unless stated), d tree fan-out, L per-hop latency (connection setup
plus one-way delay), all rates in bytes per second.

One-to-many (the learner sends every copy; its uplink is shared N ways):
    T_1toN = max(N * M / b_L, M / b_down) + L                                   linear in N
Pipelined chain (relay race; fan-out 1, store-and-forward of whole chunks): worker k receives
chunk j at (j + k - 1) * c / b, so the last worker finishes at
    T_chain = M / min(b_L, b) + (N - 1) * c / b + N * L                        ~flat in N if M/c >> N
Pipelined d-ary tree with depth D (levels below the learner): a parent splits its uplink b_up
among d children, so each edge runs at r = min(b_up / d, b_down) and a chunk reaches the last
child of a parent d*c/b_up after the parent has it:
    T_tree = M / r + (D - 1) * c / r + D * L
  With b_up = b this is d*M/b + (D-1)*d*c/b: ECHO2.md writes the fill as ceil(log_d N)*c/b, i.e.
  it counts one chunk time per level; we count d (the parent interleaves its d children), the
  difference is negligible when M/c >> D. With b_up = d*b (the case the topology picks a tree
  for) r = b and T_tree = M/b + (D-1)*c/b: a tree is then as good as a chain with D << N hops.
Any plan (what `predict_plan_s` computes from a `BroadcastPlan`): worker w at depth k with edge
rates r_1..r_k from the learner down,
    T_w = M / min(r_1..r_k) + sum(c / r_i for i = 2..k) + k * L,   T = max over workers.
Ideal network (every worker receives at its full downlink): T_ideal = M / b_down.

Measured (benchmarks/broadcast.py: real processes in network namespaces, every link tbf-shaped
to 100 Mbit/s both ways, c = 1 MiB, 2 vCPUs; full JSON in benchmarks/results/):
    M = 64 MiB   N = 2 / 4 / 8 / 16   pipelined 5.72 / 5.89 / 6.34 / 7.19 s  model 5.45 / 5.62 / 5.96 / 6.63 s
                                      one-to-many 11.2 / 22.5 / 44.9 / 89.9 s  model 10.7 / 21.5 / 43.0 / 85.9 s
    M = 256 MiB  N = 2 / 4 / 8 / 16   pipelined 22.8 / 23.3 / 23.8 / 25.5 s  model 21.6 / 21.7 / 22.1 / 22.7 s
                                      one-to-many 45.0 / 89.9 / 180 / 359 s   model 42.9 / 85.9 / 172 / 344 s
    d-ary (worker uplinks 4 x 100 Mbit/s, N = 16, depth 3, M = 64 MiB): 6.21 s, model 5.54 s
Measurements sit 5-12% above the model: TCP goodput through tbf is ~95% of the shaped rate (the
acks of a relay's upload share its shaped downlink), and each hop adds ~40-60 ms beyond c/b
(store-and-forward of the last chunk, scheduling on a shared 2-core box). One-to-many is linear
in N (R^2 = 1.000, slope 1.046 x M/b_L per worker); at N = 16 it is 12.5x (64 MiB) and 14.1x
(256 MiB) slower than the pipelined chain.
"""

from __future__ import annotations

import math

from echo2.broadcast.topology import Assignment, BroadcastPlan


def ideal_s(total_bytes: int, download_bytes_per_s: float) -> float:
    return total_bytes / download_bytes_per_s


def one_to_many_s(total_bytes: int, n_workers: int, origin_upload_bytes_per_s: float,
                  worker_download_bytes_per_s: float = math.inf, hop_latency_s: float = 0.0) -> float:
    copies_s = n_workers * total_bytes / origin_upload_bytes_per_s
    return max(copies_s, total_bytes / worker_download_bytes_per_s) + hop_latency_s


def chain_s(total_bytes: int, chunk_bytes: int, n_workers: int, origin_upload_bytes_per_s: float,
            worker_bytes_per_s: float, hop_latency_s: float = 0.0) -> float:
    first = total_bytes / min(origin_upload_bytes_per_s, worker_bytes_per_s)
    return first + (n_workers - 1) * chunk_bytes / worker_bytes_per_s + n_workers * hop_latency_s


def tree_depth(n_workers: int, fanout: int, first_hop: int | None = None) -> int:
    """Levels below the learner for a full tree: the learner feeds `first_hop` (default `fanout`)
    workers and every worker feeds `fanout`."""
    level, placed, depth = first_hop or fanout, 0, 0
    while placed < n_workers:
        placed, depth, level = placed + level, depth + 1, level * fanout
    return depth


def tree_s(total_bytes: int, chunk_bytes: int, n_workers: int, fanout: int, worker_upload_bytes_per_s: float,
           worker_download_bytes_per_s: float, hop_latency_s: float = 0.0) -> float:
    rate = min(worker_upload_bytes_per_s / fanout, worker_download_bytes_per_s)
    depth = tree_depth(n_workers, fanout)
    return total_bytes / rate + (depth - 1) * chunk_bytes / rate + depth * hop_latency_s


def predict_worker_s(plan: BroadcastPlan, worker_id: str, total_bytes: int, chunk_bytes: int,
                     hop_latency_s: float = 0.0) -> float:
    """T_w for one worker of `plan` (edge rates as the coordinator planned them)."""
    by_id = {a.worker_id: a for a in plan.assignments}
    rates = [edge.edge_rate_bytes_per_s for edge in _path(by_id, worker_id)]  # worker first
    fill_s = sum(chunk_bytes / r for r in rates[:-1])  # every hop but the learner's first
    return total_bytes / min(rates) + fill_s + len(rates) * hop_latency_s


def predict_plan_s(plan: BroadcastPlan, total_bytes: int, chunk_bytes: int, hop_latency_s: float = 0.0) -> float:
    """Predicted dissemination time of `plan`: its slowest worker's T_w."""
    return max((predict_worker_s(plan, a.worker_id, total_bytes, chunk_bytes, hop_latency_s)
                for a in plan.assignments), default=0.0)


def _path(by_id: dict[str, Assignment], worker_id: str) -> list[Assignment]:
    path, node = [], by_id[worker_id]
    while True:
        path.append(node)
        parent = node.sources[0].peer_id
        if parent not in by_id:  # the learner
            return path
        node = by_id[parent]
