"""Latency of one concrete broadcast plan: how long until every worker of a `BroadcastPlan`
holds the version. The closed forms per topology (one-to-many, chain, tree, ideal) are the
planner's, `echo2.planner.dissemination`, in the same units (bytes, bytes per second, seconds);
this module evaluates that model edge by edge on the tree the coordinator actually planned.

Symbols (ECHO2.md section 5): M payload bytes, c chunk bytes, L per-hop latency (connection
setup plus one-way delay). Any plan (what `predict_plan_s` computes from a `BroadcastPlan`): worker w at depth k with edge
rates r_1..r_k from the learner down,
    T_w = M / min(r_1..r_k) + sum(c / r_i for i = 2..k) + k * L,   T = max over workers.
On the plans `plan_broadcast` makes this reduces to the planner's chain, tree and one-to-many
forms (tests/unit/broadcast/test_broadcast_latency.py checks it).

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
(256 MiB) slower than the pipelined chain. ("model" is `predict_plan_s` on the plan run.)
"""

from __future__ import annotations

from echo2.protocol.broadcast import Assignment, BroadcastPlan


def predict_worker_s(plan: BroadcastPlan, worker_id: str, *, total_bytes: int, chunk_bytes: int,
                     hop_latency_s: float = 0.0) -> float:
    """T_w for one worker of `plan` (edge rates as the coordinator planned them)."""
    by_id = {a.worker_id: a for a in plan.assignments}
    rates = [edge.edge_rate_bytes_per_s for edge in _path(by_id, worker_id)]  # worker first
    fill_s = sum(chunk_bytes / r for r in rates[:-1])  # every hop but the learner's first
    return total_bytes / min(rates) + fill_s + len(rates) * hop_latency_s


def predict_plan_s(plan: BroadcastPlan, total_bytes: int, chunk_bytes: int, hop_latency_s: float = 0.0) -> float:
    """Predicted dissemination time of `plan`: its slowest worker's T_w."""
    return max((predict_worker_s(plan, a.worker_id, total_bytes=total_bytes, chunk_bytes=chunk_bytes,
                                 hop_latency_s=hop_latency_s)
                for a in plan.assignments), default=0.0)


def _path(by_id: dict[str, Assignment], worker_id: str) -> list[Assignment]:
    path, node = [], by_id[worker_id]
    while True:
        path.append(node)
        parent = node.sources[0].peer_id
        if parent not in by_id:  # the learner
            return path
        node = by_id[parent]
