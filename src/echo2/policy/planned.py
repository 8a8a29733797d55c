"""Planned activation: the online controller decides with the planner's own capacity model.

Pricing each worker by its own measured rate misses what a slow link does to everyone else: a
broadcast round ends when its slowest worker has the version, so one cheap worker on a slow
link makes every other worker receive versions late and seldom, so a per-worker controller
picks cheap workers on slow links and saves far less than the planner's fleet does (docs/sim.md
compares the two on the 8B scenario).

So when the run has an activation catalog (`echo2 plan`'s schema) and workers declare their
class in it, each decision is `echo2 plan`'s search (`planner.fleet.cheapest_fleet`: the
dissemination latency at the fleet's size and slowest link, the swap interval, the on-time
share, availability) over the candidates the run has, with the catalog's figures as the prior
and the coordinator's measurements in place of them where it has them:

- the learner's measured step time and the workers' measured swap time replace the catalog's,
  and so does a class's measured uptime (time registered per loss, the catalog's uptime counted
  as one loss of prior evidence) once the run has lost one of its workers;
- once a class has delivered `MIN_OUTCOMES` groups, the share of its output the run actually
  kept (its groups admitted rather than dropped as stale, times its working time not refused as
  too stale) replaces the model's predicted on-time share and its all-or-nothing overlap
  condition: a link slower than declared shows up here, and a class the closed form puts just
  past the boundary (a measured step 2% shorter than the catalog's) still counts for what it
  delivers;
- a worker's declared class is a claim: it counts at the prior only until `probation_timeout_s`
  of active time without being measured, and a worker the audit discredits is no candidate.

The current set is kept while the model says it covers B / T_train; a shortfall (a preemption,
a calibration gone down) re-plans at once; a cheaper set replaces it only when it saves more
than `margin` and `scale_down_after_s` has passed. Chosen workers are taken in this order: the
ones running now, the live ones (they hold the current version), then those the provider must
acquire.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from echo2.config.activation import ActivationConfig
from echo2.config.catalog import PlanConfig
from echo2.planner.capacity import base_throughput_rps
from echo2.planner.covering import covers
from echo2.planner.fleet import MeasuredOnTime, admissible_rps, cheapest_fleet, fastest_fleet
from echo2.policy.credit import audit_credit
from echo2.policy.worker_view import ControlDecision, WorkerView, natural_key

MIN_OUTCOMES = 20
"""Groups a class must have delivered before its measured on-time share replaces the model's:
a few dropped groups of a new class do not swing the decision."""
ON_TIME_STEP = 0.05
"""Measured on-time shares are rounded to this: noise below it changes no decision."""
TIME_BUCKET = 1.05
"""Measured step and swap times are rounded to powers of this (5%), for the same reason: the
measured step time wanders by that much, and the headroom absorbs it."""
UPTIME_BUCKET = 1.25
"""Measured uptimes are rounded to powers of this (25%): availability, uptime / (uptime +
rejoin), hardly moves with it, and each distinct value costs a planner search."""
MIN_AUDIT_CREDIT = 0.5
"""A worker credited less than this by the audit (`policy.credit`) is no candidate."""


@dataclass(frozen=True)
class Proposal:
    counts: dict[str, int]
    price_per_hour: float
    feasible: bool


class PlannedCover:
    def __init__(self, catalog: PlanConfig, cfg: ActivationConfig, *, batch_rollouts: int) -> None:
        if catalog.workload.batch_rollouts != batch_rollouts:
            raise ValueError(f"the activation catalog's workload has B = {catalog.workload.batch_rollouts} rollouts "
                             f"per step, the run {batch_rollouts}: give it the run's prompts_per_step and group_size")
        self.catalog, self.cfg, self.batch_rollouts = catalog, cfg, batch_rollouts
        self._proposals: dict[tuple, Proposal] = {}
        self._decided = False
        """Whether a decision was made: the first one replaces the workers that registered
        active with the planned set at once (no scale-down delay: nothing was measured yet)."""

    def knows(self, worker_class: str | None) -> bool:
        return worker_class is not None and worker_class in self.catalog.workers

    def prior_step_time_s(self) -> float:
        return self.catalog.workload.step_time_s

    def decide(self, workers: dict[str, WorkerView], *, step_time_s: float | None, swap_s: float | None,
               now: float, last_change_s: float, measured: Callable[[WorkerView], bool],
               uninformative_share: float = 0.0) -> ControlDecision:
        """The classed workers to run (the caller adds probation for unclassed ones);
        `uninformative_share`: the run's measured d, in place of the catalog's."""
        members = self._members(workers, measured)
        step_s = _bucket(step_time_s) if step_time_s else self.catalog.workload.step_time_s
        swap = _bucket(swap_s) if swap_s is not None else self.catalog.workload.load_time_s
        counts = {name: len(ids) for name, ids in members.items()}
        current = {name: sum(1 for i in ids if self._running(i, workers)) for name, ids in members.items()}
        on_time = self._measured_on_time(members, workers, current)
        share = round(round(uninformative_share / ON_TIME_STEP) * ON_TIME_STEP, 4)  # noise below a step changes nothing
        plan_cfg = self._config(counts, step_s, swap, self._measured_uptime(members, workers),
                                uninformative_share=share)
        required = base_throughput_rps(self.batch_rollouts, step_s, uninformative_share=share)
        current = {name: n for name, n in current.items() if n}
        proposal = self._propose(plan_cfg, on_time)
        chosen, reason = self._choose(plan_cfg, proposal, current, counts, on_time=on_time, required=required,
                                      now=now, last_change_s=last_change_s)
        active = self._pick(members, chosen, workers)
        self._decided = True
        detail = ", ".join(f"{n} x {name}" for name, n in sorted(chosen.items()) if n) or "none"
        return ControlDecision(active, required, f"{reason} ({detail})", False,
                               {name: m.share for name, m in on_time.items()})

    def _members(self, workers: dict[str, WorkerView], measured: Callable[[WorkerView], bool]) -> dict[str, list[str]]:
        """Candidates per catalog class: live or acquirable, credited by the audit, and measured
        or still within the time a declared class is believed unmeasured."""
        members: dict[str, list[str]] = {name: [] for name in self.catalog.workers}
        for worker_id, v in workers.items():
            if not self.knows(v.worker_class) or not (v.alive or v.released):
                continue
            if audit_credit(v.audited, v.audit_failed) < MIN_AUDIT_CREDIT:
                continue
            if not measured(v) and v.probation_s >= self.cfg.probation_timeout_s:
                continue  # active that long and never measured: its claimed class buys nothing
            members[v.worker_class].append(worker_id)
        for ids in members.values():
            ids.sort(key=natural_key)
        return members

    def _measured_on_time(self, members: dict[str, list[str]], workers: dict[str, WorkerView],
                          current: dict[str, int]) -> dict[str, MeasuredOnTime]:
        """Per class with MIN_OUTCOMES groups delivered: the share of its output kept, under the
        slowest link of the fleet running now."""
        links = [self.catalog.workers[name].bandwidth_bps for name, n in current.items() if n]
        slowest_bps = min(links, default=math.inf)
        out: dict[str, MeasuredOnTime] = {}
        for name, ids in members.items():
            views = [workers[i] for i in ids]
            outcomes = sum(v.outcomes_n for v in views)
            if outcomes < MIN_OUTCOMES:
                continue
            admitted = sum(v.admitted_n for v in views) / outcomes
            busy_s = sum(v.busy_s_total for v in views)
            stale_s = sum(v.stale_s_total for v in views)
            not_stale = busy_s / (busy_s + stale_s) if busy_s + stale_s > 0 else 1.0
            share = round(admitted * not_stale / ON_TIME_STEP) * ON_TIME_STEP
            out[name] = MeasuredOnTime(share, min(slowest_bps, self.catalog.workers[name].bandwidth_bps))
        return out

    def _measured_uptime(self, members: dict[str, list[str]],
                         workers: dict[str, WorkerView]) -> dict[str, float | None]:
        """Per class: mean time to loss, the catalog's uptime counting as one loss of prior
        evidence (a class never lost in the catalog keeps None until the run loses one)."""
        out: dict[str, float | None] = {}
        for name, ids in members.items():
            prior_s = self.catalog.workers[name].mean_uptime_s
            losses = sum(workers[i].losses for i in ids)
            up_s = sum(workers[i].active_s + workers[i].idle_s for i in ids)
            if losses == 0:
                out[name] = prior_s
            else:
                measured = (up_s + (prior_s or 0.0)) / (losses + (prior_s is not None))
                out[name] = _bucket(measured, UPTIME_BUCKET)
        return out

    def _config(self, counts: dict[str, int], step_s: float, swap_s: float,
                uptime_s: dict[str, float | None], *, uninformative_share: float) -> PlanConfig:
        """The catalog with the run's candidates as class counts and its measured times and
        uninformative share in."""
        classes = {name: cls.model_copy(update={"count": counts.get(name, 0), "mean_uptime_s": uptime_s.get(name)})
                   for name, cls in self.catalog.workers.items()}
        workload = self.catalog.workload.model_copy(update={"step_time_s": step_s, "load_time_s": swap_s,
                                                            "uninformative_share": uninformative_share})
        return self.catalog.model_copy(update={"workers": classes, "workload": workload})

    def _propose(self, plan_cfg: PlanConfig, on_time: dict[str, MeasuredOnTime]) -> Proposal:
        classes = tuple((name, cls.count, cls.mean_uptime_s) for name, cls in plan_cfg.workers.items())
        work = plan_cfg.workload
        key = (classes, tuple(sorted(on_time.items())), work.step_time_s, work.load_time_s, work.uninformative_share)
        cached = self._proposals.get(key)
        if cached is not None:
            return cached
        found = cheapest_fleet(plan_cfg, headroom=self.cfg.headroom, measured_on_time=on_time)
        if found is not None:
            proposal = Proposal(dict(found.counts), found.price_per_hour, True)
        else:  # nothing covers demand: the fastest set the candidates make
            fastest = fastest_fleet(plan_cfg, on_time)
            price = sum(plan_cfg.workers[name].price_per_hour * n for name, n in fastest.items())
            proposal = Proposal(fastest, price, False)
        if len(self._proposals) > 4096:  # bounded: a long run sees few distinct keys
            self._proposals.clear()
        self._proposals[key] = proposal
        return proposal

    @staticmethod
    def _running(worker_id: str, workers: dict[str, WorkerView]) -> bool:
        return workers[worker_id].alive and workers[worker_id].active

    def _choose(self, plan_cfg: PlanConfig, proposal: Proposal, current: dict[str, int], counts: dict[str, int], *,
                on_time: dict[str, MeasuredOnTime], required: float, now: float,
                last_change_s: float) -> tuple[dict[str, int], str]:
        """Counts per class to run, and why. Short of demand, the current set topped up with the
        workers that add the most per dollar, unless re-planning saves more than `margin`
        (each worker swapped costs a download and a warm-up; after losses a fresh plan
        over the changed candidates flipped between fleets of other compositions)."""
        current_rps = admissible_rps(plan_cfg, current, on_time) if current else 0.0
        current_price = _price(plan_cfg, current)
        if not proposal.counts:  # the model admits nothing: never stop a running set for it
            return current, "the planner's model admits no set: current set kept"
        if not covers(current_rps, required):
            short = f"current set gives {current_rps:.4g} of {required:.4g} rollouts/s"
            topped = (self._top_up(plan_cfg, current, counts, on_time=on_time, target_rps=required * self.cfg.headroom)
                      if current else None)
            if topped is not None and (not proposal.feasible or
                                       _price(plan_cfg, topped) <= (1 + self.cfg.margin) * proposal.price_per_hour):
                return topped, f"{short}: topped up"
            return proposal.counts, f"{short}: {'planned' if proposal.feasible else 'fastest'} set"
        may_save = not self._decided or now - last_change_s >= self.cfg.scale_down_after_s
        if proposal.feasible and may_save and proposal.price_per_hour < (1 - self.cfg.margin) * current_price:
            return proposal.counts, f"planned set is {1 - proposal.price_per_hour / current_price:.0%} cheaper"
        return current, "current set covers demand in the planner's model"

    @staticmethod
    def _top_up(plan_cfg: PlanConfig, current: dict[str, int], counts: dict[str, int], *,
                on_time: dict[str, MeasuredOnTime], target_rps: float) -> dict[str, int] | None:
        """`current` plus, one at a time, the candidate adding the most admissible rollouts/s
        per dollar (at the fleet's new size and slowest link), until it covers `target_rps`."""
        chosen = dict(current)
        for _ in range(sum(counts.values())):
            rps = admissible_rps(plan_cfg, chosen, on_time)
            if covers(rps, target_rps):
                return chosen
            best, best_value = None, 0.0
            for name, available in counts.items():
                if chosen.get(name, 0) >= available:
                    continue
                gain = admissible_rps(plan_cfg, {**chosen, name: chosen.get(name, 0) + 1}, on_time) - rps
                value = gain / max(plan_cfg.workers[name].price_per_hour, 1e-9)
                if gain > 0 and value > best_value:
                    best, best_value = name, value
            if best is None:
                return None
            chosen[best] = chosen.get(best, 0) + 1
        return None

    def _pick(self, members: dict[str, list[str]], counts: dict[str, int], workers: dict[str, WorkerView]) -> set[str]:
        """counts[class] members of each class: running ones first, then live ones (they hold
        the current version), then those the provider must acquire."""
        active: set[str] = set()
        for name, n in counts.items():
            # the n first of a sort (ids are unique, so no ties), without sorting a class of
            # thousands to take a few of them
            active.update(heapq.nsmallest(n, members.get(name, []), key=lambda i: (
                not self._running(i, workers), not workers[i].alive, natural_key(i))))
        return active


def _price(plan_cfg: PlanConfig, counts: dict[str, int]) -> float:
    return sum(plan_cfg.workers[name].price_per_hour * n for name, n in counts.items())


def _bucket(seconds: float, base: float = TIME_BUCKET) -> float:
    """Round to a power of `base` (TIME_BUCKET: 5% steps)."""
    if seconds <= 0:
        return 0.0
    return base ** round(math.log(seconds) / math.log(base))
