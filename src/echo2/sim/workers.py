"""One simulated rollout worker's state (what `sim.fleet.Fleet` acts on) and the fleet a
scenario offers: every worker of every class, with its own random stream."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from echo2.config.sim import ScenarioConfig, SimWorkerClass


@dataclass(eq=False)
class Generation:
    """One lease being generated on one slot; `live` is cleared when it is rescheduled.

    With segment swaps its tokens span versions: tokens come evenly over its generating time, so
    the seconds spent under each version (`sampled_s`, the open stretch since `since_s` under
    `sampling`) give its tokens per version without simulating tokens."""

    groups: int
    version: int
    """The version it was leased with (its group's version at the coordinator)."""
    done_s: float
    started_s: float
    live: bool = True
    sampling: int = -1
    """The version sampling its tokens now (-1: `version`); None of `since_s`: paused for a swap."""
    since_s: float | None = None
    sampled_s: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sampling < 0:
            self.sampling = self.version
        if self.since_s is None and not self.sampled_s:
            self.since_s = self.started_s

    def rescheduled(self, done_s: float) -> Generation:
        """The same generation finishing at `done_s` (a swap paused it)."""
        self.live = False
        return Generation(self.groups, self.version, done_s, self.started_s, sampling=self.sampling,
                          since_s=self.since_s, sampled_s=self.sampled_s)

    def pause(self, now_s: float) -> None:
        """A swap starts: the tokens so far are the sampling version's."""
        if self.since_s is not None:
            self.sampled_s[self.sampling] = self.sampled_s.get(self.sampling, 0.0) + now_s - self.since_s
            self.since_s = None

    def resume(self, version: int, now_s: float) -> None:
        """The swap is done: the rest of the tokens are `version`'s."""
        self.sampling, self.since_s = version, now_s

    def tokens(self, total: int, now_s: float) -> dict[int, int]:
        """`total` tokens split over the versions by time spent sampling under each."""
        self.pause(now_s)
        spent_s = sum(self.sampled_s.values())
        if spent_s <= 0 or len(self.sampled_s) < 2:
            return {self.version if spent_s <= 0 else self.sampling: total}
        return {v: round(total * t / spent_s) for v, t in sorted(self.sampled_s.items())}


@dataclass(eq=False)
class SimWorker:
    index: int
    cls: str
    rollouts_per_s: float
    bandwidth_bps: float
    price_per_hour: float
    slots: int
    tasks_per_lease: int
    mean_uptime_s: float | None
    mean_downtime_s: float
    rng: random.Random
    load_s: float = 0.0
    request_s: float = 0.0
    heartbeat_phase_s: float = 0.0
    boot_s: float = 0.0
    """From an acquire during the run (or a preempted machine's return) to registration:
    billed, and no work done."""
    engine_start_s: float = 0.0
    """From registration until it can take a version (its class's engine_start_s)."""
    registrations: int = 0
    """Counts its registrations: an engine start pending from an earlier one is void."""
    acquired_s: float = 0.0
    """When the machine was last acquired: its bill starts there, boot included."""
    booting: bool = False
    alive: bool = False
    rented: bool = False
    active: bool = True
    """Chosen by the activation controller: leases work. Rented and inactive: idle, billed."""
    epoch: int = 0
    version: int = -1
    """Version loaded in the engine (-1: none yet)."""
    staged: int = -1
    """Newest version received and noticed, waiting to be swapped in."""
    incoming: int = -1
    """Version a broadcast round is bringing (no second round sends it again)."""
    swapping: bool = False
    segment_swap: bool = False
    """A swap waits for the next segment boundary of its generations (workload.segment_s)."""
    receiving: bool = False
    """Downloading without background fetch: no new work until the version is in."""
    generations: list[Generation] = field(default_factory=list)
    billed_s: float = 0.0
    billed_from_s: float | None = None
    billed_active: bool = True
    """Whether the open billing interval is active time or idle time."""
    active_s: float = 0.0
    idle_s: float = 0.0
    """Billed while rented and up: active_s + idle_s == billed_s."""
    busy_s: float = 0.0
    """Wall time holding at least one lease, as the coordinator measures a worker's busy time."""
    busy_since_s: float | None = None
    stale_s: float = 0.0
    """Wall time active, holding no lease, refused because its weights are too stale (waiting
    for a version its link has not brought yet), as the coordinator measures it."""
    stale_since_s: float | None = None
    rollouts: int = 0
    preemptions: int = 0
    loads: int = 0
    loaded_latency_s: float = 0.0
    """Sum over loaded versions of publish -> swapped in."""

    def newest(self) -> int:
        return max(self.version, self.staged, self.incoming)

    @property
    def id(self) -> str:
        return f"w{self.index}"  # its worker id at the coordinator (controller, lease trust)


def build_workers(scenario: ScenarioConfig) -> list[SimWorker]:
    """Every worker of every class, classes in file order; per-worker RNGs derive from the seed."""
    work, seed = scenario.workload, scenario.sim.seed
    plan = scenario.plan_config()
    workers: list[SimWorker] = []
    for name, cls in scenario.workers.items():
        rate = plan.worker_rps(plan.workers[name])
        for _ in range(cls.count):
            index = len(workers)
            rng = random.Random(seed * 1_000_003 + index)
            workers.append(
                SimWorker(
                    index=index,
                    cls=name,
                    rollouts_per_s=rate,
                    bandwidth_bps=cls.bandwidth_bps,
                    price_per_hour=cls.price_per_hour,
                    slots=default_slots(cls, rate, work.group_size, work.generation_time_s),
                    tasks_per_lease=cls.tasks_per_lease,
                    mean_uptime_s=(None if cls.mean_uptime_s is None
                                   else cls.mean_uptime_s / scenario.sim.preemption_scale),
                    mean_downtime_s=cls.mean_downtime_s,
                    rng=rng,
                    load_s=work.load_time_s if cls.load_time_s is None else cls.load_time_s,
                    request_s=scenario.sim.request_s if cls.request_s is None else cls.request_s,
                    heartbeat_phase_s=rng.uniform(0.0, scenario.sim.announce_interval_s),
                    boot_s=cls.boot_s,
                    engine_start_s=cls.engine_start_s,
                )
            )
    return workers


def default_slots(cls: SimWorkerClass, rollouts_per_s: float, group_size: int, generation_s: float) -> int:
    """Concurrent groups: given, or round(r * T_gen / G) so one group takes about T_gen."""
    if cls.slots is not None:
        return cls.slots
    gen_s = cls.generation_time_s if cls.generation_time_s is not None else generation_s
    return max(1, round(rollouts_per_s * gen_s / group_size))
