"""The simulated weight broadcast: when each worker holds every byte of a version, simulated
mechanistically rather than read off the planner's closed forms (which the tests compare it to).

- one_to_many: the learner serves N concurrent downloads; its uplink is shared max-min fairly
  (a flow never runs faster than its worker's downlink), fluid model.
- chain, tree: chunk-level store-and-forward pipeline. The link into worker k sends chunk j as
  soon as the parent holds it and the link has sent chunk j-1; each relay's upload is split
  evenly over its children; chunks then travel one hop latency. Workers are placed fastest
  first (the chain in bandwidth order, the tree in breadth-first order).
- ideal: every worker downloads at its full downlink, independently.

Units: bytes, bits/s, seconds. A worker's link is symmetric (up = down = bandwidth_bps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from echo2.planner.dissemination import BITS_PER_BYTE, TOPOLOGIES


@dataclass(frozen=True)
class Network:
    topology: str
    snapshot_bytes: float
    learner_bps: float
    chunk_bytes: float
    fanout: int = 2
    hop_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)} (got {self.topology!r})")


@dataclass(frozen=True)
class Round:
    """One version's trip to a fixed set of workers."""

    arrival_s: tuple[float, ...]
    """Seconds after the round starts until worker i (in the order given) holds the version."""
    busy_s: float
    """Seconds until the network can start the next version: the slowest link's busy time."""

    @property
    def last_s(self) -> float:
        return max(self.arrival_s, default=0.0)


def simulate_round(net: Network, worker_bps: Sequence[float]) -> Round:
    """Arrival time of one version at each worker (same order as `worker_bps`)."""
    if not worker_bps:
        return Round((), 0.0)
    if min(worker_bps) <= 0 or net.learner_bps <= 0 or net.snapshot_bytes <= 0:
        raise ValueError("bandwidths and snapshot_bytes must be > 0")
    if net.topology == "ideal":
        bits = net.snapshot_bytes * BITS_PER_BYTE
        return Round(tuple(bits / b + net.hop_latency_s for b in worker_bps), bits / min(worker_bps))
    if net.topology == "one_to_many":
        return _fair_share(net, worker_bps)
    fanout = 1 if net.topology == "chain" else net.fanout
    return _pipeline(net, worker_bps, fanout)


def _fair_share(net: Network, worker_bps: Sequence[float]) -> Round:
    """Max-min fair sharing of the learner uplink by N equal-size flows capped at their
    downlinks. Flows with the same cap finish together, so the loop runs once per distinct
    bandwidth: at each phase the slowest-capped flows that cannot use a fair share run at their
    cap and the rest split what is left."""
    bits = net.snapshot_bytes * BITS_PER_BYTE
    caps = sorted(set(worker_bps))
    left = {cap: bits for cap in caps}  # bits still to send, per cap group
    count = {cap: 0 for cap in caps}
    for b in worker_bps:
        count[b] += 1
    now_s, finish = 0.0, {}
    while left:
        rates = _water_fill(net.learner_bps, [(cap, count[cap]) for cap in sorted(left)])
        step_s = min(left[cap] / rates[cap] for cap in left)
        now_s += step_s
        for cap in list(left):
            left[cap] -= rates[cap] * step_s
            if left[cap] <= bits * 1e-12:
                finish[cap] = now_s
                del left[cap]
    return Round(tuple(finish[b] + net.hop_latency_s for b in worker_bps), max(finish.values()))


def _water_fill(capacity_bps: float, groups: list[tuple[float, int]]) -> dict[float, float]:
    """Per-flow rates of a max-min fair share; `groups` are (cap, flows) ascending by cap."""
    rates, flows = {}, sum(n for _, n in groups)
    for cap, n in groups:
        share = capacity_bps / flows
        rates[cap] = min(cap, share)
        capacity_bps -= rates[cap] * n
        flows -= n
    return rates


def _chunk_bits(net: Network) -> np.ndarray:
    """Chunk sizes in bits: full chunks and a possibly shorter last one."""
    n_full, rest = divmod(net.snapshot_bytes, net.chunk_bytes)
    sizes = [net.chunk_bytes] * int(n_full) + ([rest] if rest > 0 else [])
    return np.asarray(sizes, dtype=float) * BITS_PER_BYTE


def _pipeline(net: Network, worker_bps: Sequence[float], fanout: int) -> Round:
    """Relay tree with `fanout` children per relay (1: a chain), fastest workers nearest the
    learner. Returns arrivals in the caller's order."""
    order = sorted(range(len(worker_bps)), key=lambda i: (-worker_bps[i], i))
    bps = [worker_bps[i] for i in order]
    n = len(bps)
    chunk_bits = _chunk_bits(net)
    root_children = min(fanout, n)
    parent_arrivals: dict[int, np.ndarray] = {-1: np.zeros(len(chunk_bits))}
    arrival = [0.0] * n
    slowest_rate = math.inf
    for k in range(n):  # breadth-first: a parent always precedes its children
        parent = (k - root_children) // fanout if k >= root_children else -1
        up_bps, children = (
            (net.learner_bps, root_children)
            if parent < 0
            else (bps[parent], _children(parent, n, root_children, fanout))
        )
        rate_bps = min(up_bps / children, bps[k])
        slowest_rate = min(slowest_rate, rate_bps)
        got = _forward(parent_arrivals[parent], chunk_bits / rate_bps) + net.hop_latency_s
        arrival[k] = float(got[-1])
        if _children(k, n, root_children, fanout):
            parent_arrivals[k] = got
        if parent >= 0 and k == _last_child(parent, n, root_children, fanout):
            del parent_arrivals[parent]  # every child served: free the parent's arrivals
    in_caller_order = [0.0] * n
    for position, i in enumerate(order):
        in_caller_order[i] = arrival[position]
    return Round(tuple(in_caller_order), float(chunk_bits.sum()) / slowest_rate)


def _forward(parent_got_s: np.ndarray, chunk_s: np.ndarray) -> np.ndarray:
    """Store-and-forward over one link: E[j] = max(parent_got[j], E[j-1]) + chunk_s[j],
    vectorized as E = T + running max of (parent_got - T_prev), T the prefix sums of chunk_s."""
    done_s = np.cumsum(chunk_s)
    return done_s + np.maximum.accumulate(parent_got_s - (done_s - chunk_s))


def _children(k: int, n: int, root_children: int, fanout: int) -> int:
    first = root_children + k * fanout
    return max(0, min(fanout, n - first))


def _last_child(parent: int, n: int, root_children: int, fanout: int) -> int:
    return root_children + parent * fanout + _children(parent, n, root_children, fanout) - 1
