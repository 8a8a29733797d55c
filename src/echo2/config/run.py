"""Schema of a run (`echo2 run --config FILE`): every section documented where it is declared.

The launcher resolves one `RunConfig`, writes it to `<run_dir>/config.json`, and every local
role reads the sections it needs from that file. Remote workers never see it: they get what
they need (sampling, group size, S, model source) from the coordinator when they register.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from echo2.config.activation import ActivationConfig
from echo2.config.audit import AuditConfig
from echo2.config.base import (
    DEVICE_FIELD,
    MAX_GROUP_SIZE,
    MAX_NEW_TOKENS,
    Frozen,
    apply_overrides,
    read_toml,
    validate,
)
from echo2.config.broadcast import BroadcastConfig
from echo2.config.catalog import PlanConfig, load_plan_config
from echo2.config.evaluation import EvaluationConfig
from echo2.config.fleet_roster import OfferedWorker, remote_offers
from echo2.config.grpo import GRPOConfig, LoraConfig
from echo2.config.report import ReportConfig
from echo2.config.scoring import ScoringConfig
from echo2.config.task import AdditionConfig, TaskConfig
from echo2.config.tls import TLSConfig
from echo2.config.worker import SlowdownClock, WorkerConfig

__all__ = ["GRPOConfig", "LoraConfig", "RunConfig", "load_run_config"]


class ModelConfig(Frozen):
    source: str = "tiny"
    """"tiny" builds the embedded Qwen3-architecture model and character tokenizer in the run
    dir; a `.gguf` file (or a directory holding one, named by `gguf_file`) is dequantized once
    by transformers' GGUF loader into the run's `base/`; anything else is a local model
    directory or hub id handed to `from_pretrained`."""
    gguf_file: str = Field("", max_length=512)
    """The GGUF file inside the `source` directory (transformers' `gguf_file`); empty: `source`
    is not a GGUF model, or is the `.gguf` file itself."""
    hidden_size: int = Field(96, ge=16, le=4096)
    """Tiny model only: width."""
    num_layers: int = Field(2, ge=1, le=48)
    """Tiny model only: transformer blocks."""
    num_heads: int = Field(4, ge=1, le=64)
    """Tiny model only: attention heads (key/value heads are the same number)."""
    intermediate_size: int = Field(256, ge=16)
    """Tiny model only: MLP width."""

    @model_validator(mode="after")
    def _gguf_named_once(self) -> ModelConfig:
        if self.gguf_file and (self.source == "tiny" or self.source.lower().endswith(".gguf")):
            raise ValueError(f"model.gguf_file={self.gguf_file!r} with model.source={self.source!r}: gguf_file names "
                             "the file inside a source directory; give either a .gguf source or a directory and "
                             "gguf_file, not both")
        if self.gguf_file and not self.gguf_file.lower().endswith(".gguf"):
            raise ValueError(f"model.gguf_file={self.gguf_file!r}: expected the name of a .gguf file")
        return self

    @property
    def is_gguf(self) -> bool:
        return bool(self.gguf_file) or self.source.lower().endswith(".gguf")


class WarmStartConfig(Frozen):
    """Short supervised fine-tune standing in for the pretrained base a real user brings
    (multi-turn tasks: episodes played with random legal moves, so it teaches the format only)."""

    steps: int = Field(300, ge=0)
    """Optimizer steps; 0 skips the warm start (use this with a real pretrained model)."""
    batch_size: int = Field(64, ge=1)
    lr: float = Field(3e-3, gt=0)
    stop_at_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop early once greedy accuracy on `check_problems` training problems (never the held-out
    ones) reaches this, checked every `check_every` steps. Where a tiny model lands after a fixed
    number of steps depends a lot on its initial weights (from rarely to almost always right,
    seed to seed); this makes the base "sometimes right" whatever the draw.
    Multi-turn tasks measure the share of training episodes played without an illegal action.
    None: always run `steps`."""
    check_every: int = Field(50, ge=1)
    check_problems: int = Field(200, ge=1, le=10_000)


class SamplingConfig(Frozen):
    temperature: float = Field(1.0, gt=0, le=10)
    """Sampling temperature; the learner divides logits by it too so ratios compare like with like."""
    max_new_tokens: int = Field(8, ge=1, le=MAX_NEW_TOKENS)
    group_size: int = Field(8, ge=2, le=MAX_GROUP_SIZE)
    """G completions per prompt; GRPO normalises rewards within a group."""
    segment_tokens: int = Field(0, ge=0, le=MAX_NEW_TOKENS)
    """In-flight weight updates: a worker that has a newer version verified while it generates
    swaps it in at the next multiple of this many tokens and generates the rest with it (each
    token carries the version that sampled it; train.max_masked_fraction bounds a group's stale
    share). 0: versions are swapped between generations only, as for short answers."""


class TrainConfig(Frozen):
    steps: int = Field(100, ge=1)
    """Learner optimizer steps (= policy versions published after the initial one)."""
    max_staleness: int = Field(2, ge=0, le=1000)
    """S: a rollout generated by version v is trained at step t only if t - v <= S (0: synchronous)."""
    max_masked_fraction: float = Field(0.5, gt=0, le=1)
    """The staleness bound per token: at step t, tokens sampled by a version v with t - v > S are
    masked out of the loss (kept as context), and a group is trained while that share of its
    tokens stays below this (policy/admission.py: admits_tokens). A group that one version
    sampled has a share of 0 or 1, so this only matters for generations that straddled versions
    (sampling.segment_tokens)."""
    fresh_leases: bool = False
    """True: S is a bound, not a target. Lease only as far ahead as keeps the learner from waiting
    (policy/window.py: the lease window starts at S steps, shrinks a step after a run of batches
    that were ready when asked for, 3 at first and twice as many after each wait, never below the
    measured S_min, and grows a step at once whenever the learner waited), so groups train at the
    lowest staleness the fleet allows (configs/smollm2_*.toml turn it on). Off by default because
    it fights cost-aware activation: the smaller window leaves unmeasured workers few of the
    leases that would measure them, which the activation rule does not allow for, and priced
    runs lose steady learner utilization (runs with [activation] enabled = false do not). False
    keeps the whole window of S steps leased or buffered ahead (with fast workers, most groups
    train S versions old)."""
    checkpoint_every: int = Field(25, ge=1)
    eval_every: int = Field(25, ge=1)
    """Versions due for held-out evaluation: 0, every eval_every-th and the last (see
    [evaluation] for where it runs)."""
    torch_threads: int | Literal["auto"] = "auto"
    """Learner threads. "auto": the machine's cores less the threads of the local workers
    `echo2 run` starts beside it (workers.count x their torch_threads), at least 1: threads that
    outnumber free cores wait on each other, so a learner given the workers' cores too steps
    slower, not faster. Alone on the box, every core."""
    batch_wait_s: float = Field(20.0, gt=0)
    """Long-poll window for one batch request; the learner re-asks until the batch is ready."""
    max_consecutive_skips: int = Field(8, ge=1)
    """A step whose loss or gradient is not finite is skipped (no optimizer update, nothing
    published) and its batch is handed back for a fresh one. This many skips in a row stop the
    learner with an error: something systematic (learning rate, data, numerics) is wrong, and
    retrying forever would only burn rollouts."""


class CoordinatorConfig(Frozen):
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    """0 picks a free port; the bound address is written to <run_dir>/coordinator.json."""
    auth_token: str = ""
    """Shared bearer token for every request. Empty: taken from $ECHO2_AUTH_TOKEN, and the local
    launcher generates a fresh random one per run."""
    heartbeat_interval_s: float = Field(5.0, gt=0, le=600)
    """How often a worker proves it is alive and reports its counters. Version news and
    activation do not wait for it: they reach workers on their news lines as they happen. With
    more live workers than heartbeat_interval_s x heartbeats_per_s, or under load, each
    worker is told a longer interval (and its timeout stretches with it)."""
    heartbeats_per_s: float = Field(250.0, gt=0)
    """The heartbeat rate the coordinator plans for, the whole fleet together: about a tenth
    of one core for these requests, whatever the fleet's size."""
    idle_news_per_s: float = Field(2000.0, gt=0)
    """News lines a second the coordinator writes its idle workers of new versions, the whole
    fleet together, a slice at a time (active workers and the relays they pull from hear every
    version at once): a larger idle fleet hears every few versions, by turns along the relay
    tree, each worker after its relays, and each heartbeat's reply carries the newest."""
    worker_timeout_s: float = Field(30.0, gt=0)
    """A worker silent for this long is dead: its leases go back to the queue. Several heartbeat
    intervals, so one slow heartbeat under CPU contention does not evict a live worker."""
    lease_timeout_s: float = Field(120.0, gt=0)
    """Upper bound on how long one lease may stay outstanding even while its worker heartbeats."""
    max_request_bytes: int = Field(8 << 20, ge=1 << 16)
    """Requests larger than this are refused with 413."""
    forget_workers_after_s: float = Field(300.0, gt=0)
    """A departed or timed-out worker that never had a rollout accepted and costs nothing is
    forgotten this long after it was last seen, so a flood of registrations does not leave a
    record each (and a /v1/state that grows with them); workers that did work stay, for the
    run's accounting."""
    registrations_per_minute: float = Field(60.0, gt=0)
    """Registrations accepted per source address per minute (a burst of as many is allowed):
    a fleet behind one NAT joins at once, a registration flood does not."""
    registrations_per_s: float = Field(100.0, gt=0)
    """Registrations the whole run admits per second, from every address (as large a burst):
    10,000 workers joining at once are admitted over about 100 s, each told when to come back,
    while rollouts and the learner's batches keep their pace."""
    max_leases_per_worker: int = Field(0, ge=0)
    """Most prompts one worker may hold leased at once; 0: one learner step's worth
    (grpo.prompts_per_step). A worker that claims to be fast cannot lease the whole staleness
    window and starve the others."""
    scoring: ScoringConfig = ScoringConfig()
    """Where and how long rewards are computed (echo2.config.scoring)."""

    @model_validator(mode="after")
    def _timeouts_consistent(self) -> CoordinatorConfig:
        if self.worker_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"worker_timeout_s ({self.worker_timeout_s}) must exceed 2 x heartbeat_interval_s "
                f"({self.heartbeat_interval_s}) or live workers get evicted between heartbeats"
            )
        return self


class LearnerConfig(Frozen):
    device: str = DEVICE_FIELD
    """Where the learner trains: "auto" (the first CUDA GPU if torch sees one, else the CPU),
    "cpu", "cuda" or "cuda:N". Asking for CUDA without a CUDA build of torch is an error."""
    precision: Literal["auto", "fp32", "bf16-mixed"] = "auto"
    """"bf16-mixed": fp32 master weights and fp32 AdamW states, forward and backward under bf16
    autocast (token log-probs are taken in fp32 from bf16 logits). "fp32": everything in fp32.
    "auto": bf16-mixed on CUDA, fp32 on the CPU."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of keeping
    them: about a third more compute for activation memory of one block per micro-batch."""
    ranks: int = Field(1, ge=1, le=64)
    """Processes `echo2 run` starts the learner as (`torchrun --standalone --nproc-per-node
    ranks`), one GPU each on CUDA. Above 1 the model, gradients and AdamW states are sharded
    with FSDP2 (gloo on the CPU, NCCL on GPUs) and each rank trains on its share of a step's
    micro-batches; checkpoints are then written sharded, and resume on any number of ranks.
    `echo2 learner` started by torchrun yourself (several hosts) takes its ranks from torchrun."""
    host: str = "127.0.0.1"
    """Address the learner's broadcast origin binds; workers pull versions from it."""
    advertise_host: str = ""
    """Address workers reach the origin at; empty: `host` (set it when binding 0.0.0.0)."""
    port: int = Field(0, ge=0, le=65535)
    upload_bps: float = Field(1e9, gt=0)
    """The learner's uplink in bits/s, as declared to the broadcast planner (how many first-hop
    workers it can feed at the stream rate)."""
    price_per_hour: float = Field(0.0, ge=0)
    """What the learner's machine costs, for the run's cost accounting."""
    request_timeout_s: float = Field(60.0, gt=0)
    """Timeout of one control request to the coordinator (a batch long-poll adds its wait)."""
    slowdown: float = Field(1.0, ge=1.0, le=1000.0)
    """EMULATION ONLY: each step idles (slowdown - 1) x its compute time, counted as step time, as a
    slower learner (a larger model) would: benchmarks pace a one-machine run's learner against its
    paced workers (worker.slowdown) in a catalog's proportions."""
    slowdown_clock: SlowdownClock = "wall"
    """EMULATION ONLY: what `slowdown` multiplies, as worker.slowdown_clock ("cpu": the learner's
    CPU time, so a coordinator or workers sharing its cores do not slow it; for a learner with
    one compute thread)."""


class LocalWorkersConfig(Frozen):
    count: int = Field(3, ge=0, le=256)
    """Workers the local launcher starts."""
    worker: WorkerConfig = WorkerConfig()
    """Settings every local worker gets (engine, threads, tasks per lease, ...)."""
    per_worker: list[dict[str, Any]] = []
    """Entry i overrides fields of `worker` for local worker i (e.g. price_per_hour, slowdown),
    to emulate a heterogeneous fleet on one machine. Entries past `count` are unused, so
    `--set workers.count=2` works on a config that describes more workers."""

    @model_validator(mode="after")
    def _per_worker_valid(self) -> LocalWorkersConfig:
        for index in range(len(self.per_worker)):
            self.worker_config(index)
        return self

    def worker_config(self, index: int) -> WorkerConfig:
        """The settings of local worker `index`: shared settings plus its own overrides."""
        extra = self.per_worker[index] if index < len(self.per_worker) else {}
        data = {**self.worker.model_dump(), "worker_id": f"w{index}", **extra}
        return validate(WorkerConfig, data, source=f"workers.per_worker[{index}]")


class RunConfig(Frozen):
    run_dir: str = "runs/demo"
    """Everything a run writes: resolved config, metrics.jsonl, checkpoints, logs, the
    coordinator's store. Running again on the same dir resumes it."""
    cache_dir: str = "runs/.cache"
    """Prepared (warm-started) base models, keyed by model/task/warm-start settings and reused
    by every run with the same settings."""
    metrics_segment_bytes: int = Field(64 << 20, ge=1 << 16)
    """metrics.jsonl is split into segments of about this size: `metrics.jsonl`, then
    `metrics.jsonl.1`, `.2`, ... (higher is newer, none deleted; the summary reads them all in
    order). Local workers writing to the same file follow the segments the coordinator and
    learner start."""
    seed: int = 0
    model: ModelConfig = ModelConfig()
    task: TaskConfig = AdditionConfig()
    """The task (see echo2.tasks.registry): `name` picks the schema of the rest of the table."""
    warmstart: WarmStartConfig = WarmStartConfig()
    sampling: SamplingConfig = SamplingConfig()
    grpo: GRPOConfig = GRPOConfig()
    train: TrainConfig = TrainConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    learner: LearnerConfig = LearnerConfig()
    broadcast: BroadcastConfig = BroadcastConfig()
    activation: ActivationConfig = ActivationConfig()
    audit: AuditConfig = AuditConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    """Where the held-out evaluation of train.eval_every runs (evaluation leases on workers, or
    the learner) and how it is split."""
    workers: LocalWorkersConfig = LocalWorkersConfig()
    report: ReportConfig = ReportConfig()
    """Metric sinks (TensorBoard, W&B) fed from metrics.jsonl, sample completions, end-of-run plots."""
    tls: TLSConfig = TLSConfig()
    """TLS of the learner's machine: the coordinator and the learner's origin serve with
    `cert_file`/`key_file` (one certificate naming the hosts of both), and the learner verifies
    the coordinator against `ca_file`. `echo2 run` hands the same settings to its local workers
    unless `workers.worker.tls` sets their own. Empty: plain HTTP."""

    @model_validator(mode="before")
    @classmethod
    def _task_defaults_to_addition(cls, data: Any) -> Any:
        """A [task] table without `name` is the embedded addition task, the default (the tagged
        union needs a name to pick the task's schema)."""
        if isinstance(data, dict) and isinstance(data.get("task"), dict) and "name" not in data["task"]:
            data = {**data, "task": {"name": "addition", **data["task"]}}
        return data

    @model_validator(mode="after")
    def _overlong_buffer_below_cap(self) -> RunConfig:
        buffer, cap = self.grpo.overlong_buffer_tokens, self.sampling.max_new_tokens
        if buffer >= cap:
            raise ValueError(f"grpo.overlong_buffer_tokens={buffer} must be below sampling.max_new_tokens={cap} (the "
                             f"penalty ramps over the last buffer tokens before the cap): set it to at most {cap - 1}, "
                             "or 0 for no overlong shaping")
        return self

    @model_validator(mode="after")
    def _worker_classes_in_catalog(self) -> RunConfig:
        self.offered_workers()  # an inventory's bad host or class, a catalog with nothing to rent: now
        if not self.activation.catalog:
            return self
        classes = load_plan_config(self.activation.catalog).workers
        for index in range(self.workers.count):
            worker_class = self.workers.worker_config(index).worker_class
            if worker_class and worker_class not in classes:
                raise ValueError(f"workers: local worker {index} has worker_class {worker_class!r}, which the "
                                 f"activation catalog {self.activation.catalog!r} lacks (classes: "
                                 f"{', '.join(sorted(classes))}); set it to one of them, or empty")
        return self

    def offered_workers(self) -> tuple[OfferedWorker, ...]:
        """The workers a releasable provider starts on demand (config.fleet_roster), as the
        coordinator offers them to its activation controller at start: its first decision picks
        among them unstarted. "ssh" and "skypilot": their whole roster; "local": the local
        workers of `workers_started_on_demand`."""
        a = self.activation
        if a.provider in ("ssh", "skypilot"):
            catalog = load_plan_config(a.catalog) if a.catalog else None
            return remote_offers(a.provider, inventory_path=a.inventory, catalog=catalog)
        on_demand = self.workers_started_on_demand()
        configs = (self.workers.worker_config(i) for i in range(self.workers.count))
        return tuple(OfferedWorker(w.worker_id, w.price_per_hour, w.worker_class) for w in configs
                     if w.worker_id in on_demand)

    def activation_plan(self) -> PlanConfig | None:
        """[activation] catalog, loaded, with the run's S and batch in its workload (None: no
        catalog): what the controller's planned cover prices classes with."""
        if not self.activation.catalog:
            return None
        catalog = load_plan_config(self.activation.catalog)
        workload = catalog.workload.model_copy(update={
            "max_staleness": self.train.max_staleness, "prompts_per_step": self.grpo.prompts_per_step,
            "group_size": self.sampling.group_size})
        return catalog.model_copy(update={"workload": workload})

    def workers_started_on_demand(self) -> set[str]:
        """Local worker ids `echo2 run` starts only once the activation controller chooses them:
        with a catalog and a releasable provider, those that declare a class are offered to the
        coordinator at its start (the catalog prices them before any runs) and its first decision
        acquires the covering set; the rest never bill. Unclassed workers start at once (only
        their measured rate can price them). The coordinator offers the same set (`offered_workers`)."""
        a = self.activation
        if not (a.enabled and a.provider == "local" and a.catalog and self.train.max_staleness > 0):
            return set()
        configs = (self.workers.worker_config(i) for i in range(self.workers.count))
        return {w.worker_id for w in configs if w.worker_class}

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir)

    @property
    def base_model_path(self) -> str:
        """Where every role loads the starting policy from: the prepared (tiny, dequantized GGUF
        and/or warm-started) model in the run dir, or the user's checkpoint as given."""
        if self.model.source == "tiny" or self.model.is_gguf or self.warmstart.steps > 0:
            return str(self.run_path / "base")
        return self.model.source

    def learner_threads(self, cores: int) -> int:
        """train.torch_threads resolved on a machine of `cores` cores."""
        if self.train.torch_threads != "auto":
            return self.train.torch_threads
        local = sum(self.workers.worker_config(i).torch_threads for i in range(self.workers.count))
        return max(1, cores - local)

    @property
    def batch_rollouts(self) -> int:
        """B: rollouts consumed per learner step."""
        return self.grpo.prompts_per_step * self.sampling.group_size


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML file (or start from defaults), apply `--set` overrides, validate."""
    data: dict[str, Any] = read_toml(path) if path else {}
    data = apply_overrides(data, overrides or [])
    return validate(RunConfig, data, source=f"config {str(path)!r}" if path else "config")
