"""Dissemination latency models (ECHO2.md section 5): how long until N workers hold a new
policy version, for the learner sending every copy, a pipelined relay chain and a pipelined
d-ary relay tree, plus the ideal-network reference.

Units: sizes in bytes, bandwidths in bits/s (network convention: 16 GB at 1 Gbit/s is 128 s),
times in seconds. All functions are pure. Chain and tree assume the coordinator orders relays
fastest first, so a worker is never fed faster than its own link and the formulas using that
worker's bandwidth are upper bounds on its arrival time.
"""

from __future__ import annotations

from typing import Literal

Topology = Literal["one_to_many", "chain", "tree", "ideal"]
TOPOLOGIES: tuple[str, ...] = ("one_to_many", "chain", "tree", "ideal")

BITS_PER_BYTE = 8


def _check(snapshot_bytes: float, n_workers: int, *bandwidths_bps: float) -> None:
    if not snapshot_bytes > 0:
        raise ValueError(f"snapshot_bytes must be > 0 (got {snapshot_bytes!r})")
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1 (got {n_workers!r})")
    for bandwidth in bandwidths_bps:
        if not bandwidth > 0:
            raise ValueError(f"bandwidths must be > 0 bits/s (got {bandwidth!r})")


def ideal_s(snapshot_bytes: float, worker_bps: float) -> float:
    """Every worker receives at its full downlink: T = M / b_down."""
    _check(snapshot_bytes, 1, worker_bps)
    return snapshot_bytes * BITS_PER_BYTE / worker_bps


def one_to_many_s(
    snapshot_bytes: float, n_workers: int, learner_bps: float, worker_bps: float, hop_latency_s: float = 0.0
) -> float:
    """The learner sends all N copies over its uplink: T = max(N*M / b_L, M / b) + one hop.
    Linear in N; the max covers a learner faster than the N downlinks together."""
    _check(snapshot_bytes, n_workers, learner_bps, worker_bps)
    bits = snapshot_bytes * BITS_PER_BYTE
    return max(n_workers * bits / learner_bps, bits / worker_bps) + hop_latency_s


def tree_levels(n_workers: int, fanout: int) -> int:
    """Depth L of a complete fanout-ary relay tree holding n_workers below its root: the
    smallest L with d + d^2 + ... + d^L >= N (a chain, fanout 1, has depth N)."""
    if fanout < 1:
        raise ValueError(f"fanout must be >= 1 (got {fanout!r})")
    if n_workers < 1:
        return 0
    levels, capacity, width = 0, 0, 1
    while capacity < n_workers:
        width *= fanout
        capacity += width
        levels += 1
    return levels


def tree_s(
    snapshot_bytes: float,
    n_workers: int,
    learner_bps: float,
    worker_bps: float,
    chunk_bytes: float,
    fanout: int,
    hop_latency_s: float = 0.0,
) -> float:
    """Pipelined d-ary tree: each relay uploads to f = min(d, N) children at b/f, so the stream
    runs at min(b_L, b)/f: T = f*M/min(b_L, b) + (L-1)*f*c/b + L*hop, L = tree_levels(N, d).
    The first level's pipeline fill is inside the first term; each deeper level adds one chunk."""
    _check(snapshot_bytes, n_workers, learner_bps, worker_bps)
    if not chunk_bytes > 0:
        raise ValueError(f"chunk_bytes must be > 0 (got {chunk_bytes!r})")
    levels = tree_levels(n_workers, fanout)
    share = min(fanout, n_workers)
    stream_s = share * snapshot_bytes * BITS_PER_BYTE / min(learner_bps, worker_bps)
    fill_s = (levels - 1) * share * chunk_bytes * BITS_PER_BYTE / worker_bps
    return stream_s + fill_s + levels * hop_latency_s


def chain_s(
    snapshot_bytes: float,
    n_workers: int,
    learner_bps: float,
    worker_bps: float,
    chunk_bytes: float,
    hop_latency_s: float = 0.0,
) -> float:
    """Pipelined relay chain (a tree with fanout 1): T = M/min(b_L, b) + (N-1)*c/b + N*hop,
    almost independent of N when M/c >> N."""
    return tree_s(snapshot_bytes, n_workers, learner_bps, worker_bps, chunk_bytes, 1, hop_latency_s)


def dissemination_s(
    topology: str,
    snapshot_bytes: float,
    n_workers: int,
    learner_bps: float,
    worker_bps: float,
    *,
    chunk_bytes: float = 64 << 20,
    fanout: int = 2,
    hop_latency_s: float = 0.0,
) -> float:
    """Transfer time of one version to N workers under `topology` (see TOPOLOGIES)."""
    if topology == "one_to_many":
        return one_to_many_s(snapshot_bytes, n_workers, learner_bps, worker_bps, hop_latency_s)
    if topology == "chain":
        return chain_s(snapshot_bytes, n_workers, learner_bps, worker_bps, chunk_bytes, hop_latency_s)
    if topology == "tree":
        return tree_s(snapshot_bytes, n_workers, learner_bps, worker_bps, chunk_bytes, fanout, hop_latency_s)
    if topology == "ideal":
        return ideal_s(snapshot_bytes, worker_bps) + hop_latency_s
    raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)} (got {topology!r})")


def leaf_slots(topology: str, n_relays: int, fanout: int = 2) -> float:
    """How many workers that cannot accept connections (behind NAT) the topology can place as
    leaves, given n_relays reachable workers: every parent (the learner or a reachable relay)
    has d child slots and every relay needs one, so leaves <= d*(n_relays + 1) - n_relays.
    A chain (d = 1) takes one, at its tail; one-to-many and ideal take any number."""
    if topology in ("one_to_many", "ideal"):
        return float("inf")
    width = 1 if topology == "chain" else fanout
    return width * (n_relays + 1) - n_relays
