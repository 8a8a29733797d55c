"""Online cost-aware activation: keep the learner fed by the cheapest set of live workers.

Every control period (and at once when a worker vanishes) it prices each live worker at its
admissible rate: measured rollouts per busy second, times the share of its groups that were
admitted rather than dropped as stale, less the time it loses swapping in each version. It asks
the planner's activation rule for the cheapest set covering what the learner consumes
(B / measured step time) with headroom for noisy estimates, and applies the planner's
hysteresis so the set does not flap. The admitted share is measured rather than predicted from
the overlap condition T_dis + T_gen <= S x T_train: that closed form is all-or-nothing, while a
worker near the boundary still delivers part of its groups in time (see docs/sim.md). The
measured latencies feed the reported S_min. Only checked work is credited, and no worker is
credited with all of the demand while other measured workers are live (`policy.credit`). It
also integrates cost: a worker bills for every second it is rented, active or idle, until its
fleet provider releases it (policy/fleet_sync.py), plus the learner.

Pure and torch-free (the policy core): `CoordinatorState` drives it with registrations,
heartbeats and submissions; it keeps no I/O of its own."""

from __future__ import annotations

import math
from dataclasses import replace

from echo2.config.activation import ActivationConfig
from echo2.config.catalog import PlanConfig
from echo2.planner import (
    Offer,
    activate,
    base_throughput_rps,
    covers,
    fleet_totals,
    keep_or_switch,
    min_staleness,
    swapped_lateness_s,
)
from echo2.policy.census import probation_trial, take_census, unmeasured_to_cover, untried, window_decision
from echo2.policy.credit import capped_offers, checked, credited_rps, note_checked, note_rate
from echo2.policy.outcome import SubmissionOutcome
from echo2.policy.planned import PlannedCover
from echo2.policy.rewards import UninformativeShare
from echo2.policy.worker_view import ControlDecision, Ewma, WorkerView, candidate, delivering, value_or_zero

__all__ = ["ActivationController", "ControlDecision", "Ewma", "WorkerView"]

# a rate sample needs this much busy time behind it; shorter ones are mostly round-trip noise
MIN_SAMPLE_BUSY_S = 0.05


class ActivationController:
    def __init__(self, cfg: ActivationConfig, *, batch_rollouts: int, max_staleness: int,
                 learner_price_per_hour: float, now: float, catalog: PlanConfig | None = None,
                 max_masked_fraction: float = 0.5, min_passed_audits: int = 0,
                 groups_per_step: int | None = None) -> None:
        """`catalog`: the run's activation catalog (`echo2 plan`'s schema); with it, workers
        that declare a class in it are chosen by the planner's model (`policy.planned`).
        `max_masked_fraction`: train.max_masked_fraction, for S_min once segment swaps are seen.
        `min_passed_audits`: passed audits before a worker's rate counts, and then only as far as
        the audit has caught up with it (`policy.credit`; 0 where nothing is audited).
        `groups_per_step`: while demand or rates are unknown, no more workers run than twice the
        (S + 1) x groups_per_step groups a full lease window holds (`census.window_decision`)."""
        self.cfg, self.batch_rollouts, self.max_staleness = cfg, batch_rollouts, max_staleness
        self.max_unmeasured = None if groups_per_step is None else 2 * (max_staleness + 1) * groups_per_step
        self.min_passed_audits = min_passed_audits
        self.planned = None if catalog is None else PlannedCover(catalog, cfg, batch_rollouts=batch_rollouts)
        self.learner_price_per_hour = learner_price_per_hour
        self.workers: dict[str, WorkerView] = {}
        self.step_time_s = Ewma(cfg.ewma_alpha)
        self.swap_s = Ewma(cfg.ewma_alpha)
        self.segment_s = Ewma(cfg.ewma_alpha)
        """Seconds between a generation's swap points (sampling.segment_tokens; unmeasured: off)."""
        self.max_masked_fraction = max_masked_fraction
        self.started, self.last_tick, self.last_change = now, now, now
        self.learner_cost = 0.0
        self.uninformative_share = 0.0 if catalog is None else catalog.workload.uninformative_share
        self.recent_d = UninformativeShare()  # d over the recent groups (it rises as the policy learns)
        """d: share of scored groups dropped as uninformative, the catalog's until measured."""

    # ---- observations ----
    def join(self, worker_id: str, price_per_hour: float, worker_class: str | None = None, *,
             active: bool = True) -> None:
        old = self.workers.get(worker_id)  # `active` False: it idles until a decision (one offered and chosen runs)
        if old is None:
            alpha = self.cfg.ewma_alpha
            self.workers[worker_id] = WorkerView(price_per_hour, True, active, *(Ewma(alpha) for _ in range(5)),
                                                 worker_class=worker_class)
        else:  # a returning worker keeps its history, its bill and its audit record (failures stay with the id)
            self.workers[worker_id] = replace(old, price_per_hour=price_per_hour, alive=True,
                                              active=active or old.active, worker_class=worker_class,
                                              released=False, last_counters=(0, 0.0))

    def offer(self, worker_id: str, price_per_hour: float, worker_class: str | None) -> None:
        """A worker its provider can acquire when chosen (not running, billing nothing): what a
        marketplace or a fleet config offers the run before any machine is started."""
        if worker_id not in self.workers:
            alpha = self.cfg.ewma_alpha
            self.workers[worker_id] = WorkerView(price_per_hour, False, False, *(Ewma(alpha) for _ in range(5)),
                                                 worker_class=worker_class, released=True)

    def vanish(self, worker_id: str) -> None:
        view = self.workers.get(worker_id)
        if view is not None:
            view.losses += view.alive
            view.alive = False

    def release(self, worker_id: str) -> None:
        """The worker left because its provider released it: not live, but still an offer."""
        view = self.workers.get(worker_id)
        if view is not None:
            view.alive, view.active, view.released = False, False, True

    def is_released(self, worker_id: str) -> bool:
        view = self.workers.get(worker_id)
        return view is not None and view.released and not view.alive

    def costless(self, worker_id: str) -> bool:
        view = self.workers.get(worker_id)
        return view is None or view.cost == 0.0

    def forget(self, worker_id: str) -> None:
        """Drop a gone worker that never cost anything (see CoordinatorState._forget)."""
        self.workers.pop(worker_id, None)

    def observe_uninformative(self, dropped_groups: int, scored_groups: int) -> None:
        """Running totals: groups scored, and those of them dropped as uninformative."""
        self.uninformative_share = self.recent_d.observe(dropped_groups, scored_groups,
                                                         prior=self.uninformative_share)

    def observe_busy(self, worker_id: str, rollouts_total: int, busy_s_total: float,
                     stale_s_total: float = 0.0) -> None:
        """Cumulative counters (rollouts, lease-holding seconds, seconds active but refused as
        too stale); the rate over the new working time (holding leases or too stale) is one
        sample, round trips included. Time too stale counts: a worker whose link cannot bring
        versions within S is idle for it, and leaving it out prices the cheap slow-linked
        workers too high. A sample spans at least one lease's generation time: a worker
        generating k leases at once submits k times per generation time, so the rate over one
        gap between submits swings from a fraction to k times the truth."""
        view = self.workers.get(worker_id)
        if view is None:
            return
        view.busy_s_total, view.stale_s_total = busy_s_total, stale_s_total
        working_s_total = busy_s_total + stale_s_total
        rollouts, busy_s = rollouts_total - view.last_counters[0], working_s_total - view.last_counters[1]
        if busy_s < 0 or rollouts < 0:  # the worker restarted: its counters began again
            view.last_counters = (rollouts_total, working_s_total)
        elif busy_s >= max(MIN_SAMPLE_BUSY_S, value_or_zero(view.generation_s)):
            view.rollouts_per_s.add(rollouts / busy_s)
            view.last_counters = (rollouts_total, working_s_total)

    def observe_latencies(self, worker_id: str, dissemination_s: float | None, generation_s: float | None) -> None:
        """T_dis (publish until it could generate with the version) and T_gen (one lease)."""
        view = self.workers.get(worker_id)
        if view is None:
            return
        if dissemination_s is not None:
            view.dissemination_s.add(dissemination_s)
        if generation_s is not None:
            view.generation_s.add(generation_s)

    def observe_outcome(self, worker_id: str, admitted: bool) -> None:
        """One of the worker's groups was admitted to the buffer, or dropped as stale."""
        view = self.workers.get(worker_id)
        if view is not None:
            view.admitted.add(1.0 if admitted else 0.0)
            view.admitted_n += admitted
            view.outcomes_n += 1

    def observe_submission(self, outcome: SubmissionOutcome) -> None:
        """Everything one applied group tells activation (`policy.outcome`)."""
        self.observe_tokens(outcome.worker_id, outcome.tokens, outcome.gen_time_s)
        self.observe_outcome(outcome.worker_id, admitted=outcome.admitted)
        if outcome.segment_s is not None:
            self.observe_segment(outcome.segment_s)
        self.observe_busy(outcome.worker_id, outcome.rollouts_total, outcome.busy_s_total, outcome.stale_s_total)
        if outcome.group_seq is not None:
            self.observe_buffered(outcome.worker_id, outcome.group_seq)
        self.observe_uninformative(outcome.dropped_uninformative_total, outcome.scored_total)

    def observe_buffered(self, worker_id: str, group_seq: int) -> None:
        """A group of the worker was buffered as the run's `group_seq`-th (while the run audits,
        its rate now is noted: what the audit vouches for if that group passes)."""
        view = self.workers.get(worker_id)
        if view is not None and self.min_passed_audits:
            note_rate(view, group_seq)

    def observe_audit(self, worker_id: str, *, audited: int, failed: int,
                      newest_passed_seq: int | None = None) -> None:
        """The worker's audit record so far (cumulative: a report seen twice changes nothing), and
        the sequence number of its newest group that passed (None: none in this report)."""
        view = self.workers.get(worker_id)
        if view is not None:
            view.audited, view.audit_failed = audited, failed
            if newest_passed_seq is not None and self.min_passed_audits:
                note_checked(view, newest_passed_seq)

    def observe_tokens(self, worker_id: str, tokens: int, gen_s: float) -> None:
        view = self.workers.get(worker_id)
        if view is not None and gen_s > 0:
            view.tokens_per_s.add(tokens / gen_s)

    def observe_step_time(self, step_time_s: float) -> None:
        if step_time_s > 0:
            self.step_time_s.add(step_time_s)

    def observe_swap(self, swap_s: float) -> None:
        if swap_s >= 0:
            self.swap_s.add(swap_s)

    def observe_segment(self, segment_s: float) -> None:
        """A lease's generation could swap versions in every `segment_s` seconds."""
        if segment_s >= 0:
            self.segment_s.add(segment_s)

    def is_active(self, worker_id: str) -> bool:
        view = self.workers.get(worker_id)
        return view is not None and view.alive and view.active

    # ---- cost ----
    def account(self, now: float) -> None:
        """Charge for the time since the last tick: the learner and every rented (live) worker,
        active or idle; a released worker costs nothing."""
        dt = max(0.0, now - self.last_tick)
        self.last_tick = now
        self.learner_cost += self.learner_price_per_hour * dt / 3600
        for view in self.workers.values():
            if view.alive:
                if view.active:
                    view.active_s += dt
                    if not self._measured(view):
                        view.probation_s += dt
                else:
                    view.idle_s += dt
                view.cost += view.price_per_hour * dt / 3600
            elif view.released:
                view.released_s += dt

    def total_cost(self) -> float:
        return self.learner_cost + sum(v.cost for v in self.workers.values())

    def price_per_hour_now(self) -> float:
        """What the run bills per hour at this moment, by the rule `account` charges: the learner
        and every rented (live) worker, active or idle."""
        return self.learner_price_per_hour + sum(v.price_per_hour for v in self.workers.values() if v.alive)

    # ---- decisions ----
    def required_rps(self) -> float:
        """What the learner consumes, B / ((1 - d) T_train) (d: groups dropped as uninformative and
        refilled), which the workers' admissible rates must cover (their swap stall and overlap
        condition are priced into each offer: R_required in the planner's sum-of-admissible-rates
        form). Infinite (run everything) until the step time is known (a catalog's T_train is the
        prior until then), and for S = 0, where generation never overlaps training."""
        prior_s = None if self.planned is None else self.planned.prior_step_time_s()
        step_s = self.step_time_s.value if self.step_time_s.samples else prior_s
        if self.max_staleness == 0 or step_s is None:
            return math.inf
        return base_throughput_rps(self.batch_rollouts, step_s, uninformative_share=self.uninformative_share)

    def decide(self, now: float) -> ControlDecision:
        """Measured workers compete on price for the demand; workers not yet measured are on
        probation: up to `probation_slots` of them run beside the measured set so they can prove
        themselves, and they never count toward covering demand. A worker's price and speed are
        its claims until the coordinator has measured it: otherwise a stream of fresh $0
        registrations that never lease would displace every honest worker (benchmarks/chaos.py's
        request flood sends such registrations)."""
        self.account(now)
        if self._planning():
            return self._apply(self._decide_planned(now), now)
        census = take_census(self.workers, self.cfg.min_samples, self.min_passed_audits)
        offers = self._offers(census.measured)
        probation, current = census.probation, census.current
        required = self.required_rps()
        everyone = {o.id for o in offers} | set(probation)
        if not everyone:
            decision = ControlDecision(set(), required, "no live workers", False)
        elif not self.cfg.enabled or not math.isfinite(required) or not offers:
            decision = window_decision(self.workers, [o.id for o in offers], probation, required,
                                       cap=self.max_unmeasured if self.cfg.enabled else None,
                                       timeout_s=self.cfg.probation_timeout_s)
        else:
            decision, slots = self._cover(offers, current, required, now)
            probation = probation if not decision.covered else untried(self.workers, probation, self.cfg)
            if probation:
                trial = self._probation_trial(probation, slots)
                decision.active |= trial
                waiting = f" ({len(probation) - len(trial)} more waiting)" if len(trial) < len(probation) else ""
                decision.reason += f"; on probation until measured: {', '.join(sorted(trial)) or 'none'}{waiting}"
        decision.estimates = {o.id: o.rollouts_per_s for o in offers}
        return self._apply(decision, now)

    def _apply(self, decision: ControlDecision, now: float) -> ControlDecision:
        active, previous = decision.active, set()
        for worker_id, view in self.workers.items():  # one pass: 10,000 views at scale
            if view.active and candidate(view):
                previous.add(worker_id)
            view.active = worker_id in active
        decision.changed = active != previous
        if decision.changed:
            self.last_change = now
        return decision

    def _planning(self) -> bool:
        """Decide by the catalog: it is given, and some worker declared a class of it."""
        return (self.planned is not None and self.cfg.enabled and self.max_staleness > 0
                and any(self.planned.knows(v.worker_class) for v in self.workers.values()))

    def _decide_planned(self, now: float) -> ControlDecision:
        """The planner's choice among workers of a catalog class (`policy.planned`), and
        probation slots for unmeasured workers of no known class (measured ones of no class
        have no place in the catalog's model and idle)."""
        assert self.planned is not None
        step_s = self.step_time_s.value if self.step_time_s.samples else None
        swap_s = self.swap_s.value if self.swap_s.samples else None
        decision = self.planned.decide(self.workers, step_time_s=step_s, swap_s=swap_s, now=now,
                                       last_change_s=self.last_change, measured=self._measured,
                                       uninformative_share=self.uninformative_share)
        probation = [w for w, v in self.workers.items()  # released: offered, started when given a slot
                     if (v.alive or v.released) and not self._measured(v) and not self.planned.knows(v.worker_class)]
        if probation:
            trial = self._probation_trial(probation, self.cfg.probation_slots)
            decision.active |= trial
            decision.reason += f"; unclassed, on probation until measured: {', '.join(sorted(trial)) or 'none'}"
        return decision

    def _cover(self, offers: list[Offer], current: dict[str, int], required: float,
               now: float) -> tuple[ControlDecision, int]:
        """The measured set to run, and the probation slots beside it. Each offer is credited
        with at most max_worker_share of the demand while two or more measured workers are live
        (`policy.credit.capped_offers`), so no single worker covers it alone."""
        target = required * self.cfg.headroom
        live_measured = sum(1 for o in offers if self.workers[o.id].alive)
        offers = capped_offers(offers, max_share=self.cfg.max_worker_share, target_rps=target,
                               live_measured=live_measured)
        # new sets are sized with headroom; the current one is only replaced when it misses
        # the bare requirement: noise inside the [R, headroom x R] band changes nothing
        proposal = activate(offers, target)
        if not proposal.feasible:
            # short: every measured worker that delivers (one too stale to lease, or failed by the
            # audit, adds only its bill), and enough unmeasured ones to cover the rest if as fast
            # as the measured average, at most a full window's groups (more could not all be measured)
            decision = ControlDecision(delivering(offers), required,
                                       f"no measured set covers demand ({proposal.reason}): all measured that deliver",
                                       False, covered=False)
            slots = max(self.cfg.probation_slots, unmeasured_to_cover(offers, target))
            return decision, slots if self.max_unmeasured is None else min(slots, self.max_unmeasured)
        kept = keep_or_switch(current, proposal, offers, required_rps=required, margin=self.cfg.margin)
        decision = ControlDecision(set(kept.counts), required, kept.reason, kept.switched)
        if kept.switched and self._too_soon_to_save(current, offers, required, now):
            decision = ControlDecision(set(current), required, "cheaper set deferred (scale down slowly)", False)
        return decision, self.cfg.probation_slots

    def _probation_trial(self, probation: list[str], slots: int) -> set[str]:
        """`census.probation_trial` with this controller's views and probation_timeout_s."""
        return probation_trial(self.workers, probation, slots, timeout_s=self.cfg.probation_timeout_s)

    def _too_soon_to_save(self, current: dict[str, int], offers: list[Offer], required: float, now: float) -> bool:
        """A switch away from a set that still covers demand only saves money: it waits
        scale_down_after_s after the previous change. Fixing a shortfall never waits."""
        _, _, rate = fleet_totals(current, offers)
        return covers(rate, required) and now - self.last_change < self.cfg.scale_down_after_s

    def _measured(self, view: WorkerView) -> bool:
        return checked(view, self.cfg.min_samples, self.min_passed_audits)

    def _offers(self, measured: list[tuple[str, WorkerView]]) -> list[Offer]:
        """One offer per measured worker that is live or released (its provider can acquire it
        again: `census.take_census`), at its credited rate (`policy.credit.credited_rps`: checked
        work, admitted rather than dropped as stale, not failed by the audit) less its swap stall:
        workers swap in every version, so each step costs them one swap of generation time."""
        stall = 0.0 if self.step_time_s.samples == 0 else min(1.0, value_or_zero(self.swap_s) / self.step_time_s.value)
        return [Offer(worker_id, v.price_per_hour, credited_rps(v) * (1.0 - stall)) for worker_id, v in measured]

    def s_min(self) -> int | None:
        """Smallest S whose window hides the fleet's mean dissemination + generation latency
        (the overlap condition; with segment swaps measured, the planner's swap rule on them),
        from measurements; None until they exist."""
        latencies = [(v.dissemination_s.value, v.generation_s.value) for v in self.workers.values()
                     if v.alive and v.dissemination_s.samples and v.generation_s.samples]
        if not latencies or self.step_time_s.samples == 0:
            return None
        dis = sum(d for d, _ in latencies) / len(latencies)
        gen = sum(g for _, g in latencies) / len(latencies)
        swapped = None if not self.segment_s.samples else swapped_lateness_s(
            gen, segment_s=self.segment_s.value, max_masked_fraction=self.max_masked_fraction)
        return min_staleness(dis, gen, self.step_time_s.value, swapped_s=swapped)

    def snapshot(self) -> dict:
        return {
            "required_rps": self.required_rps(),
            "step_time_s": self.step_time_s.value if self.step_time_s.samples else None,
            "s_min_measured": self.s_min(),
            "cost_total": self.total_cost(),
            "cost_learner": self.learner_cost,
            "workers": {
                worker_id: {"active": v.alive and v.active, "released": v.released and not v.alive,
                            "price_per_hour": v.price_per_hour,
                            "rollouts_per_s": v.rollouts_per_s.value if v.rollouts_per_s.samples else None,
                            "active_s": v.active_s, "idle_s": v.idle_s, "released_s": v.released_s,
                            "cost": v.cost}
                for worker_id, v in sorted(self.workers.items())
            },
        }
