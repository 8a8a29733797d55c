"""Latency of one concrete broadcast plan: how long until every worker of a `BroadcastPlan`
holds the version. The closed forms per topology (one-to-many, chain, tree, ideal) are the
planner's, `echo2.planner.dissemination`, in the same units (bytes, bytes per second, seconds);
this module evaluates that model edge by edge on the tree the coordinator actually planned.

Symbols (ECHO2.md section 5): M payload bytes, c chunk bytes, L per-hop latency (connection
setup plus one-way delay). Any plan (what `predict_plan_s` computes from a `BroadcastPlan`):
worker w at depth k with edge rates r_1..r_k from the learner down,
    T_w = M / min(r_1..r_k) + sum(c / r_i for i = 2..k) + k * L,   T = max over workers.
On the plans `plan_broadcast` makes this reduces to the planner's chain, tree and one-to-many
forms (tests/unit/broadcast/test_broadcast_latency.py checks it).

benchmarks/broadcast.py measures real broadcasts against this model (`predict_plan_s` on the
plan run; the table is in docs/broadcast.md, the JSON in benchmarks/results/). Measurements sit a
little above it: TCP goodput through a tbf-shaped link is below the shaped rate (the acks of a
relay's upload share its shaped downlink), and each hop adds more than c/b (store-and-forward of
the last chunk, scheduling on a shared box). One-to-many grows linearly in N.
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
