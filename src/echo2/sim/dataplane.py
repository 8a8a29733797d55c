"""The coordinator's data plane as the simulator runs it: the policy core
(`echo2.policy.DataPlane`, the object `CoordinatorState` drives) over light bookkeeping: prompts
are counts and a buffered group is its version and its tokens per sampling version (`SimGroup`;
one version unless the worker swapped mid-generation, workload.segment_s). Only the accounting
is the simulator's (counters, the staleness histograms, leases held per worker, waking refused
workers when room opens). A worker named by its id leases under the coordinator's slow start
(`policy.trust`); its groups carry no worker here, so the batch share cap is the coordinator's
alone. Admission is the coordinator's per-token rule (`admission.admits_tokens`, bounded by
workload.max_masked_fraction), which for one-version groups is `t - v <= S`.

Dynamic sampling (workload.uninformative_share d): each admitted group is uninformative with
probability d (a seeded draw: the simulator has no rewards to look at) and then, as at the
coordinator under grpo.drop_uninformative_groups, counted and never buffered. Its lease closes
like any other, so the lease window opens by one group and another prompt is leased to fill the
batch (the refill the planner prices as B / (1 - d) rollouts per step).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from echo2.policy import DataPlane, is_admissible, staleness
from echo2.policy.trust import LeaseTrust


@dataclass
class DataCounters:
    leased: int = 0
    """Groups handed out in leases (each group is one prompt x G completions)."""
    accepted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    """Rejected at submission or dropped from the buffer: older than S when they would train."""
    dropped_on_arrival: int = 0
    """Of those, rejected at submission: leased while admissible, too old (or, with segment swaps,
    too many tokens older than S) by the time they were generated. The rest expired waiting in
    the buffer, behind others."""
    scored: int = 0
    """Groups submitted while admissible, each then drawn informative or not."""
    dropped_uninformative: int = 0
    """Admissible groups drawn uninformative: counted, never buffered (their prompts done)."""
    requeued: int = 0
    """Leases returned to the queue because their worker was preempted."""
    staleness_hist: Counter[int] = field(default_factory=Counter)
    """Staleness (t - v) of every trained group, v the version it started with."""
    token_staleness_hist: Counter[int] = field(default_factory=Counter)
    """Staleness of every trained token (t - the version that sampled it), masked ones left out,
    as the learner's token_staleness_hist."""
    tokens_masked_stale: int = 0
    """Tokens of trained groups older than S: generated, masked out of the loss."""


@dataclass(frozen=True, slots=True, eq=False)
class SimGroup:
    """A buffered group: the version it was leased with and its tokens per sampling version."""

    version: int
    tokens: dict[int, int]
    worker: str | None = None
    seq: int = 0
    """The run's number of the lease's last group buffered (what the audit vouches up to)."""


def _version(group: SimGroup) -> int:
    return group.version


def _tokens(group: SimGroup) -> dict[int, int]:
    return group.tokens


class SimDataPlane:
    def __init__(self, max_staleness: int, groups_per_step: int, max_leases_per_worker: int = 0,
                 fresh_leases: bool = False, *, slow_start: bool = False, uninformative_share: float = 0.0,
                 rng: random.Random | None = None, max_masked_fraction: float = 1.0,
                 segment_s: float | None = None, clock: Callable[[], float] | None = None,
                 audit_share: float = 0.0, audit_rng: random.Random | None = None) -> None:
        """`slow_start`: workers named in `lease` lease under `policy.trust` (sim.slow_start),
        their delivery measured on `clock` (the simulated time);
        `uninformative_share`: d, drawn per admitted group with `rng`; `max_masked_fraction`: f of
        the per-token rule (workload.max_masked_fraction); `segment_s`: workers swap versions in
        mid-generation at most this far apart (None: between generations only), so leases reach
        past the window as far as the leases' generation times allow (`DataPlane.ahead_steps`);
        `audit_share`: share of trained groups the learner's audit checks (each with `audit_rng`),
        each one passed and told to `on_audited`, as the coordinator tells its controller."""
        self.segment_s = segment_s
        self.core: DataPlane[SimGroup] = DataPlane(
            max_staleness, groups_per_step, _version, max_leases_per_worker=max_leases_per_worker,
            fresh_leases=fresh_leases, tokens_of=_tokens, max_masked_fraction=max_masked_fraction,
            segment_swaps=segment_s is not None, trust=LeaseTrust(clock),
        )
        self.slow_start = slow_start
        self.uninformative_share, self.rng = uninformative_share, rng or random.Random(0)
        self.in_leases = 0
        self.held: Counter[str] = Counter()
        """Groups leased per worker id (named in `lease`), for the new workers' pool."""
        self.counters = DataCounters()
        self.audit_share, self.audit_rng = audit_share, audit_rng or random.Random(0)
        self.group_seq = 0
        self.passed: Counter[str] = Counter()
        """Audited (and passed: simulated workers are honest) groups per worker."""
        self.on_buffered: Callable[[str, int], None] = lambda worker, seq: None
        self.on_audited: Callable[[str, int, int], None] = lambda worker, passed, seq: None
        """(worker, its passed audits so far, the newest passed group's number), after a step."""
        self.on_room: Callable[[], None] = lambda: None
        """Called when lease room opens without a version change (drops, requeued leases), so
        workers refused for a full window can ask again."""

    @property
    def current_version(self) -> int:
        return self.core.current_version

    @property
    def outstanding(self) -> int:
        return self.in_leases + len(self.core.buffer)

    def may_lease(self, worker_version: int) -> bool:
        return self.core.may_lease(worker_version)

    def registered(self, worker: str) -> None:
        """A worker (re)registers: it starts over as new, as at the coordinator."""
        self.core.trust.forget(worker)

    def lease(self, worker_version: int, wanted: int, held_by_worker: int = 0, worker: str | None = None) -> int:
        """Groups granted to a worker holding `worker_version` (0: refused or window full);
        `worker`: its id, for slow start (None: no slow start)."""
        worker = self._tracked(worker)
        new = sum(n for w, n in self.held.items() if self.core.trust.is_new(w))
        granted = self.core.grant(worker_version, wanted, leased=self.in_leases, held_by_worker=held_by_worker,
                                  worker_id=worker, held_by_new=new).count
        self.in_leases += granted
        self.counters.leased += granted
        if worker is not None:
            self.held[worker] += granted
        return granted

    def release(self, groups: int, worker: str | None = None) -> None:
        """A preempted worker's leases come back (their prompts go to the next lease)."""
        self._returned(groups, worker)
        self.counters.requeued += groups
        self.on_room()

    def _tracked(self, worker: str | None) -> str | None:
        return worker if self.slow_start else None

    def _returned(self, groups: int, worker: str | None) -> None:
        self.in_leases -= groups
        worker = self._tracked(worker)
        if worker is not None:
            self.held[worker] -= groups
            if self.held[worker] <= 0:
                del self.held[worker]

    def submit(self, version: int, groups: int, worker: str | None = None, held_s: float = 0.0, *,
               tokens: dict[int, int] | None = None) -> int:
        """Groups of one lease arrive, `held_s` after it was leased, each with `tokens` per
        sampling version (None: one token, all `version`'s); returns how many were dropped as
        stale."""
        self._returned(groups, worker)
        owner, worker = worker, self._tracked(worker)
        group = SimGroup(version, tokens or {version: 1}, owner)
        admitted = self.core.admits(group)
        if self.segment_s is not None:  # what the coordinator measures of each lease, as it does
            self.core.observe_generation(held_s, self.segment_s)
        was_new = worker is not None and self.core.trust.is_new(worker)
        for _ in range(groups if worker is not None else 0):
            self.core.trust.submitted(worker, held_s, accepted=admitted)
        if admitted:
            kept = self._informative(groups)
            if kept and owner is not None:
                self.group_seq += kept
                group = replace(group, seq=self.group_seq)
                self.on_buffered(owner, self.group_seq)
            for _ in range(kept):
                self.core.add(group)  # a lease's groups share one profile: one object serves them
            self.counters.accepted += kept
            if was_new or kept < groups:
                self.on_room()  # it left the new workers' pool, or dropped groups opened the window
            return 0
        self.counters.dropped_stale += groups
        self.counters.dropped_on_arrival += groups
        self.on_room()
        return groups

    def _informative(self, groups: int) -> int:
        """How many of `groups` admitted groups are kept: each is uninformative with probability d."""
        dropped = sum(self.rng.random() < self.uninformative_share for _ in range(groups))
        self.counters.scored += groups
        self.counters.dropped_uninformative += dropped
        return groups - dropped

    def publish(self, version: int) -> None:
        self.core.publish(version)

    def take_batch(self, step: int, now_s: float | None = None) -> list[SimGroup] | None:
        """The batch for `step`, or None while fewer than P admissible groups wait.
        `now_s`: the simulated clock (the learner's wait sets the lease window, as in the
        coordinator)."""
        dropped = self.core.advance(step)
        if dropped:
            self.counters.dropped_stale += len(dropped)
            self.on_room()
        window = self.core.window.steps
        batch = self.core.take_batch(step, now_s)
        if self.core.window.steps > window:
            self.on_room()  # the learner waited: the window grew, refused workers may lease now
        if batch is not None:
            self._trained(step, batch)
        return batch

    def _trained(self, step: int, batch: list[SimGroup]) -> None:
        self._audit(batch)
        c = self.counters
        c.trained += len(batch)
        c.staleness_hist.update(staleness(step, g.version) for g in batch)
        for g in batch:
            for version, n in g.tokens.items():
                age = staleness(step, version)
                if is_admissible(step, version, self.core.max_staleness):
                    c.token_staleness_hist[age] += n
                else:
                    c.tokens_masked_stale += n

    def _audit(self, batch: list[SimGroup]) -> None:
        """The learner's audit of a trained batch: each group checked with `audit_share`."""
        newest: dict[str, int] = {}
        for g in batch:
            if g.worker is not None and self.audit_share and self.audit_rng.random() < self.audit_share:
                self.passed[g.worker] += 1
                newest[g.worker] = max(newest.get(g.worker, 0), g.seq)
        for worker, seq in newest.items():
            self.on_audited(worker, self.passed[worker], seq)
