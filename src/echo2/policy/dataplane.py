"""The data plane on plain data: how the staleness rules of `admission` combine into leases,
admission at submission, the drop of stale groups and the batches. The coordinator drives it
under SQLite and HTTP (`CoordinatorState`), the simulator drives it with counts and versions
(`echo2.sim.dataplane`); neither restates a rule.

Symbols: learner step t, staleness bound S, prompt groups per step P (grpo.prompts_per_step;
B = P x group_size is rollouts, as in the planner). A group is anything the caller
keeps (a stored record, or just its version); `version_of` reads its policy version.

- lease: refused before the first version and while the worker is more than S versions behind;
  otherwise up to `lease_capacity` groups (with workers that swap versions mid-generation, over
  a window `ahead_steps` longer: a group trained that much later still has under
  train.max_masked_fraction of its tokens older than S), where outstanding = leased + buffered, and at most
  `max_leases_per_worker` held by one worker; a worker named by its id is held to what it has
  earned (`policy.trust`: slow start for new ids, whose leases share a quarter of the window);
- submit: a group is buffered iff it is admissible at the current learner step: one version
  sampled it and t - v <= S, or several did (a worker swapped weights mid-generation) and its
  share of tokens older than S is below train.max_masked_fraction (`admission.admits_tokens`);
- advance(t): the learner asks for step t: buffered groups no longer admissible are dropped;
- take_batch(t): the oldest P buffered groups (submission order; with segment swaps, the P whose
  admission ends soonest) form step t's batch, at most
  `batch_share_cap` of them one worker's while other workers' groups are buffered or on their
  way (`policy.trust`); the learner's wait for it sets how far ahead workers may generate
  (`policy.window`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from echo2.planner.capacity import swap_ahead_steps
from echo2.policy.admission import admits_tokens, last_admissible_step, lease_capacity, worker_may_lease
from echo2.policy.outcome import SubmissionOutcome
from echo2.policy.trust import LeaseTrust, batch_share_cap, share_wait_s
from echo2.policy.window import LeaseWindow
from echo2.protocol.messages import LeaseRefusal

GENERATIONS_KEPT = 64
"""Recent leases whose generation times set how far ahead swapping workers may lease."""
PERIODS_KEPT = 16
"""Recent intervals between batches whose median is the learner's step period."""


def segment_seconds(held_s: float, segment_tokens: int, longest_tokens: int) -> float:
    """Seconds between a generation's swap points: a lease's `held_s` over its longest
    completion's tokens (the rows advance together), times sampling.segment_tokens."""
    return held_s * min(1.0, segment_tokens / max(1, longest_tokens))

G = TypeVar("G")

# retry_after_s of each refusal: what a refused worker waits before asking again. No version yet
# takes a learner start (seconds); a stale worker needs one swap; the window opens when the
# learner takes its next batch, the fastest of the three.
NO_VERSION_RETRY_S = 0.5
STALE_RETRY_S = 0.2
OWN_CAP_RETRY_S = 0.2
WINDOW_RETRY_S = 0.1
NEW_POOL_RETRY_S = 0.5  # new workers' leases come back in a generation time, not a batch


@dataclass(frozen=True)
class LeaseGrant:
    """How many groups a lease may carry; when none, why and when to ask again."""

    count: int
    retry_after_s: float = 0.0
    reason: str = ""
    refusal: LeaseRefusal | None = None


class DataPlane(Generic[G]):
    def __init__(
        self,
        max_staleness: int,
        groups_per_step: int,
        version_of: Callable[[G], int],
        *,
        max_leases_per_worker: int = 0,
        buffer: Iterable[G] = (),
        learner_step: int = 0,
        steps_taken: int = 0,
        current_version: int = -1,
        fresh_leases: bool = False,
        worker_of: Callable[[G], str] | None = None,
        max_worker_share: float = 1.0,
        tokens_of: Callable[[G], Mapping[int, int]] | None = None,
        max_masked_fraction: float = 1.0,
        segment_swaps: bool = False,
        trust: LeaseTrust | None = None,
    ) -> None:
        """`max_leases_per_worker` 0: P (a worker may hold one step's worth). `fresh_leases`:
        lease only as far ahead as keeps the learner from waiting (`policy.window`); else the
        whole window of S steps. `worker_of` (None: groups carry no worker, no share cap) and
        `max_worker_share` bound one worker's part of a batch. `tokens_of`: a group's trained
        tokens per version that sampled them (None: one version sampled each group, its
        `version_of`), bounded by `max_masked_fraction`. `segment_swaps`: workers swap newer
        versions in mid-generation (sampling.segment_tokens), so leases may reach
        `ahead_steps()` steps past the window (False: every group trained by its version + S).
        `trust`: what each worker earned (None: slow start alone, no clock to measure delivery)."""
        self.segment_swaps = segment_swaps
        self.generations: deque[tuple[float, float]] = deque(maxlen=GENERATIONS_KEPT)
        """Recent leases' (seconds held, seconds per segment), for `ahead_steps`."""
        self.tokens_of = tokens_of or (lambda group: {version_of(group): 1})
        self.max_masked_fraction = max_masked_fraction
        self.max_staleness, self.groups_per_step, self.version_of = max_staleness, groups_per_step, version_of
        self.max_leases_per_worker = max_leases_per_worker or groups_per_step
        self.worker_of, self.max_worker_share = worker_of, max_worker_share
        self.trust = trust or LeaseTrust()
        """What each worker id earned: its lease allowance and deadline (`policy.trust`)."""
        self.buffer: list[G] = list(buffer)
        """Admitted groups waiting for a batch, oldest submission first."""
        self.learner_step, self.steps_taken, self.current_version = learner_step, steps_taken, current_version
        self._checked_at: int | None = None
        """Step at which every buffered group is known admissible (advance may skip the scan)."""
        self.window = LeaseWindow(max_staleness, adaptive=fresh_leases)
        self.asked_at: tuple[int, float] | None = None
        """(step, when) the learner first asked for the batch not yet taken."""
        self.step_time_s: float | None = None
        """The learner's recent busy time per step (the caller keeps it current)."""
        self.batch_times_s: deque[float] = deque(maxlen=PERIODS_KEPT + 1)
        """When the recent batches were taken (the caller's clock), for `step_period_s`."""

    # ---- versions ----
    def publish(self, version: int) -> None:
        self.current_version = max(self.current_version, version)

    # ---- leases ----
    def may_lease(self, worker_version: int) -> bool:
        return self.refusal(worker_version) is None

    def refusal(self, worker_version: int) -> LeaseGrant | None:
        """Why a worker holding `worker_version` gets no work whatever the window (None: it may)."""
        if self.current_version < 0:
            return LeaseGrant(0, NO_VERSION_RETRY_S, "no policy version published yet", "no_version")
        if worker_version < 0 or not worker_may_lease(self.current_version, worker_version, self.max_staleness):
            newest_needed = self.current_version - self.max_staleness
            return LeaseGrant(0, STALE_RETRY_S, f"weights too stale: load version >= {newest_needed}", "stale")
        return None

    def grant(self, worker_version: int, wanted: int, *, leased: int, held_by_worker: int,
              worker_id: str | None = None, held_by_new: int = 0) -> LeaseGrant:
        """Groups a worker holding `worker_version` and `held_by_worker` leases may take now, with
        `leased` leases open in all. Counts only: the caller records the leases it hands out.
        With `worker_id` the worker gets what it earned (`trust`); `held_by_new`: the leases held
        by workers with no accepted group (`trust.is_new`), who share a part of the window."""
        refused = self.refusal(worker_version)
        if refused is not None:
            return refused
        cap = (self.max_leases_per_worker if worker_id is None
               else self.trust.allowance(worker_id, self.max_leases_per_worker))
        own_room = cap - held_by_worker
        if own_room <= 0:
            earned = ("" if cap == self.max_leases_per_worker
                      else f" (allowed {cap} until more of its groups are accepted)")
            return LeaseGrant(0, OWN_CAP_RETRY_S, f"holding {held_by_worker} leases{earned}: return some first",
                              "own_cap")
        room = lease_capacity(max_staleness=self.window.steps + self.ahead_steps(),
                              groups_per_step=self.groups_per_step,
                              worker_version=worker_version, steps_taken=self.steps_taken,
                              outstanding_groups=leased + len(self.buffer))
        if worker_id is not None and room > 0 and self.trust.is_new(worker_id):
            pool = self.trust.new_pool(self.window_groups())
            if held_by_new >= pool:
                return LeaseGrant(0, NEW_POOL_RETRY_S, f"new workers hold their share of the window ({held_by_new} "
                                                       "leases): wait until one of theirs is accepted", "new_pool")
            room = min(room, pool - held_by_new)
        count = min(wanted, room, own_room)
        if count <= 0:
            ahead = f" (leasing {self.window.steps} of S={self.max_staleness} steps ahead)" \
                if self.window.steps < self.max_staleness else ""
            return LeaseGrant(0, WINDOW_RETRY_S, f"window full: waiting for the learner{ahead}", "window_full")
        return LeaseGrant(count)

    def window_groups(self) -> int:
        """Groups the lease window holds at the newest version (leased, buffered or waiting)."""
        return lease_capacity(max_staleness=self.window.steps + self.ahead_steps(),
                              groups_per_step=self.groups_per_step,
                              worker_version=max(0, self.current_version), steps_taken=self.steps_taken,
                              outstanding_groups=0)

    def observe_generation(self, held_s: float, segment_s: float) -> None:
        """A lease came back `held_s` after it was leased, its generation swapping versions every
        `segment_s` at most (`segment_seconds`)."""
        if self.segment_swaps:
            self.generations.append((held_s, segment_s))

    def ahead_steps(self) -> int:
        """Steps past the window a lease may reach when workers swap versions mid-generation:
        planner.capacity.swap_ahead_steps on what the leases took (the quartile of the recent
        generation times, the median segment: leasing too far ahead drops groups as stale) and
        the learner's step period (its step time, or the interval between batches when that is
        longer). 0 without swaps, and until both are measured."""
        if not self.segment_swaps or not self.generations or not self.step_time_s:
            return 0
        held = sorted(h for h, _ in self.generations)
        segments = sorted(s for _, s in self.generations)
        # versions arrive once per step period: the busy time, or longer while the learner
        # waits for batches (k steps ahead then cover more of a generation than k busy times)
        period_s = max(self.step_time_s, self.step_period_s() or 0.0)
        return swap_ahead_steps(held[len(held) // 4], period_s, segment_s=segments[len(segments) // 2],
                                max_masked_fraction=self.max_masked_fraction)

    def step_period_s(self) -> float | None:
        """The median interval between the recent batches taken with a clock (None: fewer than two)."""
        times = list(self.batch_times_s)
        gaps = sorted(b - a for a, b in zip(times[:-1], times[1:], strict=True))
        return gaps[len(gaps) // 2] if gaps else None

    # ---- rollouts ----
    def observe_submission(self, outcome: SubmissionOutcome) -> None:
        """An applied group: its worker's lease trust (time held, admitted or not) and, for
        swapping workers, the generation time that sets how far ahead they lease."""
        self.trust.submitted(outcome.worker_id, outcome.held_s, accepted=outcome.admitted)
        if outcome.segment_s is not None:
            self.observe_generation(outcome.held_s, outcome.segment_s)

    def admits(self, group: G) -> bool:
        """Would this group submitted now be buffered (rather than dropped as stale)?"""
        return self.admissible(self.learner_step, group)

    def admissible(self, step: int, group: G) -> bool:
        return admits_tokens(step, self.tokens_of(group), self.max_staleness, self.max_masked_fraction)

    def add(self, group: G) -> None:
        """Buffer a group the caller found admissible (`admits`) at the current learner step."""
        self.buffer.append(group)

    def requeue_front(self, groups: list[G]) -> None:
        """Groups back at the head of the buffer (a rejected batch's innocent groups): they are
        the oldest, and the next advance checks them again."""
        self.buffer[:0] = groups
        self._checked_at = None

    def remove(self, keep: Callable[[G], bool]) -> list[G]:
        """Drop buffered groups for which `keep` is false (a quarantined worker's); returns them."""
        removed = [g for g in self.buffer if not keep(g)]
        if removed:
            self.buffer = [g for g in self.buffer if keep(g)]
        return removed

    # ---- batches ----
    def advance(self, step: int) -> list[G]:
        """The learner asks for `step`: move there and drop buffered groups too stale for it;
        returns the dropped groups (the caller persists and reports them)."""
        self.learner_step = step
        if self._checked_at == step:
            return []  # asked again for the same step: nothing can have aged since the scan
        self._checked_at = step
        stale = [g for g in self.buffer if not self.admissible(step, g)]
        if stale:
            self.buffer = [g for g in self.buffer if self.admissible(step, g)]
        return stale

    def take_batch(self, step: int, now_s: float | None = None, *, producing: Iterable[str] = ()) -> list[G] | None:
        """Step `step`'s batch, the oldest P buffered groups (within the share cap), or None while
        fewer wait. Call `advance(step)` first (its drops are the caller's to record). `now_s`: the
        caller's clock, from which the learner's wait for each batch is measured (None: not
        measured, and a batch short of its share cap does not wait). `producing`: workers
        holding leases now, whose groups a batch short of its share cap may wait for."""
        if step != self.learner_step:
            raise ValueError(f"take_batch({step}) before advance({step}): the learner is at step {self.learner_step}")
        if now_s is not None and (self.asked_at is None or self.asked_at[0] != step):
            self.asked_at = (step, now_s)
        need = self.groups_per_step
        if len(self.buffer) < need:
            return None
        picked = self._pick(need, producing, now_s)
        if picked is None:
            return None
        chosen = set(picked)
        batch = [g for i, g in enumerate(self.buffer) if i in chosen]
        self.buffer = [g for i, g in enumerate(self.buffer) if i not in chosen]
        self.steps_taken = max(self.steps_taken, step + 1)
        if now_s is not None:
            self.batch_times_s.append(now_s)
        if now_s is not None and self.asked_at is not None:
            self.window.observe(now_s - self.asked_at[1], self.step_time_s)
            self.asked_at = None
        return batch

    def _pick(self, need: int, producing: Iterable[str], now_s: float | None) -> list[int] | None:
        """Buffer positions of the batch: first in `_serving_order`, at most `batch_share_cap` groups of one
        worker. Short of that, the batch waits (None) while workers not at the cap that already
        had a group accepted hold leases, for at most `share_wait_s`; then, or when no such
        worker exists (a one-worker run), the oldest groups over the cap fill it."""
        cap = batch_share_cap(self.max_worker_share, need)
        order = self._serving_order()
        if self.worker_of is None or cap >= need:
            return order[:need]
        counts: Counter[str] = Counter()
        chosen: list[int] = []
        over: list[int] = []
        for i in order:
            worker = self.worker_of(self.buffer[i])
            (chosen if counts[worker] < cap else over).append(i)
            counts[worker] += 1
            if len(chosen) == need:
                return chosen
        at_cap = {w for w, n in counts.items() if n >= cap}
        others = {w for w in producing if w not in at_cap and not self.trust.is_new(w)}
        waited_s = None if now_s is None or self.asked_at is None else now_s - self.asked_at[1]
        if others and waited_s is not None and waited_s < share_wait_s(self.step_time_s):
            return None
        return sorted(chosen + over[:need - len(chosen)])

    def _serving_order(self) -> list[int]:
        """Buffer positions in the order batches take them: submission order; with segment swaps
        earliest deadline first (`admission.last_admissible_step`, ties by submission). Leasing
        ahead buffers groups trained after v + S, next to groups a swap never reached, which the
        learner must train by v + S: in submission order those age out behind the others."""
        if not self.segment_swaps:
            return list(range(len(self.buffer)))
        step = self.learner_step
        deadline = [last_admissible_step(step, self.tokens_of(g), self.max_staleness, self.max_masked_fraction)
                    for g in self.buffer]
        return sorted(range(len(self.buffer)), key=lambda i: (deadline[i], i))
