"""Rollout workers in the simulator: each one's state and its behaviour on every event.

A worker runs `slots` generations at once (continuous batching on a GPU; one for the local CPU
worker). A slot leases up to `tasks_per_lease` groups, generates them in n*G*slots/r seconds
(so the worker sustains r rollouts/s), submits them, and leases again. A version's bytes arrive
in the background, pushed by the broadcast (`rounds.Broadcaster`), or, in pull mode (the local
system), fetched from the learner once a heartbeat tells the worker of it; the worker then swaps
them in, which stalls its generations for T_load. With segment swaps (workload.segment_s = T_seg,
the worker's sampling.segment_tokens) a version that arrives while the worker generates goes in
at the next segment boundary (the oldest running lease's clock, every T_seg of generation), and
the leases go on under it: their groups' tokens span versions, split by the time spent under each
(`Generation.tokens`), and the coordinator's per-token rule admits them. Spot workers are preempted and come back
after a while; the coordinator requeues their leases once it notices.
A rented worker the activation controller made inactive leases nothing but keeps its weights
current and bills as idle; a released one (not rented) bills nothing and holds no version.
Every scheduled event carries the worker's `epoch`, bumped on preemption, so events of a
previous life are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from echo2.config.sim import ScenarioConfig
from echo2.sim.dataplane import SimDataPlane
from echo2.sim.events import EventLoop
from echo2.sim.workers import Generation, SimWorker, build_workers, default_slots

__all__ = ["Fleet", "Generation", "SimWorker", "build_workers", "default_slots"]


class Fleet:
    """Worker behaviour. Collaborators are wired by the simulator: `on_submit` (the learner
    checks for a batch), `on_join` (the broadcast serves newcomers), `on_preempted` (the
    activation controller re-decides) and `publish_time_s` (for publish-to-loaded latency)."""

    def __init__(self, scenario: ScenarioConfig, workers: list[SimWorker], loop: EventLoop, data: SimDataPlane):
        self.workers, self.loop, self.data = workers, loop, data
        sim, work = scenario.sim, scenario.workload
        self.group_size = work.group_size
        self.background_fetch = work.background_fetch
        self.retry_s, self.stale_retry_s = sim.lease_retry_s, sim.stale_retry_s
        self.announce_s, self.timeout_s = sim.announce_interval_s, sim.worker_timeout_s
        self.generation_cv, self.generation_range = sim.generation_cv, sim.generation_range
        self.swap_between = sim.swap == "between_generations"
        self.segment_s = work.segment_s
        # tokens only set shares (admission, the masked share); without a mean length, a
        # thousand per rollout resolves them to well under a percent
        self.tokens_per_group = round(work.group_size * (work.tokens_per_rollout or 1000))
        self.lazy_refresh = sim.refresh == "when_behind"
        self.catch_up_bytes = scenario.workload.catch_up_bytes
        self.hop_s = scenario.broadcast.hop_latency_s
        self.waiting: dict[SimWorker, None] = {}  # refused for a full window, in refusal order
        self.polling: dict[SimWorker, str] = {}
        """Workers pausing after a refusal, and why: "window" (full) or "stale" (too far behind)."""
        self.on_submit: Callable[[], None] = lambda: None
        self.on_join: Callable[[SimWorker], None] = lambda w: None
        self.on_preempted: Callable[[SimWorker], None] = lambda w: None
        self.on_registered: Callable[[SimWorker], None] = lambda w: None
        """A worker is rented and up: it registers with the coordinator."""
        self.on_left: Callable[[SimWorker, bool], None] = lambda w, released: None
        """A registered worker is gone: preempted (False) or released by its provider (True)."""
        self.on_finished: Callable[[SimWorker, Generation, int], None] = lambda w, g, dropped: None
        """A lease was generated and submitted; how many of its groups were dropped as stale."""
        self.on_loaded: Callable[[SimWorker, float], None] = lambda w, latency_s: None
        """A worker swapped a version in, `latency_s` after its publish."""
        self.publish_time_s: list[float] = []
        self.loaded_latency_s: list[float] = []
        self.rollouts = 0
        data.on_room = self.wake_waiting

    # ---- membership and billing ----
    def join(self, w: SimWorker, start_delay_s: float | None = None) -> None:
        """Machine up: at the start, after its `start_delay_s` (one rented since the start bills
        from its acquire, the delay included, and registers now), or back from a preemption (None:
        a rented one is acquired again, so it bills from now and boots before it registers)."""
        w.alive, w.booting = True, False
        w.version = w.staged = w.incoming = -1
        if w.mean_uptime_s is not None:
            self.loop.after(w.rng.expovariate(1.0 / w.mean_uptime_s), self.preempt, w, w.epoch)
        self._bill(w)
        if not w.rented:
            return
        if start_delay_s is None:
            self._boot(w)
            return
        if w.billed_from_s is not None:  # back to the acquire, if it came during the delay
            w.billed_from_s = max(w.acquired_s, w.billed_from_s - start_delay_s)
        self._register(w)

    def _boot(self, w: SimWorker) -> None:
        """An acquired machine is up: it registers after its class's boot_s, billed all along."""
        if w.boot_s > 0:
            w.booting = True
            self.loop.after(w.boot_s, self._booted, w, w.epoch)
        else:
            self._register(w)

    def _register(self, w: SimWorker) -> None:
        """Registered with the coordinator; it connects for versions once its engine is up."""
        w.registrations += 1
        self.on_registered(w)
        if w.engine_start_s > 0:
            self.loop.after(w.engine_start_s, self._engine_started, w, w.registrations)
        else:
            self._connect(w)

    def _engine_started(self, w: SimWorker, registration: int) -> None:
        if registration == w.registrations and w.alive and w.rented and not w.booting:
            self._connect(w)

    def _connect(self, w: SimWorker) -> None:
        """A rented, live worker with no version: registration tells it the newest (pull mode)
        or the broadcast serves it in its next round (push)."""
        self.data.registered(w.id)
        if self.announce_s > 0:
            self.heartbeat(w, w.epoch, first=True)
        else:
            self.on_join(w)

    def rent(self, w: SimWorker, rented: bool) -> None:
        """Acquire (True: bills from now, registers after boot_s) or release (False: bills no
        more) the worker's machine, as the provider's ledger bills it."""
        if w.rented == rented:
            return
        w.rented = rented
        if rented:
            w.acquired_s = self.loop.now_s
        else:
            self._drop_work(w, requeue_after_s=0.0)
            w.version = w.staged = w.incoming = -1
        self._bill(w)  # a machine that is down bills, and boots, once it is up (join)
        if w.alive and rented:
            self._boot(w)
        elif w.alive:
            w.booting = False
            self.on_left(w, True)

    def _booted(self, w: SimWorker, epoch: int) -> None:
        if epoch != w.epoch or not (w.alive and w.rented and w.booting):
            return  # preempted or released while it booted
        w.booting = False
        self._register(w)

    def set_active(self, w: SimWorker, active: bool) -> None:
        """The controller's decision: an inactive worker finishes its leases and takes no more."""
        if w.active == active:
            return
        w.active = active
        if not active:
            self._stale_edge(w, False)
        self._bill(w)
        if active:
            self.fill(w)

    def preempt(self, w: SimWorker, epoch: int) -> None:
        if epoch != w.epoch or not w.alive:
            return
        w.alive = False
        was_rented = w.rented
        self._drop_work(w, requeue_after_s=self.timeout_s)
        self._bill(w)
        self.loop.after(w.rng.expovariate(1.0 / w.mean_downtime_s), self.join, w)
        if was_rented:  # only rented machines matter to the run
            w.preemptions += 1
            self.on_left(w, False)
            self.on_preempted(w)

    def _drop_work(self, w: SimWorker, requeue_after_s: float) -> None:
        """Void the worker's pending events; its leases return once the coordinator notices."""
        w.epoch += 1
        leased = sum(g.groups for g in w.generations)
        for g in w.generations:
            g.live = False
        w.generations.clear()
        self._busy_edge(w)
        self._stale_edge(w, False)
        w.swapping = w.receiving = w.segment_swap = False
        self.waiting.pop(w, None)
        self.polling.pop(w, None)
        if leased:
            self.loop.after(requeue_after_s, self.data.release, leased, w.id)

    def _bill(self, w: SimWorker) -> None:
        """Close or open the worker's billing interval: billed while rented and up (active or idle)."""
        now = self.loop.now_s
        if w.billed_from_s is not None:
            spent_s = now - w.billed_from_s
            w.billed_s += spent_s
            if w.billed_active:
                w.active_s += spent_s
            else:
                w.idle_s += spent_s
            w.billed_from_s = None
        if w.rented and w.alive:
            w.billed_from_s, w.billed_active = now, w.active

    def _busy_edge(self, w: SimWorker) -> None:
        """Open or close the worker's lease-holding interval after its leases changed."""
        now = self.loop.now_s
        if w.generations and w.busy_since_s is None:
            w.busy_since_s = now
        elif not w.generations and w.busy_since_s is not None:
            w.busy_s += now - w.busy_since_s
            w.busy_since_s = None

    def _stale_edge(self, w: SimWorker, stale: bool) -> None:
        """Open (refused as too stale) or close (leased, dropped, made inactive) its stale spell."""
        now = self.loop.now_s
        if stale and w.stale_since_s is None:
            w.stale_since_s = now
        elif not stale and w.stale_since_s is not None:
            w.stale_s += now - w.stale_since_s
            w.stale_since_s = None

    def stale_s_total(self, w: SimWorker) -> float:
        open_s = self.loop.now_s - w.stale_since_s if w.stale_since_s is not None else 0.0
        return w.stale_s + open_s

    def close_billing(self) -> None:
        for w in self.workers:
            self._bill(w)

    # ---- weights ----
    def expect(self, w: SimWorker, version: int) -> None:
        """A broadcast round is bringing `version` to w."""
        w.incoming = max(w.incoming, version)
        if not self.background_fetch:
            w.receiving = True

    def deliver(self, w: SimWorker, version: int, epoch: int) -> None:
        """The version's bytes are all on the worker (verified): stage it for a swap."""
        if epoch != w.epoch or version <= max(w.version, w.staged):
            return
        w.staged = version
        # between generations: wait for the running lease or the full-window pause to end (a
        # worker refused as too stale waits for exactly this version and swaps at once)
        busy = w.generations or self.polling.get(w) == "window"
        lazy = self.lazy_refresh and self.data.may_lease(w.version)  # still useful: keep generating
        if self.segment_s is not None and w.generations and not w.swapping and not lazy:
            self._swap_at_segment(w)
        elif not w.swapping and not (self.swap_between and busy) and not lazy:
            self._start_swap(w)

    def _swap_at_segment(self, w: SimWorker) -> None:
        """Swap the staged version in at the next segment boundary of the oldest running lease."""
        if w.segment_swap:
            return
        w.segment_swap = True
        first_s = min(g.started_s for g in w.generations)
        elapsed_s = self.loop.now_s - first_s
        segments = math.ceil(elapsed_s / self.segment_s) if self.segment_s > 0 else 0
        self.loop.at(max(self.loop.now_s, first_s + segments * self.segment_s), self._segment_boundary, w, w.epoch)

    def _segment_boundary(self, w: SimWorker, epoch: int) -> None:
        if epoch != w.epoch or not w.segment_swap:
            return
        w.segment_swap = False
        if not w.swapping and w.staged > w.version:
            self._start_swap(w)

    def fetch_s(self, w: SimWorker, version: int) -> float:
        """Pull mode: the way to `version` straight from the learner at the worker's own
        bandwidth (the missed versions, or join_bytes for a worker holding none)."""
        behind = version - w.newest() if w.newest() >= 0 else None
        return self.catch_up_bytes(behind) * 8 / w.bandwidth_bps + self.hop_s

    def heartbeat(self, w: SimWorker, epoch: int, first: bool = False) -> None:
        """Pull mode (the local system): the worker hears of the newest version only at its
        heartbeats and then fetches it straight from the learner, one fetch at a time."""
        if epoch != w.epoch:
            return
        latest = len(self.publish_time_s) - 1
        fetching = w.incoming > max(w.version, w.staged)
        if latest > w.newest() and not fetching:
            w.incoming = latest
            self.loop.after(self.fetch_s(w, latest), self.deliver, w, latest, epoch)
        # the real loop sleeps the interval, then makes the request: a period of interval + RTT,
        # with the RTT varying (exponential) so heartbeats drift against learner steps
        period_s = (
            self.announce_s + w.rng.expovariate(1.0 / w.request_s) if w.request_s > 0 else self.announce_s
        )
        self.loop.after(w.heartbeat_phase_s if first else period_s, self.heartbeat, w, epoch)

    def _start_swap(self, w: SimWorker) -> None:
        """Swap the staged version in: every running generation pauses for T_load."""
        w.swapping = True
        self.waiting.pop(w, None)
        for g in w.generations if self.segment_s is not None else ():
            g.pause(self.loop.now_s)  # its tokens so far are the old version's
        w.generations = [g.rescheduled(g.done_s + w.load_s) for g in w.generations]
        for g in w.generations:
            self.loop.at(g.done_s, self.finish, w, g)
        self.loop.after(w.load_s, self.swapped, w, w.staged, w.epoch)

    def swapped(self, w: SimWorker, version: int, epoch: int) -> None:
        if epoch != w.epoch:
            return
        w.version, w.swapping = version, False
        for g in w.generations if self.segment_s is not None else ():
            g.resume(version, self.loop.now_s)  # the rest of its tokens are the new version's
        if w.incoming <= version:
            w.receiving = False
        latency_s = self.loop.now_s - self.publish_time_s[version]
        self.loaded_latency_s.append(latency_s)
        w.loads += 1
        w.loaded_latency_s += latency_s
        self.on_loaded(w, latency_s)
        if w.staged > w.version:
            self._start_swap(w)
        else:
            self.fill(w)

    # ---- work ----
    def fill(self, w: SimWorker) -> None:
        """Lease work for every free slot; refused for a full window: wait (or poll)."""
        self.polling.pop(w, None)
        if not (w.alive and w.rented and w.active) or w.booting or w.swapping or w.receiving:
            return
        if w.staged > w.version and self.swap_between and not self.lazy_refresh:
            if not w.generations:  # the free moment the staged version waited for
                self._start_swap(w)
            return  # otherwise drain: no new work with the old weights while new ones wait
        while len(w.generations) < w.slots:
            held = sum(g.groups for g in w.generations)
            groups = self.data.lease(w.version, w.tasks_per_lease, held_by_worker=held, worker=w.id)
            if groups == 0:
                self._refused(w)
                return
            # lease round trip, generation, then one submit round trip per group
            done_s = self.loop.now_s + w.request_s + self._generation_s(w, groups) + groups * w.request_s
            g = Generation(groups, w.version, done_s, started_s=self.loop.now_s)
            w.generations.append(g)
            self._busy_edge(w)
            self._stale_edge(w, False)
            self.loop.at(done_s, self.finish, w, g)

    def _refused(self, w: SimWorker) -> None:
        if self.lazy_refresh and w.staged > w.version and not w.swapping:
            self._start_swap(w)  # refused with the old version: now the new one is worth its stall
            return
        if not self.data.may_lease(w.version):
            if w.version >= 0 and not w.generations:  # idle for want of fresh enough weights
                self._stale_edge(w, True)
            if w.version >= 0 and self.stale_retry_s > 0:
                self._poll(w, self.stale_retry_s, "stale")
            return  # otherwise the next swap calls fill again
        if self.retry_s > 0:
            self._poll(w, self.retry_s, "window")
        else:
            self.waiting[w] = None

    def _poll(self, w: SimWorker, pause_s: float, reason: str) -> None:
        """Ask again after the refused request's round trip and the coordinator's retry_after."""
        if w not in self.polling:
            self.polling[w] = reason
            self.loop.after(w.request_s + pause_s, self.fill, w)

    def _generation_s(self, w: SimWorker, groups: int) -> float:
        mean_s = groups * self.group_size * w.slots / w.rollouts_per_s
        if self.generation_range is not None:  # log-uniform, scaled to mean 1
            low, high = self.generation_range
            drawn = math.exp(w.rng.uniform(math.log(low), math.log(high)))
            return mean_s * drawn * math.log(high / low) / (high - low)
        cv = self.generation_cv
        return mean_s if cv == 0 else mean_s * w.rng.gammavariate(1.0 / cv**2, cv**2)

    def finish(self, w: SimWorker, g: Generation) -> None:
        """A lease's groups are generated and submitted."""
        if not g.live:
            return
        w.generations.remove(g)
        self._busy_edge(w)
        rollouts = g.groups * self.group_size
        w.rollouts += rollouts
        self.rollouts += rollouts
        dropped = self.data.submit(g.version, g.groups, worker=w.id, held_s=self.loop.now_s - g.started_s,
                                   tokens=g.tokens(self.tokens_per_group, self.loop.now_s))
        self.on_finished(w, g, dropped)
        self.on_submit()
        self.fill(w)

    def wake_waiting(self) -> None:
        """Lease room opened (drops, requeued leases): refused workers ask again, in order."""
        waiting, self.waiting = self.waiting, {}
        for w in waiting:
            self.fill(w)
