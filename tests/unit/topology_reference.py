"""Reference (tests and benchmarks only): echo2.broadcast.topology as it was before the
O(N log N) tree (commit f86ed8e), kept verbatim below this note, plus the linear-scan
BroadcastPlan.for_worker. tests/unit/test_topology_scale.py checks the fast versions return
exactly what these do; benchmarks/policy_scale.py times both. Do not change what these compute.

Original docstring:
Broadcast topology: which source each worker pulls a version from (a pure function the
coordinator calls once per version; no I/O).

Pipelined mode builds a relay tree from what the coordinator knows of each worker:

1. Stream rate r = min(learner uplink, median worker downlink): the rate the tree tries to give
   every worker.
2. Fan-out follows bandwidth: a node can feed floor(uplink / r) children at rate r, clamped to
   [1, max_fanout] for workers and [1, max_first_hop] for the learner. Equal links give fan-out 1
   everywhere (a chain, the relay race); uplinks d times the stream rate give a d-ary tree.
3. Relays are the workers that accept connections and can receive at r; the fastest uplinks are
   placed nearest the learner, breadth-first. Workers that cannot accept connections (NAT) or
   receive slower than r are leaves, so they never slow anyone else down.
4. When no node has a free slot (more leaves than relay capacity) or the tree would pass
   max_depth, a worker is attached where it costs least: the node with the largest uplink share
   after adding it, ties going to the node with the smallest subtree (a chain's tail before the
   learner, whose every extra child slows the whole tree).
5. Each worker's sources are its parent, then its ancestors (they are ahead of it in the
   pipeline and a dead parent frees exactly the grandparent's uplink), the learner last; at
   most max_sources (with max_sources = 1, the parent alone).

One-to-many mode gives every worker the learner as its only source. See `latency` for the
dissemination time each plan predicts. The plan's data types (PeerInfo, Assignment, ...) are
echo2.protocol.broadcast's: the coordinator sends each worker its assignment.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.broadcast import Assignment, BroadcastPlan, OriginInfo, PeerInfo, Source


def plan_broadcast(
    version: int, origin: OriginInfo, peers: list[PeerInfo], config: BroadcastConfig
) -> BroadcastPlan:
    """Each worker's sources for `version`, in config.mode ("pipelined" or "one_to_many")."""
    _check_ids(origin, peers)
    if config.mode == "one_to_many":
        return _one_to_many(version, origin, peers)
    rate = _stream_rate(origin, peers)
    tree = _Tree(origin, rate, config)
    for peer in _placement_order(peers, rate):
        tree.attach(peer)
    return tree.to_plan(version)


def late_joiner_assignment(
    version: int, joiner: PeerInfo, holders: list[PeerInfo], *, origin: OriginInfo, config: BroadcastConfig
) -> Assignment:
    """Sources for a worker joining after `version` went out: any reachable holder, fastest
    uplink first, the learner last."""
    usable = sorted((h for h in holders if h.reachable and h.url and h.peer_id != joiner.peer_id),
                    key=lambda h: (-h.upload_bytes_per_s, h.peer_id))[: config.max_sources - 1]
    sources = [Source(peer_id=h.peer_id, url=h.url) for h in usable] + [_origin_source(origin)]
    first_upload = usable[0].upload_bytes_per_s if usable else origin.upload_bytes_per_s
    rate = min(first_upload, joiner.download_bytes_per_s)
    return Assignment(
        version=version, worker_id=joiner.peer_id, mode=config.mode, sources=sources,
        edge_rate_bytes_per_s=rate, planned_rate_bytes_per_s=rate,
    )


def _check_ids(origin: OriginInfo, peers: list[PeerInfo]) -> None:
    seen: set[str] = set()
    for peer in peers:
        if peer.peer_id in seen or peer.peer_id == origin.peer_id:
            raise ValueError(f"peer_id {peer.peer_id!r} appears twice (or is the origin's id); ids must be unique")
        if peer.reachable and not peer.url:
            raise ValueError(f"peer {peer.peer_id!r} is reachable but has no url; "
                             "give its relay URL or reachable=False")
        seen.add(peer.peer_id)


def _origin_source(origin: OriginInfo) -> Source:
    return Source(peer_id=origin.peer_id, url=origin.url)


def _one_to_many(version: int, origin: OriginInfo, peers: list[PeerInfo]) -> BroadcastPlan:
    share = origin.upload_bytes_per_s / max(1, len(peers))
    assignments = [
        Assignment(
            version=version, worker_id=p.peer_id, mode="one_to_many", sources=[_origin_source(origin)],
            edge_rate_bytes_per_s=min(share, p.download_bytes_per_s),
            planned_rate_bytes_per_s=min(share, p.download_bytes_per_s),
        )
        for p in peers
    ]
    return BroadcastPlan(
        version=version, mode="one_to_many", stream_rate_bytes_per_s=share,
        origin_children=[p.peer_id for p in peers], assignments=assignments,
    )


def _stream_rate(origin: OriginInfo, peers: list[PeerInfo]) -> float:
    if not peers:
        return origin.upload_bytes_per_s
    return min(origin.upload_bytes_per_s, statistics.median(p.download_bytes_per_s for p in peers))


def _placement_order(peers: list[PeerInfo], rate: float) -> list[PeerInfo]:
    relays = [p for p in peers if _is_relay(p, rate)]
    leaves = [p for p in peers if not _is_relay(p, rate)]
    relays.sort(key=lambda p: (-p.upload_bytes_per_s, p.peer_id))
    leaves.sort(key=lambda p: (-p.download_bytes_per_s, p.peer_id))
    return relays + leaves


def _is_relay(peer: PeerInfo, rate: float) -> bool:
    return peer.reachable and peer.download_bytes_per_s >= rate


@dataclass(eq=False)
class _Node:
    peer_id: str
    url: str
    upload_bytes_per_s: float
    download_bytes_per_s: float
    capacity: int
    depth: int
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)
    subtree: int = 0

    def ancestors(self) -> list[_Node]:
        chain, node = [], self.parent
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain


class _Tree:
    def __init__(self, origin: OriginInfo, rate: float, config: BroadcastConfig) -> None:
        capacity = _fanout(origin.upload_bytes_per_s, rate, config.max_first_hop)
        self.root = _Node(origin.peer_id, origin.url, origin.upload_bytes_per_s, math.inf, capacity, 0)
        self.rate, self.config = rate, config
        self.relays: list[_Node] = [self.root]
        self.open: deque[_Node] = deque([self.root])
        self.nodes: list[_Node] = []

    def attach(self, peer: PeerInfo) -> None:
        relay = _is_relay(peer, self.rate)
        capacity = _fanout(peer.upload_bytes_per_s, self.rate, self.config.max_fanout) if relay else 0
        parent = self._free_slot() or self._least_costly_parent()
        node = _Node(peer.peer_id, peer.url, peer.upload_bytes_per_s, peer.download_bytes_per_s,
                     capacity, parent.depth + 1, parent)
        parent.children.append(node)
        for ancestor in node.ancestors():
            ancestor.subtree += 1
        self.nodes.append(node)
        if relay and node.depth < self.config.max_depth:
            self.relays.append(node)
            self.open.append(node)

    def _free_slot(self) -> _Node | None:
        while self.open and len(self.open[0].children) >= self.open[0].capacity:
            self.open.popleft()
        return self.open[0] if self.open else None

    def _least_costly_parent(self) -> _Node:
        return max(self.relays, key=lambda n: (n.upload_bytes_per_s / (len(n.children) + 1), -n.subtree, -n.depth))

    def to_plan(self, version: int) -> BroadcastPlan:
        return BroadcastPlan(
            version=version, mode="pipelined", stream_rate_bytes_per_s=self.rate,
            origin_children=[c.peer_id for c in self.root.children],
            assignments=[self._assignment(version, node) for node in self.nodes],
        )

    def _assignment(self, version: int, node: _Node) -> Assignment:
        ancestors = node.ancestors()  # parent first, the origin always last
        keep = self.config.max_sources
        sources = ancestors if len(ancestors) <= keep else ancestors[: max(1, keep - 1)] + [self.root][: keep - 1]
        path_rates = [_edge_rate(n) for n in [node, *ancestors[:-1]]]
        return Assignment(
            version=version, worker_id=node.peer_id, mode="pipelined",
            sources=[Source(peer_id=n.peer_id, url=n.url) for n in sources],
            children=[c.peer_id for c in node.children], depth=node.depth,
            edge_rate_bytes_per_s=path_rates[0], planned_rate_bytes_per_s=min(path_rates),
        )


def _fanout(upload_bytes_per_s: float, rate: float, cap: int) -> int:
    return max(1, min(cap, int(upload_bytes_per_s // rate)))


def _edge_rate(node: _Node) -> float:
    assert node.parent is not None
    return min(node.parent.upload_bytes_per_s / len(node.parent.children), node.download_bytes_per_s)


def for_worker(plan: BroadcastPlan, worker_id: str) -> Assignment:
    """BroadcastPlan.for_worker as it was: a scan of every assignment."""
    for assignment in plan.assignments:
        if assignment.worker_id == worker_id:
            return assignment
    raise ValueError(f"worker {worker_id!r} is not in the plan for version {plan.version}")
