"""Schema of `echo2 plan` input: a worker catalog (learner class + rollout worker classes) and
a workload. Both may live in one TOML file; `--workload FILE` replaces the [workload] and
[broadcast] tables with those of another file, so one catalog serves many workloads.

    [learner]          the central learner cluster (price, uplink, its own rollout speed)
    [workers.NAME]     one table per rollout worker class, keyed by a short name
                       (so `--set workers.NAME.count=8` works)
    [workload]     model size, batch, learner step time, S, generation and load times
    [broadcast]    weight dissemination topology and chunking
    [plan]         latency percentile and generation-time spread the planner provisions for
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from echo2.config.base import Frozen, apply_overrides, read_toml, validate
from echo2.config.skypilot import SkyPilotClass


class _Throughput(Frozen):
    rollouts_per_s: float | None = Field(None, gt=0)
    """Measured rollouts (completions) per second at full load. Give this or tokens_per_s."""
    tokens_per_s: float | None = Field(None, gt=0)
    """Aggregate generated tokens per second at full load; divided by
    workload.tokens_per_rollout to get rollouts/s."""

    def rollout_rate(self, tokens_per_rollout: float | None) -> float | None:
        if self.rollouts_per_s is not None:
            return self.rollouts_per_s
        if self.tokens_per_s is not None and tokens_per_rollout:
            return self.tokens_per_s / tokens_per_rollout
        return None


class LearnerClass(_Throughput):
    name: str = "learner"
    price_per_hour: float = Field(gt=0)
    """What the learner cluster costs while the run lasts ($/h, all its GPUs)."""
    uplink_bps: float = Field(gt=0)
    """Learner uplink in bits/s: the root of every weight broadcast."""


class WorkerClass(_Throughput):
    count: int = Field(ge=0)
    """How many such workers can be rented (or are in the swarm)."""
    price_per_hour: float = Field(ge=0)
    """$/h per worker."""
    bandwidth_bps: float = Field(gt=0)
    """Network bandwidth of one worker in bits/s (up and down assumed alike)."""
    reachable: bool = True
    """Accepts incoming connections; workers behind NAT (false) can only be broadcast leaves."""
    generation_time_s: float | None = Field(None, ge=0)
    """T_gen for this class (one rollout group, slowest completion); default: the workload's."""
    mean_uptime_s: float | None = Field(None, gt=0)
    """Mean time to preemption (exponential); None: never preempted. The planner keeps
    uptime / (uptime + rejoin) of the class's throughput, rejoin being the time a replacement
    needs before it delivers (next round, transfer, swap, half a generation lost in flight)."""
    skypilot: SkyPilotClass | None = None
    """The machine SkyPilot rents for one worker of this class ([workers.NAME.skypilot]); None:
    the class is not rented through SkyPilot (echo2.launch.skypilot)."""

    @model_validator(mode="after")
    def _one_rate(self) -> WorkerClass:
        if (self.rollouts_per_s is None) == (self.tokens_per_s is None):
            raise ValueError("give exactly one of rollouts_per_s or tokens_per_s")
        return self


class Workload(Frozen):
    model: str = ""
    """Label shown in the output (e.g. "Qwen3-8B bf16")."""
    params: float = Field(gt=0)
    """Model parameters (8.2e9 for Qwen3-8B)."""
    bytes_per_param: float = Field(2.0, gt=0)
    """Bytes per parameter on the wire: 2 for bf16, 1 for fp8."""
    bytes_per_version: float | None = Field(None, gt=0)
    """M, measured: bytes one published version puts on the wire (the run summary's
    `bytes_per_version`, or benchmarks/delta_bytes.py: a full bf16 version, a delta + zstd with
    broadcast.deltas, or a LoRA adapter); when given it replaces params x bytes_per_param."""
    join_bytes: float | None = Field(None, gt=0)
    """Bytes a worker holding no version fetches before it can generate: with deltas, the full
    version (params x bytes_per_param, or the summary's `full_bytes_per_version`); with full
    versions or LoRA (workers load the base at start) the default, M itself."""
    prompts_per_step: int = Field(ge=1)
    group_size: int = Field(ge=1)
    """B = prompts_per_step x group_size rollouts per learner step."""
    tokens_per_rollout: float | None = Field(None, gt=0)
    """Mean generated tokens per rollout; needed when a class gives tokens_per_s."""
    step_time_s: float = Field(gt=0)
    """T_train: learner seconds per optimizer step, data ready."""
    max_staleness: int = Field(ge=0, le=1000)
    """S: a rollout from version v is trained at step t only if t - v <= S."""
    generation_time_s: float = Field(ge=0)
    """T_gen: time for a worker to finish one rollout group (its slowest completion)."""
    load_time_s: float = Field(0.0, ge=0)
    """Local swap of a received version into the engine (part of T_dis)."""
    background_fetch: bool = True
    """Workers keep generating while a version downloads and stall only load_time_s per
    version; false: they stall for the whole dissemination latency."""
    uninformative_share: float = Field(0.0, ge=0, le=0.95)
    """d: share of scored groups whose rewards all equal each other, which the coordinator drops
    (grpo.drop_uninformative_groups) so the batch is refilled with other prompts: the fleet
    must generate B / (1 - d) rollouts per step (planner.capacity.rollouts_generated_per_step).
    A run's summary reports it as `uninformative_share`. At most 0.95: beyond that the
    requirement is 20x the batch and the measurement rather than the plan should decide."""
    segment_s: float | None = Field(None, ge=0, le=3600)
    """T_seg, in-flight weight updates (sampling.segment_tokens): seconds a generation takes for
    one segment, i.e. segment_tokens over the slowest completion's decode rate (256 tokens at
    ~55 tokens/s: ~5 s). A worker with a newer version staged swaps it in at the next segment
    boundary and generates the rest of the group with it, so a group's tokens span versions and
    the staleness bound applies per token (planner.capacity.swapped_lateness_s): S_min becomes
    ceil-above((T_dis + T_seg + (1 - f) T_gen) / T_train) instead of ceil((T_dis + T_gen) / T_train).
    None: no swaps mid-generation (segment_tokens = 0, or an engine that swaps between
    generations only)."""
    max_masked_fraction: float = Field(0.5, gt=0, le=1)
    """f, train.max_masked_fraction: a group whose tokens span versions is trained while the
    share of them older than S stays below f (policy.admission.admits_tokens). Only matters
    with segment_s."""

    @property
    def batch_rollouts(self) -> int:
        """B: rollouts consumed per learner step."""
        return self.prompts_per_step * self.group_size

    @property
    def snapshot_bytes(self) -> float:
        """M: bytes of one version on the wire, measured if the workload gives them."""
        if self.bytes_per_version is not None:
            return self.bytes_per_version
        return self.params * self.bytes_per_param

    @property
    def newcomer_bytes(self) -> float:
        """What a worker with no version fetches first (join_bytes, default M)."""
        return self.join_bytes if self.join_bytes is not None else self.snapshot_bytes

    def catch_up_bytes(self, versions_behind: int | None) -> float:
        """Bytes that bring a worker `versions_behind` versions behind (None: holding none) to
        the newest: the missed versions one by one, or a fresh start when that is fewer."""
        if versions_behind is None:
            return self.newcomer_bytes
        return min(versions_behind * self.snapshot_bytes, max(self.newcomer_bytes, self.snapshot_bytes))


class PlannedBroadcast(Frozen):
    """The broadcast as `echo2 plan` and the simulator model it (the settings of a real run's
    broadcast are echo2.config.broadcast.BroadcastConfig's; a version's plan of who pulls from
    whom is echo2.protocol.broadcast.BroadcastPlan)."""

    topology: Literal["chain", "tree", "one_to_many", "ideal"] = "chain"
    """How versions reach workers: pipelined relay chain or d-ary tree, the learner sending
    every copy, or the ideal-network reference (each worker at its full downlink)."""
    chunk_bytes: int = Field(64 << 20, ge=1 << 10)
    """Pipelining unit: each relay hop adds one chunk's transfer time."""
    fanout: int = Field(2, ge=2, le=64)
    """Children per relay in the tree topology."""
    hop_latency_s: float = Field(0.05, ge=0)
    """Per-hop setup and round-trip latency over the WAN."""


class PlanSettings(Frozen):
    """How conservatively the planner reads the latencies it is given."""

    latency_percentile: float = Field(0.9, ge=0.5, lt=1)
    """Quantile of the fleet's latency distribution the overlap condition must hold for: the
    wait for a broadcast round plus one group's generation time, taken at this quantile (0.9:
    p90), plus the transfer to the slowest chain position. 0.5 plans for the median; higher
    values rent fewer marginal workers and need a larger S."""
    generation_cv: float = Field(0.3, ge=0, le=5)
    """Coefficient of variation of one group's generation time around generation_time_s (gamma
    distributed): long-tailed completion lengths. In an `echo2 sim` scenario the simulator's
    sim.generation_cv is used instead."""


class PlanConfig(Frozen):
    learner: LearnerClass
    workers: dict[str, WorkerClass] = Field(min_length=1)
    """Rollout worker classes by name."""
    workload: Workload
    broadcast: PlannedBroadcast = PlannedBroadcast()
    plan: PlanSettings = PlanSettings()

    @model_validator(mode="after")
    def _consistent(self) -> PlanConfig:
        uses_tokens = (
            any(w.tokens_per_s is not None for w in self.workers.values()) or self.learner.tokens_per_s
        )
        if uses_tokens and self.workload.tokens_per_rollout is None:
            raise ValueError("workload.tokens_per_rollout is required when a class gives tokens_per_s")
        return self

    def worker_rps(self, worker: WorkerClass) -> float:
        rate = worker.rollout_rate(self.workload.tokens_per_rollout)
        assert rate is not None  # guaranteed by the validators above
        return rate

    def learner_rps(self) -> float | None:
        return self.learner.rollout_rate(self.workload.tokens_per_rollout)


def load_plan_config(
    catalog: str | Path, workload: str | Path | None = None, overrides: list[str] | None = None
) -> PlanConfig:
    """Read the catalog TOML, replace [workload]/[broadcast] from `workload` if given, apply
    `--set` overrides, validate."""
    data: dict[str, Any] = read_toml(catalog)
    if workload is not None:
        extra = read_toml(workload)
        unknown = sorted(set(extra) - {"workload", "broadcast"})
        if unknown:
            raise ValueError(
                f"workload file {str(workload)!r}: only [workload] and [broadcast] tables allowed (got {unknown})"
            )
        data.update(extra)
    data = apply_overrides(data, overrides or [])
    return validate(PlanConfig, data, source=f"catalog {str(catalog)!r}")
