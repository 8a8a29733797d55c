"""The fleet search behind `echo2 plan`: each worker class's latencies and admissible rate at a
fleet size, and the cheapest (or, infeasible, the fastest) fleet that keeps the learner busy.

Dissemination latency grows with the number of workers N, and N is what we are choosing. The
search therefore caps the fleet size on a doubling grid (1, 2, 4, ..., all): for each cap it
prices dissemination at N = cap, keeps the classes whose rollouts still land within the
staleness window, solves the activation exactly with at most `cap` workers, and keeps the
cheapest. Every candidate is self-consistent (its real N <= cap, so its real latency is no
larger than the one it was planned with); the final numbers are re-evaluated at the real N.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace

from echo2.config.catalog import PlanConfig, WorkerClass
from echo2.planner import capacity, tail
from echo2.planner.activation import activate
from echo2.planner.covering import Activation, Offer, covers
from echo2.planner.dissemination import bytes_per_s, dissemination_s


@dataclass(frozen=True)
class MeasuredOnTime:
    """A class's share of output a run kept in time, and the slowest link of the fleet then."""

    share: float
    slowest_bps: float


@dataclass(frozen=True)
class ClassPlan:
    """One worker class at a given fleet size: its latencies and what one worker delivers."""

    name: str
    available: int
    chosen: int
    price_per_hour: float
    rollouts_per_s: float
    admissible_rps: float
    """Per worker, after swap stalls and preemptions; 0 if its rollouts arrive staler than S."""
    dissemination_s: float
    """Transfer to the slowest position of the broadcast plus T_load (publish -> loaded)."""
    generation_s: float
    """Mean time for one group (T_gen)."""
    tail_s: float
    """The latency percentile of (wait for a broadcast round + one group's generation)."""
    swapped_tail_s: float | None
    """With segment swaps (workload.segment_s): the same percentile of (wait + (1 - f) x one
    group's generation) plus T_seg, what the window must hide instead (capacity.min_staleness)."""
    masked_share: float
    """Expected share of a trained group's tokens older than S (masked; 0 without swaps)."""
    stall_s: float
    swap_interval_s: float
    """Seconds between two versions reaching a worker (it swaps each one in)."""
    availability: float
    """Fraction of time a worker of this class delivers, preemptions and rejoins counted."""
    on_time: float
    """Fraction of its groups that land within the staleness window (the rest are dropped)."""
    s_min: int
    reachable: bool

    @property
    def late_s(self) -> float:
        """What the staleness window must hide after dissemination: the tail, or with segment
        swaps the swapped tail when that is shorter (capacity.min_staleness)."""
        return self.tail_s if self.swapped_tail_s is None else min(self.tail_s, self.swapped_tail_s)


def class_plans(cfg: PlanConfig, n_workers: int, slowest_bps: float | None = None,
                measured_on_time: Mapping[str, MeasuredOnTime] | None = None) -> list[ClassPlan]:
    """Every class's latencies and admissible rate when N = n_workers receive each version.

    A shared broadcast round runs at its slowest link, so what a class delivers depends on the
    slowest class beside it: `slowest_bps` is the slowest bandwidth in the fleet (None: each
    class alone). A class slower than it is evaluated as the new slowest link.

    `measured_on_time`: per class, the share of its output a run measured landing in time (the
    online controller's, `policy.planned`); it replaces the predicted on-time share and the
    all-or-nothing overlap condition, which a class near the boundary still delivers through,
    in fleets whose slowest link is no slower than the one it was measured under."""
    measured = measured_on_time or {}
    return [
        _class_plan(cfg, name, worker, n_workers=max(1, n_workers), slowest_bps=slowest_bps,
                    measured_on_time=measured.get(name))
        for name, worker in cfg.workers.items()
    ]


def _class_plan(
    cfg: PlanConfig, name: str, worker: WorkerClass, *, n_workers: int, slowest_bps: float | None,
    measured_on_time: MeasuredOnTime | None = None,
) -> ClassPlan:
    work, net = cfg.workload, cfg.broadcast
    transfer_s = _transfer_s(cfg, worker, n_workers)
    floor_bps = worker.bandwidth_bps if slowest_bps is None else min(slowest_bps, worker.bandwidth_bps)
    if net.topology == "ideal":  # every downlink its own: only the worker's own link matters
        floor_bps = worker.bandwidth_bps
    period_s = tail.round_period_s(net.topology, snapshot_bytes=work.snapshot_bytes, n_workers=n_workers,
                                   learner_bps=cfg.learner.uplink_bps, slowest_bps=floor_bps,
                                   fanout=net.fanout)
    dis_s = transfer_s + work.load_time_s
    gen_s = work.generation_time_s if worker.generation_time_s is None else worker.generation_time_s
    tail_s, swapped_tail_s, on_time = _lateness(cfg, gen_s, dis_s, period_s)
    stall_s = work.load_time_s if work.background_fetch else dis_s
    interval_s = tail.swap_interval_s(work.step_time_s, period_s)
    # a replacement waits for the next round (P/2 on average), receives and loads the version
    # (it holds none: join_bytes, a full version with deltas), and half a generation was lost
    join_s = transfer_s * work.newcomer_bytes / work.snapshot_bytes
    up = tail.availability(worker.mean_uptime_s, period_s / 2 + join_s + work.load_time_s + gen_s / 2)
    rate = cfg.worker_rps(worker)
    if measured_on_time is not None and floor_bps < measured_on_time.slowest_bps:
        measured_on_time = None  # slower rounds than it was measured under: the model's prediction
    if measured_on_time is not None:
        on_time = measured_on_time.share
    admissible = capacity.effective_throughput_rps(
        rate,
        work.max_staleness,
        work.step_time_s,
        dissemination_s=dis_s if measured_on_time is None else 0.0,
        generation_s=tail_s if measured_on_time is None else 0.0,
        stall_s=stall_s,
        swap_interval_s=interval_s,
        swapped_s=swapped_tail_s if measured_on_time is None else None,
    )
    return ClassPlan(
        name=name,
        available=worker.count,
        chosen=0,
        price_per_hour=worker.price_per_hour,
        rollouts_per_s=rate,
        admissible_rps=admissible * up * on_time,
        dissemination_s=dis_s,
        generation_s=gen_s,
        tail_s=tail_s,
        swapped_tail_s=swapped_tail_s,
        masked_share=capacity.masked_token_share(work.max_staleness, work.step_time_s, dissemination_s=dis_s,
                                                 generation_s=gen_s, segment_s=work.segment_s),
        stall_s=stall_s,
        swap_interval_s=interval_s,
        availability=up,
        on_time=on_time,
        s_min=capacity.min_staleness(dis_s, tail_s, work.step_time_s, swapped_s=swapped_tail_s),
        reachable=worker.reachable,
    )


def _lateness(cfg: PlanConfig, gen_s: float, dis_s: float, period_s: float) -> tuple[float, float | None, float]:
    """(tail_s, swapped_tail_s, on_time) of a class: the latency percentile the window must hide
    without and (workload.segment_s) with segment swaps, and the share of groups trained in time.

    A group waits for a round, then for its lease within the step (the step's leases spread over
    one step), then generates. With segment swaps only (1 - f) of its generation counts
    (capacity.swapped_lateness_s): the generation, gamma distributed, scales by (1 - f) and T_seg
    is added; the waits are the version's, so they stay whole. A swap only makes tokens fresher,
    so a group is on time when either condition holds (the larger of the two shares)."""
    work, settings = cfg.workload, cfg.plan
    lateness = dict(round_wait_s=tail.max_wait_s(work.step_time_s, period_s), lease_spread_s=work.step_time_s,
                    generation_s=gen_s, cv=settings.generation_cv)
    window_s = work.max_staleness * work.step_time_s
    tail_s = tail.wait_plus_generation_s(**lateness, percentile=settings.latency_percentile)
    on_time = tail.wait_plus_generation_cdf(window_s - dis_s, **lateness)
    if work.segment_s is None:
        return tail_s, None, on_time
    seg_s = capacity.swapped_lateness_s(0.0, segment_s=work.segment_s, max_masked_fraction=work.max_masked_fraction)
    swapped = lateness | {"generation_s": capacity.swapped_lateness_s(
        gen_s, segment_s=0.0, max_masked_fraction=work.max_masked_fraction)}
    swapped_tail_s = seg_s + tail.wait_plus_generation_s(**swapped, percentile=settings.latency_percentile)
    on_time = max(on_time, tail.wait_plus_generation_cdf(window_s - dis_s - seg_s, **swapped))
    return tail_s, swapped_tail_s, on_time


def _transfer_s(cfg: PlanConfig, worker: WorkerClass, n_workers: int) -> float:
    """One version to the slowest position of the broadcast, N = n_workers receiving it."""
    net = cfg.broadcast
    return dissemination_s(
        net.topology,
        cfg.workload.snapshot_bytes,
        n_workers,
        learner_bytes_per_s=bytes_per_s(cfg.learner.uplink_bps),
        worker_bytes_per_s=bytes_per_s(worker.bandwidth_bps),
        chunk_bytes=net.chunk_bytes,
        fanout=net.fanout,
        hop_latency_s=net.hop_latency_s,
    )


def bandwidth_floors(cfg: PlanConfig) -> list[float]:
    """Candidate slowest links of a fleet: each distinct class bandwidth, fastest first."""
    return sorted({w.bandwidth_bps for w in cfg.workers.values() if w.count > 0}, reverse=True)


def slowest_chosen_bps(cfg: PlanConfig, counts: dict[str, int]) -> float | None:
    chosen = [cfg.workers[name].bandwidth_bps for name, n in counts.items() if n > 0]
    return min(chosen, default=None)


def leaf_fanout(cfg: PlanConfig) -> int | None:
    """Child slots per parent for the NAT constraint (None: every worker talks to the learner)."""
    topology = cfg.broadcast.topology
    return {"chain": 1, "tree": cfg.broadcast.fanout}.get(topology)


def total_workers(cfg: PlanConfig) -> int:
    return sum(w.count for w in cfg.workers.values())


def fleet_size_caps(total_workers: int) -> list[int]:
    caps, cap = [], 1
    while cap < total_workers:
        caps.append(cap)
        cap *= 2
    return caps + [total_workers] if total_workers > 0 else []


def offers_for(classes: list[ClassPlan], allowed: set[str] | None = None) -> list[Offer]:
    """One offer per class; classes outside `allowed` (None: all) or inadmissible offer none."""
    return [
        Offer(
            c.name,
            c.price_per_hour,
            c.admissible_rps,
            c.available if c.admissible_rps > 0 and (allowed is None or c.name in allowed) else 0,
            relay=c.reachable,
        )
        for c in classes
    ]


def _most_rps(offers: list[Offer], cap: int) -> float:
    """Admissible rollouts/s of the `cap` fastest units: no activation with <= cap does better."""
    total, left = 0.0, cap
    for o in sorted(offers, key=lambda o: -o.rollouts_per_s):
        units = min(o.count, left)
        total, left = total + units * o.rollouts_per_s, left - units
    return total


def cheapest_fleet(cfg: PlanConfig, *, headroom: float = 1.0,
                   measured_on_time: Mapping[str, MeasuredOnTime] | None = None) -> Activation | None:
    """The cheapest self-consistent activation over the fleet-size grid and the slowest link
    allowed (a shared round runs at its slowest link, so slow classes slow the others), or None.
    `headroom` sizes it for that multiple of B / T_train (the online controller's, for noisy
    measurements; `echo2 plan` plans for the bare rate); `measured_on_time` as in `class_plans`."""
    base_rps = headroom * capacity.base_throughput_rps(cfg.workload.batch_rollouts, cfg.workload.step_time_s,
                                                       uninformative_share=cfg.workload.uninformative_share)
    best: Activation | None = None
    solved: set[tuple] = set()
    for floor_bps in bandwidth_floors(cfg):
        allowed = {name for name, w in cfg.workers.items() if w.bandwidth_bps >= floor_bps}
        for cap in fleet_size_caps(total_workers(cfg)):
            # x_i <= cap holds anyway: a class's count above cap is the same problem, solved once
            offers = [replace(o, count=min(o.count, cap))
                      for o in offers_for(class_plans(cfg, cap, floor_bps, measured_on_time), allowed)]
            key = (tuple(offers), cap)
            if key in solved or not covers(_most_rps(offers, cap), base_rps):
                continue  # the same problem again, or one no set of <= cap workers can cover
            solved.add(key)
            found = _activate_once(tuple(offers), base_rps, cap, leaf_fanout(cfg))
            if not found.feasible or not covers(admissible_rps(cfg, found.counts, measured_on_time), base_rps):
                continue  # priced at a slower link than it has, it swaps more often than assumed
            key = (round(found.price_per_hour, 9), found.n_workers)
            if best is None or key < (round(best.price_per_hour, 9), best.n_workers):
                best = found
    return best


@functools.lru_cache(maxsize=4096)
def _activate_once(offers: tuple[Offer, ...], required_rps: float, cap: int, fanout: int | None) -> Activation:
    """`activate`, remembered: the online controller asks the same subproblems decision after
    decision (an integer program is ~16 ms; callers must not change the result's counts)."""
    return activate(list(offers), required_rps, max_workers=cap, leaf_fanout=fanout)


def admissible_rps(cfg: PlanConfig, counts: dict[str, int],
                   measured_on_time: Mapping[str, MeasuredOnTime] | None = None) -> float:
    """What the set `counts` delivers at its real size and slowest link."""
    n = sum(counts.values())
    classes = class_plans(cfg, max(1, n), slowest_chosen_bps(cfg, counts), measured_on_time)
    return sum(c.admissible_rps * counts.get(c.name, 0) for c in classes)


def fastest_fleet(cfg: PlanConfig, measured_on_time: Mapping[str, MeasuredOnTime] | None = None) -> dict[str, int]:
    """The set with the most admissible throughput over the fleet-size grid and the slowest
    link allowed, NAT placement aside: at each cap, the cap fastest admissible workers. What an
    infeasible plan shows."""
    best: dict[str, int] = {}
    best_rps = 0.0
    for floor_bps, cap in ((f, c) for f in bandwidth_floors(cfg) for c in fleet_size_caps(total_workers(cfg))):
        counts, left, rps = {}, cap, 0.0
        for c in sorted(class_plans(cfg, cap, floor_bps, measured_on_time), key=lambda c: -c.admissible_rps):
            if cfg.workers[c.name].bandwidth_bps < floor_bps:
                continue
            units = min(c.available, left) if c.admissible_rps > 0 else 0
            if units:
                counts[c.name], left, rps = units, left - units, rps + units * c.admissible_rps
        if rps > best_rps:
            best, best_rps = counts, rps
    return best


def with_staleness(cfg: PlanConfig, staleness: int) -> PlanConfig:
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"max_staleness": staleness})})


def staleness_warnings(staleness: int) -> tuple[str, ...]:
    if staleness > 6:
        return (f"S={staleness}: ECHO-2 found training stable up to S=6 and unstable at S=11 (math, AIME24)",)
    return ()
