"""In what order the workers hear of a new version (`http.upkeep.version_news_to`): the relay
tree read depth first, so a worker is never told before the relay it pulls from.

A told worker fetches at once from its parent in the plan (its first source). A parent not yet
told holds the child's stream open for up to broadcast.announce_wait_s before it fails over, so
whoever is told, its ancestors are told in the same round, root first. The active workers and
their ancestors are told as soon as a version is published (the learner's next batches wait on
their fetch); the idle workers not yet told of it take turns, a run of the tree's depth-first
order at a time (`IdleTurns`). A contiguous run needs few extra lines: every parent outside it
lies on the path from the root to its first worker (preorder lists a subtree as one run, its
root first)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from echo2.protocol.broadcast import BroadcastPlan

_ORDER_KEY = "_news_order"
"""Where a plan keeps its TreeOrder (in its __dict__, as `BroadcastPlan._by_worker` keeps its
index: pydantic compares and serializes the fields alone). A plan copied for the next version
over the same tree (`dissemination._for_version`) carries it along."""


@dataclass(frozen=True)
class TreeOrder:
    preorder: tuple[str, ...] = ()
    """The plan's workers depth first from the learner: each relay before its children."""
    parent: dict[str, str] = field(default_factory=dict)
    """Worker id -> the worker it pulls from in the plan (absent: the learner feeds it)."""

    def with_ancestors(self, workers: Iterable[str], chosen: dict[str, None],
                       told: Callable[[str], bool] = lambda worker_id: False) -> None:
        """Add each of `workers` to `chosen` (an ordered set) after its ancestors, root first; a
        chain stops at the first ancestor already chosen or `told` (its own are then told too)."""
        for worker_id in workers:
            if worker_id in chosen:
                continue
            chain = [worker_id]
            parent = self.parent.get(worker_id)
            while parent is not None and parent not in chosen and not told(parent):
                chain.append(parent)
                parent = self.parent.get(parent)
            for member in reversed(chain):
                chosen[member] = None


def tree_order(plan: BroadcastPlan | None) -> TreeOrder:
    """`plan`'s TreeOrder, made once per tree (O(workers)); an empty one without a plan."""
    if plan is None:
        return TreeOrder()
    made = plan.__dict__.get(_ORDER_KEY)
    if made is not None and made[0] == plan.origin_children and made[1] == len(plan.assignments):
        return made[2]
    children = {a.worker_id: a.children for a in plan.assignments}
    preorder: list[str] = []
    parent: dict[str, str] = {}
    stack = list(reversed(plan.origin_children))
    while stack:
        worker_id = stack.pop()
        preorder.append(worker_id)
        below = children.get(worker_id, ())
        for child in below:
            parent.setdefault(child, worker_id)
        stack.extend(reversed(below))
    placed = set(preorder)  # a worker no relay names (none in a well-formed plan) still has turns
    preorder.extend(a.worker_id for a in plan.assignments if a.worker_id not in placed)
    order = TreeOrder(tuple(dict.fromkeys(preorder)), parent)
    plan.__dict__[_ORDER_KEY] = (list(plan.origin_children), len(plan.assignments), order)
    return order


class IdleTurns:
    """Where the idle workers' next turn starts in the tree's depth-first order."""

    def __init__(self) -> None:
        self.cursor = 0

    def next_run(self, order: TreeOrder, count: int, *, told: Callable[[str], bool]) -> list[str]:
        """The next `count` workers of `order.preorder` from the cursor that are not `told`,
        looking once around the order at most; the cursor moves past the workers looked at."""
        workers = order.preorder
        run: list[str] = []
        looked = 0
        while looked < len(workers) and len(run) < count:
            worker_id = workers[(self.cursor + looked) % len(workers)]
            looked += 1
            if not told(worker_id):
                run.append(worker_id)
        self.cursor = (self.cursor + looked) % len(workers) if workers else 0
        return run
