"""Schema of an `echo2 sim` scenario: the `echo2 plan` catalog tables (learner, worker classes,
workload, broadcast) with the simulator's extra per-class knobs, plus [sim] (run length, seed,
control-plane timing, noise) and [sweep] (the grids behind the three plots).

    [learner]          catalog LearnerClass: price, uplink, its own rollout speed (baseline)
    [workers.NAME]     catalog WorkerClass + slots, tasks_per_lease, churn, start delay
    [workload]         catalog Workload: model size, B, T_train, S, T_gen, T_load
    [broadcast]        catalog PlannedBroadcast: topology, chunk bytes, fanout, hop latency
    [plan]             catalog PlanSettings: latency percentile the planner provisions for
    [activation]       the coordinator's online controller (config.run.ActivationConfig), at
                       simulated-fleet time scales by default
    [sim]              steps, seed, activation, request/poll/announce timing, noise
    [sweep]            plot grids: worker counts, staleness values, bandwidths
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from echo2.config.activation import ActivationConfig
from echo2.config.base import Frozen, apply_overrides, read_toml, validate
from echo2.config.catalog import (
    LearnerClass,
    PlanConfig,
    PlannedBroadcast,
    PlanSettings,
    WorkerClass,
    Workload,
)

_PLAN_WORKER_FIELDS = frozenset(WorkerClass.model_fields)


class SimWorkerClass(WorkerClass):
    """A catalog worker class and how the simulator runs it."""

    slots: int | None = Field(None, ge=1, le=4096)
    """Rollout groups one worker generates concurrently (continuous batching). Default:
    round(r * T_gen / G), so one group takes about T_gen and the worker sustains r."""
    tasks_per_lease: int = Field(1, ge=1, le=256)
    """Groups leased per request and generated as one batch on one slot."""
    mean_downtime_s: float = Field(600.0, gt=0)
    """Mean time until a preempted worker can be rented again (exponential)."""
    start_delay_s: float = Field(0.0, ge=0)
    """Join time after the run starts (boot, engine start); it then waits for a version. A
    worker rented at the start bills from the start, this delay included."""
    boot_s: float = Field(0.0, ge=0)
    """A machine acquired during the run (a released worker chosen again, a spare replacing a
    preempted one, a preempted one back after mean_downtime_s) bills from its acquire and
    registers only this long after: provisioning, install, engine start, as the ssh and
    skypilot providers' ledgers bill it."""
    engine_start_s: float = Field(0.0, ge=0)
    """After it registers, each start of a worker (the first and every acquire after) loads its
    model for this long before it takes a version or a lease, as `echo2 worker` does (it logs
    "model loaded ... in X s"): the coordinator counts it registered, on probation and billed,
    and it generates nothing yet."""
    load_time_s: float | None = Field(None, ge=0)
    """T_load of this class (swap a received version into the engine); default the workload's."""
    request_s: float | None = Field(None, ge=0)
    """Round trip of one lease or submit from this class; default [sim] request_s."""

    def plan_class(self) -> WorkerClass:
        return WorkerClass(**self.model_dump(include=_PLAN_WORKER_FIELDS))


class ProfileSegment(Frozen):
    """From learner step `from_step` on (until the next segment), the workload as a run measured
    it there: a policy's step time and its share of uninformative groups both drift as it learns
    (fleet_ssh's seed 1: d rose from 0.22 over its first 10 steps to 0.63 over its last, so the
    learner needed 2.1 times the rollouts/s by the end)."""

    from_step: int = Field(ge=0)
    step_time_s: float | None = Field(None, gt=0)
    """T_train from this step on; None: the workload's."""
    uninformative_share: float | None = Field(None, ge=0, lt=1)
    """d from this step on; None: the workload's."""


class SimSettings(Frozen):
    steps: int = Field(200, ge=1, le=1_000_000)
    """Learner steps of the main run (the summary table and the cost comparison)."""
    seed: int = 0
    """Every random draw (noise, churn, heartbeat phases) derives from it: same seed, same run."""
    fresh_leases: bool = False
    """The coordinator's train.fresh_leases (policy/window.py): lease only as far ahead as keeps
    the learner from waiting. Off by default, as in `echo2 run`: it costs the online controller
    steady utilization, in the simulator and in real runs, since the smaller window keeps
    unmeasured workers from the leases that would measure them, which the activation rule does
    not yet allow for."""
    slow_start: bool = True
    """Workers lease under the coordinator's slow start (policy/trust.py), as in `echo2 run`: one
    lease until a group is accepted, then twice as many per accepted group, new workers sharing
    a quarter of the window. It costs each new worker its first generations at low concurrency
    (qwen3_8b, 60 steps at S = 4: 88% whole-run utilization against 95%). The planner-vs-simulator
    check turns it off: the planner's steady-state fleet does not model it."""
    activation: Literal["plan", "online", "all"] = "plan"
    """"plan": rent the fleet `echo2 plan` chooses, and let the coordinator's activation
    controller (policy/controller.py, settings in [activation]) decide online which of those
    workers are active; "online": rent every worker of every class at the start and let the
    controller choose among them, as `echo2 run` does with every offered worker; "all": every
    worker active for the whole run, no controller."""
    online_pricing: Literal["catalog", "measured"] = "catalog"
    """With activation "online": "catalog" decides with the scenario as the controller's activation
    catalog (`policy.planned`, as `echo2 run` with `[activation] catalog`); "measured" prices every
    worker by its measured rate alone, as `echo2 run` without one (what a run over an SSH
    inventory with no catalog does)."""
    request_s: float = Field(0.0, ge=0)
    """Round trip of one control request (lease or submit) to the coordinator."""
    lease_retry_s: float = Field(0.0, ge=0)
    """0: a refused worker waits until the learner takes a batch (event-driven); > 0: it asks
    again after this long, as the real worker does (coordinator retry_after_s)."""
    stale_retry_s: float = Field(0.0, ge=0)
    """0: a worker refused for holding a version more than S behind waits for its next swap;
    > 0: it asks again after this long (the coordinator's retry_after_s is 0.2 s)."""
    announce_interval_s: float = Field(0.0, ge=0)
    """0: workers learn of a version the moment it is out, as the real system's held heartbeats
    tell them; > 0: only at their next heartbeat (random phase per worker), as a polling system
    would."""
    swap: Literal["pause", "between_generations"] = "pause"
    """How a received version goes in: "pause" stalls running generations for T_load (vLLM
    pause/resume); "between_generations" waits until the worker's current lease is generated
    and submitted, or its refused-lease pause ends (the local HF worker)."""
    refresh: Literal["every_version", "when_behind"] = "every_version"
    """When a worker swaps a received version in: "every_version" (what the real worker does)
    or "when_behind" (only once the coordinator refuses it work with its current one), the
    once-per-window refresh the planner's stall term T_stall / (S*T_train) assumes."""
    worker_timeout_s: float = Field(6.0, ge=0)
    """How long the coordinator takes to notice a preempted worker and requeue its leases."""
    step_time_cv: float = Field(0.0, ge=0, le=5)
    """Coefficient of variation of the learner step time (gamma-distributed); 0: constant."""
    generation_cv: float = Field(0.0, ge=0, le=5)
    """Coefficient of variation of one lease's generation time (gamma-distributed)."""
    generation_range: tuple[float, float] | None = None
    """Bounded long-tailed generation times instead: a lease's length drawn log-uniform between
    these two (in any unit, e.g. [40, 400] tokens: only their ratio counts), scaled so that its
    mean is the class's generation time. A completion of 400 tokens then takes 2.56 times the
    mean, one of 40 a quarter of it, and none longer (the gamma's tail has no end)."""
    audit_share: float = Field(0.0, ge=0, le=1)
    """Share of trained groups the learner's rollout audit checks (a run's audit.enabled; at most
    every group, at least audit.recompute_fraction of them): a worker's measured rate then counts
    for the controller only once 2 of its groups passed, as at the coordinator (`policy.credit`).
    0: no audit, every measured rate counts at once."""
    workload_profile: list[ProfileSegment] = Field(default_factory=list)
    """The workload's step time and uninformative share by learner step, replayed (e.g. from a
    measured run: benchmarks/fleet_ssh.py). Steps before the first segment, and fields a segment
    leaves out, take [workload]'s. step_time_cv then spreads each step around its segment's
    value. The planner and the controller's prior still read [workload]."""
    max_sim_s: float = Field(1e9, gt=0)
    """Simulated-time horizon: a run that has not finished by then stops and says so."""
    preemption_scale: float = Field(1.0, gt=0)
    """Simulated machines are preempted this many times as often as their class's mean_uptime_s
    says, while the planner and the controller's prior still read mean_uptime_s: a provider
    whose spot machines go away more often than advertised."""

    @model_validator(mode="after")
    def _one_spread(self) -> SimSettings:
        if self.generation_range is not None:
            low, high = self.generation_range
            if not 0 < low < high:
                raise ValueError(f"sim.generation_range={list(self.generation_range)}: give [shortest, longest] with "
                                 "0 < shortest < longest, e.g. [40, 400] tokens")
            if self.generation_cv > 0:
                raise ValueError("sim.generation_range and sim.generation_cv both spread generation times: set one")
        starts = [segment.from_step for segment in self.workload_profile]
        if starts != sorted(set(starts)):
            raise ValueError(f"sim.workload_profile from_step values {starts}: give each segment a larger "
                             "from_step than the one before, e.g. 0, 10, 20")
        return self


class SweepSettings(Frozen):
    worker_counts: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    """Plot (a): fleet sizes N for dissemination latency per topology."""
    learner_uplink_bps: float | None = Field(None, gt=0)
    """Plot (a): the limited learner uplink; default the learner's uplink_bps."""
    worker_bandwidth_bps: float = Field(1e9, gt=0)
    """Plot (a): every worker's bandwidth."""
    staleness: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4, 6, 8])
    """Plot (b): S values."""
    bandwidths_bps: list[float] = Field(default_factory=lambda: [1e8, 2e8, 1e9, 1e10])
    """Plot (b): worker bandwidths (every class set to the value)."""
    steps: int = Field(60, ge=1)
    """Learner steps of each plot (b) run."""

    @model_validator(mode="after")
    def _non_empty(self) -> SweepSettings:
        for name in ("worker_counts", "staleness", "bandwidths_bps"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name} must list at least one value")
        if min(self.worker_counts) < 1 or min(self.staleness) < 0 or min(self.bandwidths_bps) <= 0:
            raise ValueError("worker_counts >= 1, staleness >= 0 and bandwidths_bps > 0 required")
        return self


class SimActivationConfig(ActivationConfig):
    """The coordinator's activation controller, with defaults at the time scale of simulated
    fleets (learner steps of a minute, machines that take minutes to boot) rather than of the
    local tiny runs; every field means what it means in `echo2 run`'s [activation]."""

    control_period_s: float = Field(60.0, gt=0)
    """How often the activation set is re-decided; a preempted worker re-decides at once."""
    scale_down_after_s: float = Field(600.0, ge=0.0)
    """A cheaper, smaller set replaces the current one only this long after the last change."""
    provider: Literal["static", "local", "ssh", "skypilot"] = "local"
    """The provider `echo2 run` would use, and the simulated machines follow its rule (one
    FleetSync, sim/provider.py). "static": idle workers stay rented and bill; "local", "ssh" and
    "skypilot" (releasable, alike here: each class's boot_s and mean_uptime_s say how its
    machines boot and go away): a worker inactive for release_after_s is released (bills nothing;
    a later acquire bills from the acquire, boots and re-downloads). The real config's inventory
    and coordinator_url are not read."""
    release_after_s: float = Field(900.0, ge=0.0)
    """How long a worker must stay inactive before its provider releases it."""
    probation_timeout_s: float = Field(1800.0, gt=0)
    """How long an unmeasured worker keeps its probation slot: a first download of 16 GB and
    min_samples leases of minutes each take tens of minutes."""

    @model_validator(mode="after")
    def _provider_needs(self) -> SimActivationConfig:
        """Replaces the run's check: simulated machines need no inventory of hosts, and the
        scenario is the catalog of its classes."""
        return self


class ScenarioConfig(Frozen):
    name: str = ""
    """Label shown in the output; default the file name."""
    learner: LearnerClass
    workers: dict[str, SimWorkerClass] = Field(min_length=1)
    workload: Workload
    broadcast: PlannedBroadcast = PlannedBroadcast()
    plan: PlanSettings = PlanSettings()
    """The planner's settings for `activation = "plan"`; its generation_cv is sim.generation_cv."""
    activation: SimActivationConfig = SimActivationConfig()
    """Mode "plan": the online controller's settings (headroom, hysteresis, scale-down delay)."""
    sim: SimSettings = SimSettings()
    sweep: SweepSettings = SweepSettings()

    @model_validator(mode="after")
    def _consistent(self) -> ScenarioConfig:
        self.plan_config()  # the catalog's own checks (tokens_per_rollout when tokens_per_s is used)
        if "generation_cv" in self.plan.model_fields_set and self.plan.generation_cv != self.sim.generation_cv:
            raise ValueError(
                f"plan.generation_cv={self.plan.generation_cv} differs from sim.generation_cv="
                f"{self.sim.generation_cv}: in a scenario the planner reads sim.generation_cv; set only that"
            )
        # the planner's value is the simulator's, so a dump of the scenario validates again
        object.__setattr__(self, "plan", self.plan.model_copy(update={"generation_cv": self.sim.generation_cv}))
        return self

    def plan_config(self) -> PlanConfig:
        """The same scenario as an `echo2 plan` catalog (what the activation rule reads)."""
        return PlanConfig(
            learner=self.learner,
            workers={name: w.plan_class() for name, w in self.workers.items()},
            workload=self.workload,
            broadcast=self.broadcast,
            plan=self.plan.model_copy(update={"generation_cv": self.sim.generation_cv}),
        )


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> ScenarioConfig:
    """Read a scenario TOML, apply `--set a.b=value` overrides, validate."""
    data: dict[str, Any] = apply_overrides(read_toml(path), overrides or [])
    data.setdefault("name", Path(path).stem)
    return validate(ScenarioConfig, data, source=f"scenario {str(path)!r}")
