"""Broadcast topology: which source each worker pulls a version from (a pure function the
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

The coordinator plans every version it publishes (about once a second) over every live worker,
up to 10,000: placing N workers costs O(N (log N + depth)) (`_Tree`), and building the N
pydantic Assignments is about half of what remains (benchmarks/policy_scale.py).

One-to-many mode gives every worker the learner as its only source. See `latency` for the
dissemination time each plan predicts. The plan's data types (PeerInfo, Assignment, ...) are
echo2.protocol.broadcast's: the coordinator sends each worker its assignment.
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence
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
    relays, leaves = _placement_order(peers, rate)
    for peer in relays:
        tree.attach(peer, relay=True)
    for peer in leaves:
        tree.attach(peer, relay=False)
    return tree.to_plan(version)


def late_joiner_assignment(
    version: int, joiner: PeerInfo, holders: list[PeerInfo], *, origin: OriginInfo, config: BroadcastConfig,
    holders_ordered: bool = False,
) -> Assignment:
    """Sources for a worker joining after `version` went out: any reachable holder, fastest
    uplink first, the learner last. `holders_ordered`: `holders` is in that order already
    (`fastest_first(holders)`, e.g. kept once per version), so the first usable ones are taken
    and the rest never looked at; else the k fastest are picked by a bounded heap, O(holders x
    log k) (k = max_sources - 1, a handful), not a sort of every holder per joiner."""
    k = config.max_sources - 1
    usable_holders = (h for h in holders if h.reachable and h.url and h.peer_id != joiner.peer_id)
    if holders_ordered:
        usable = list(itertools.islice(usable_holders, max(0, k)))
    else:  # heapq.nsmallest is sorted(...)[:k], ties in input order included
        usable = heapq.nsmallest(k, usable_holders, key=_fastest_uplink) if k > 0 else []
    sources = [Source(peer_id=h.peer_id, url=h.url) for h in usable] + [_origin_source(origin)]
    first_upload = usable[0].upload_bytes_per_s if usable else origin.upload_bytes_per_s
    rate = min(first_upload, joiner.download_bytes_per_s)
    return Assignment(
        version=version, worker_id=joiner.peer_id, mode=config.mode, sources=sources,
        edge_rate_bytes_per_s=rate, planned_rate_bytes_per_s=rate,
    )


def fastest_first(holders: list[PeerInfo]) -> list[PeerInfo]:
    """`holders` in the order late joiners are given them: fastest uplink first, ties by id."""
    return sorted(holders, key=_fastest_uplink)


def _fastest_uplink(holder: PeerInfo) -> tuple[float, str]:
    return -holder.upload_bytes_per_s, holder.peer_id


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


def _placement_order(peers: list[PeerInfo], rate: float) -> tuple[list[PeerInfo], list[PeerInfo]]:
    """Relays, fastest uplink first, then leaves, fastest downlink first (ties by id)."""
    relays: list[PeerInfo] = []
    leaves: list[PeerInfo] = []
    for p in peers:
        (relays if _is_relay(p, rate) else leaves).append(p)
    relays.sort(key=lambda p: (-p.upload_bytes_per_s, p.peer_id))
    leaves.sort(key=lambda p: (-p.download_bytes_per_s, p.peer_id))
    return relays, leaves


def _is_relay(peer: PeerInfo, rate: float) -> bool:
    return peer.reachable and peer.download_bytes_per_s >= rate


@dataclass(eq=False, slots=True)
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
    rank: int = -1
    """Place among the relays (the order they were added); -1: not a relay."""
    sources: Sequence[Source] = ()
    """What its assignment names (set by `_Tree.to_plan`, parents first; the origin names none)."""
    child_sources: list[Source] | None = None
    """What each of its children's assignments names: the same for all of them."""
    planned_rate_bytes_per_s: float = math.inf
    """Slowest edge on its path from the origin (set by `_Tree.to_plan`, parents first)."""


class _Tree:
    """The relay tree under construction.

    Attaching a worker costs O(depth + log relays): a free slot is the head of a FIFO of open
    relays, and the least costly parent the top of a heap of relays keyed by
    (-uplink share, subtree, depth, rank), the same order as a scan for the max of
    (share, -subtree, -depth) that keeps the first of equals. Entries go stale rather than being
    updated: a relay's share only falls (it gains children) and its subtree only grows, so a
    stale entry ranks a relay at least as well as it now deserves, and an entry found stale at
    the top is refreshed and pushed back until the top is current (a few per placement). The
    subtree counts cost O(depth) per worker; a linear scan over the relays per worker placed
    past the free slots would make a plan quadratic, seconds at 10,000 workers
    (benchmarks/policy_scale.py measures planning at scale).
    """

    def __init__(self, origin: OriginInfo, rate: float, config: BroadcastConfig) -> None:
        capacity = _fanout(origin.upload_bytes_per_s, rate, config.max_first_hop)
        self.root = _Node(origin.peer_id, origin.url, origin.upload_bytes_per_s, math.inf, capacity, 0)
        self.rate, self.config = rate, config
        self.relays: list[_Node] = []
        """By rank: the order they were added."""
        self.costs: list[tuple[float, int, int, int, int]] = []
        """Heap of (-share, subtree, depth, rank, children), one entry per relay: numbers only, so
        the collector untracks them (fewer objects to sweep at 10,000 workers)."""
        self.open: deque[_Node] = deque([self.root])
        self.nodes: list[_Node] = []
        self._add_relay(self.root)

    def attach(self, peer: PeerInfo, *, relay: bool) -> None:
        """Place `peer` (a relay: `_is_relay`) under the next free slot or the least costly relay."""
        capacity = _fanout(peer.upload_bytes_per_s, self.rate, self.config.max_fanout) if relay else 0
        parent = self._free_slot() or self._least_costly_parent()
        node = _Node(peer.peer_id, peer.url, peer.upload_bytes_per_s, peer.download_bytes_per_s,
                     capacity, parent.depth + 1, parent)
        parent.children.append(node)
        ancestor: _Node | None = parent
        while ancestor is not None:
            ancestor.subtree += 1
            ancestor = ancestor.parent
        self.nodes.append(node)
        if relay and node.depth < self.config.max_depth:
            self._add_relay(node)
            self.open.append(node)

    def _add_relay(self, node: _Node) -> None:
        node.rank = len(self.relays)
        self.relays.append(node)
        heapq.heappush(self.costs, _cost(node))

    def _free_slot(self) -> _Node | None:
        while self.open and len(self.open[0].children) >= self.open[0].capacity:
            self.open.popleft()  # full for good: children only grow
        return self.open[0] if self.open else None

    def _least_costly_parent(self) -> _Node:
        """The relay with the largest uplink share after one more child, then the smallest
        subtree, then the shallowest, then the first added."""
        costs = self.costs
        while True:
            _, subtree, _, rank, children = costs[0]
            node = self.relays[rank]
            if subtree == node.subtree and children == len(node.children):
                return node
            heapq.heapreplace(costs, _cost(node))

    def to_plan(self, version: int) -> BroadcastPlan:
        assignments = []
        root = self.root
        for node in self.nodes:  # attach order: every parent before its children
            parent = node.parent
            assert parent is not None
            # the edge's share of the parent's uplink, capped by the downlink; the slowest edge
            # on the path is the parent's own planned rate or this edge
            edge = min(parent.upload_bytes_per_s / len(parent.children), node.download_bytes_per_s)
            node.planned_rate_bytes_per_s = edge if parent is root else min(edge, parent.planned_rate_bytes_per_s)
            node.sources = parent.child_sources or self._child_sources(parent)
            assignments.append(Assignment(
                version=version, worker_id=node.peer_id, mode="pipelined", sources=node.sources,
                children=[c.peer_id for c in node.children], depth=node.depth,
                edge_rate_bytes_per_s=edge, planned_rate_bytes_per_s=node.planned_rate_bytes_per_s,
            ))
        plan = BroadcastPlan(
            version=version, mode="pipelined", stream_rate_bytes_per_s=self.rate,
            origin_children=[c.peer_id for c in root.children], assignments=assignments,
        )
        for node in self.nodes:  # no parent <-> child cycles: reference counting frees the tree on
            node.parent = None  # return, rather than the cycle collector (10,000 nodes a version)
        return plan

    def _child_sources(self, parent: _Node) -> list[Source]:
        """Sources of a child of `parent`: its ancestors (the parent first, the origin last) when
        it has at most max_sources of them (a child at depth d has d), else its nearest
        max_sources - 1 (at least the parent) and the origin (none with max_sources = 1). From
        the parent's own sources: those are the parent's ancestors, or its nearest
        max_sources - 1 and the origin, so their head is what the child keeps after the parent."""
        keep = self.config.max_sources
        own = Source(peer_id=parent.peer_id, url=parent.url)
        if parent.depth + 1 <= keep:
            chosen = [own, *parent.sources]
        else:
            origin = parent.sources[-1:] if keep > 1 else []  # the parent's sources end with the origin
            chosen = [own, *parent.sources[: max(1, keep - 1) - 1], *origin]
        parent.child_sources = chosen
        return chosen


def _cost(node: _Node) -> tuple[float, int, int, int, int]:
    children = len(node.children)
    return -(node.upload_bytes_per_s / (children + 1)), node.subtree, node.depth, node.rank, children


def _fanout(upload_bytes_per_s: float, rate: float, cap: int) -> int:
    return max(1, min(cap, int(upload_bytes_per_s // rate)))
