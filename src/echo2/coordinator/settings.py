"""What the coordinator's state machine needs from the run config, derived in one place
(`resolve`): no field here has a default of its own, so the config's defaults are the only ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from echo2.config.activation import ActivationConfig
from echo2.config.broadcast import BroadcastConfig
from echo2.config.catalog import PlanConfig, load_plan_config
from echo2.config.run import LoraConfig, RunConfig
from echo2.config.scoring import ScoringConfig
from echo2.policy.rewards import AUDITED_BEFORE_DROPPING, RewardRules
from echo2.protocol.messages import SamplingParams


class OfferedWorker(NamedTuple):
    """A worker the run's provider starts only when the controller chooses it."""
    worker_id: str
    price_per_hour: float
    worker_class: str


@dataclass(frozen=True)
class Settings:
    max_staleness: int
    max_masked_fraction: float
    """train.max_masked_fraction: the staleness bound per token (policy.admission.admits_tokens)."""
    groups_per_step: int
    """P: prompt groups per learner step (grpo.prompts_per_step; B = P x group_size rollouts)."""
    sampling: SamplingParams
    model_source: str
    heartbeat_interval_s: float
    worker_timeout_s: float
    lease_timeout_s: float
    activation: ActivationConfig
    activation_catalog: PlanConfig | None
    """[activation] catalog, loaded, with the run's S and batch in its workload."""
    offered_workers: tuple[OfferedWorker, ...]
    """`echo2 run`'s local workers started on demand (RunConfig.workers_started_on_demand):
    offered to the controller at start, so its first decision picks among them unstarted."""
    learner_price_per_hour: float
    broadcast: BroadcastConfig
    learner_upload_bps: float
    max_leases_per_worker: int
    """coordinator.max_leases_per_worker as configured: 0 means P (the data plane applies it)."""
    forget_workers_after_s: float
    registrations_per_minute: float
    audit_flags_to_quarantine: int
    require_seeded_sampler: bool
    lora: LoraConfig | None
    """grpo.lora when the run trains adapters: told to workers at registration."""
    eval_on_workers: bool
    """Held-out evaluation runs as evaluation leases ([evaluation] where)."""
    eval_every: int
    final_version: int
    """train.steps: the last version, evaluated exactly."""
    eval_problems_per_lease: int
    fresh_leases: bool
    """train.fresh_leases: lease only as far ahead as keeps the learner from waiting."""
    scoring: ScoringConfig
    """coordinator.scoring: the scoring pool's size and budget, and when a worker whose
    completions run over budget is refused."""
    rewards: RewardRules
    """grpo's overlong shaping and dynamic sampling (drop_uninformative_groups), applied to
    every scored group (`policy.rewards`)."""


def resolve(cfg: RunConfig, multi_turn: bool) -> Settings:
    """The coordinator's settings for `cfg`; `multi_turn`: the run's task plays episodes (its
    evaluation stays on the learner under evaluation.where = "auto")."""
    return Settings(
        max_staleness=cfg.train.max_staleness,
        groups_per_step=cfg.grpo.prompts_per_step,
        sampling=SamplingParams(temperature=cfg.sampling.temperature, max_new_tokens=cfg.sampling.max_new_tokens,
                                group_size=cfg.sampling.group_size, segment_tokens=cfg.sampling.segment_tokens),
        max_masked_fraction=cfg.train.max_masked_fraction,
        model_source=cfg.base_model_path,
        heartbeat_interval_s=cfg.coordinator.heartbeat_interval_s,
        worker_timeout_s=cfg.coordinator.worker_timeout_s,
        lease_timeout_s=cfg.coordinator.lease_timeout_s,
        activation=cfg.activation,
        activation_catalog=_catalog(cfg),
        offered_workers=_offered(cfg),
        learner_price_per_hour=cfg.learner.price_per_hour,
        broadcast=cfg.broadcast,
        learner_upload_bps=cfg.learner.upload_bps,
        max_leases_per_worker=cfg.coordinator.max_leases_per_worker,
        forget_workers_after_s=cfg.coordinator.forget_workers_after_s,
        registrations_per_minute=cfg.coordinator.registrations_per_minute,
        audit_flags_to_quarantine=cfg.audit.flags_to_quarantine,
        require_seeded_sampler=cfg.audit.require_seeded_sampler,
        lora=cfg.grpo.lora,
        eval_on_workers=cfg.evaluation.on_workers(multi_turn=multi_turn),
        eval_every=cfg.train.eval_every,
        final_version=cfg.train.steps,
        eval_problems_per_lease=cfg.evaluation.problems_per_lease,
        fresh_leases=cfg.train.fresh_leases,
        scoring=cfg.coordinator.scoring,
        rewards=RewardRules(overlong_buffer_tokens=cfg.grpo.overlong_buffer_tokens,
                            overlong_penalty=cfg.grpo.overlong_penalty,
                            drop_uninformative_groups=cfg.grpo.drop_uninformative_groups,
                            audit_fraction=cfg.audit.uninformative_fraction if cfg.audit.enabled else 0.0,
                            audited_before_dropping=AUDITED_BEFORE_DROPPING if cfg.audit.enabled else 0),
    )


def _catalog(cfg: RunConfig) -> PlanConfig | None:
    if not cfg.activation.catalog:
        return None
    catalog = load_plan_config(cfg.activation.catalog)
    workload = catalog.workload.model_copy(update={
        "max_staleness": cfg.train.max_staleness, "prompts_per_step": cfg.grpo.prompts_per_step,
        "group_size": cfg.sampling.group_size})
    return catalog.model_copy(update={"workload": workload})


def _offered(cfg: RunConfig) -> tuple[OfferedWorker, ...]:
    on_demand = cfg.workers_started_on_demand()
    configs = (cfg.workers.worker_config(i) for i in range(cfg.workers.count))
    return tuple(OfferedWorker(w.worker_id, w.price_per_hour, w.worker_class) for w in configs
                 if w.worker_id in on_demand)
