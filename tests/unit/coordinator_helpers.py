"""Builders for coordinator tests: a state machine over a real store and scorer, a fake clock,
and well-formed messages to mutate into bad ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save

from echo2.broadcast.signing import generate_private_key, public_key_hex, sign_manifest
from echo2.config.run import RunConfig
from echo2.config.task import AdditionConfig
from echo2.coordinator.records.store import Store
from echo2.coordinator.scoring.scorer import Scorer
from echo2.coordinator.state import CoordinatorState
from echo2.policy.rewards import RewardRules
from echo2.policy.trust import Standing
from echo2.protocol.manifest import build_manifest
from echo2.protocol.messages import (
    LeaseRequest,
    RegisterRequest,
    RolloutCompletion,
    RolloutSubmission,
    SamplingParams,
    VersionInfo,
)
from echo2.tasks import make_task

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=4, group_size=2)
KEEP_ALIKE = RewardRules(drop_uninformative_groups=False)
"""For tests whose workers run the untrained tiny model: every completion of it scores 0, so
with grpo.drop_uninformative_groups no group would ever reach a batch."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# what a test may set on the state, by the run config field it lives in
_FIELDS = {
    "max_staleness": "train.max_staleness", "max_masked_fraction": "train.max_masked_fraction",
    "fresh_leases": "train.fresh_leases", "eval_every": "train.eval_every", "final_version": "train.steps",
    "groups_per_step": "grpo.prompts_per_step", "lora": "grpo.lora",
    "heartbeat_interval_s": "coordinator.heartbeat_interval_s", "worker_timeout_s": "coordinator.worker_timeout_s",
    "lease_timeout_s": "coordinator.lease_timeout_s", "max_leases_per_worker": "coordinator.max_leases_per_worker",
    "forget_workers_after_s": "coordinator.forget_workers_after_s",
    "registrations_per_minute": "coordinator.registrations_per_minute", "scoring": "coordinator.scoring",
    "registrations_per_s": "coordinator.registrations_per_s", "heartbeats_per_s": "coordinator.heartbeats_per_s",
    "audit_flags_to_quarantine": "audit.flags_to_quarantine", "require_seeded_sampler": "audit.require_seeded_sampler",
    "eval_problems_per_lease": "evaluation.problems_per_lease", "learner_price_per_hour": "learner.price_per_hour",
    "learner_upload_bps": "learner.upload_bps", "activation": "activation", "broadcast": "broadcast",
}


def make_state(tmp: Path, model_dir: Path, clock: FakeClock, max_staleness: int = 1, groups_per_step: int = 2,
               sampling: SamplingParams = SAMPLING, scorer=None, rewards: RewardRules | None = None,
               config: dict | None = None, **fields):
    """A coordinator state over `tmp`'s store. `fields`: run config fields by the short names
    of `_FIELDS` (plus `eval_on_workers`); `config`: more of the run config, as its TOML tables;
    `rewards`: the intake's reward rules as given (default: dropping uninformative groups with
    no audit sample, so tests that count drops see every one)."""
    cfg = quick_config(model_dir, max_staleness=max_staleness, groups_per_step=groups_per_step, sampling=sampling,
                       config=config, **fields)
    scorer = scorer or Scorer(make_task(AdditionConfig(), seed=0), str(model_dir))
    state = CoordinatorState(cfg, Store(tmp / "coordinator.db"), scorer, clock=clock)
    state.intake.rules = rewards or RewardRules()
    return state


def quick_config(model_dir: Path, *, sampling: SamplingParams = SAMPLING, eval_on_workers: bool = False,
                 config: dict | None = None, **fields) -> RunConfig:
    """The run config's defaults with short timeouts, the tiny model at `model_dir` and
    evaluation on the learner, unless the arguments say otherwise (see `make_state`)."""
    data: dict = {"run_dir": str(model_dir.parent / "unused-run"), "model": {"source": str(model_dir)},
                  "warmstart": {"steps": 0}, "sampling": sampling.model_dump(),
                  "coordinator": {"heartbeat_interval_s": 1.0, "worker_timeout_s": 5.0, "lease_timeout_s": 60.0},
                  "evaluation": {"where": "workers" if eval_on_workers else "learner"}}
    for name, value in fields.items():
        section, _, key = _FIELDS[name].partition(".")
        value = value.model_dump() if hasattr(value, "model_dump") else value
        if key:
            data.setdefault(section, {})[key] = value
        else:
            data[section] = {**data.get(section, {}), **value}
    for section, table in (config or {}).items():
        data[section] = {**data[section], **table} if isinstance(table, dict) and section in data else table
    return RunConfig.model_validate(data)


def event_records(state: CoordinatorState) -> list[dict]:
    """The state's pending events as the metrics records they become."""
    return [event.record() for event in state.events]


LEARNER_KEY = generate_private_key()
LEARNER_KEY_HEX = public_key_hex(LEARNER_KEY.public_key())


def version_info(version: int) -> VersionInfo:
    payload = save({"w": np.full(4, version, dtype=np.float32)})  # a real (tiny) safetensors blob
    manifest = build_manifest(version, payload, chunk_bytes=8, published_at=1.0)
    signed = sign_manifest(manifest, LEARNER_KEY)
    return VersionInfo(version=version, signed=signed, origin_url="http://learner:1", published_at=1.0)


def publish(state: CoordinatorState, version: int) -> None:
    state.learner_desk.publish(version_info(version), LEARNER_KEY_HEX)


def register(state: CoordinatorState, worker_id: str) -> None:
    state.worker_desk.register(RegisterRequest(worker_id=worker_id, engine="hf"))


def past_slow_start(state: CoordinatorState, *worker_ids: str) -> None:
    """Registered workers with the standing of many accepted groups (no deadline samples), so
    they may hold the per-worker cap at once: for tests about other rules than slow start."""
    for worker_id in worker_ids:
        state.groups.trust.standing[worker_id] = Standing(accepted=16)


def lease(state: CoordinatorState, worker_id: str, version: int, max_tasks: int = 1):
    return state.worker_desk.lease(LeaseRequest(worker_id=worker_id, version=version, max_tasks=max_tasks))


def answer_ids(state: CoordinatorState, lease_id: str, correct: bool) -> list[int]:
    """Token ids of the right (or a wrong) answer plus EOS, for the leased prompt."""
    prompt_index = state.leases_book.leases[lease_id].prompt_index
    answer = state.scorer.problem(prompt_index).answer
    text = answer if correct else str(int(answer) + 1) if answer.lstrip("-").isdigit() else "?"
    eos = state.scorer.tokenizer.token_to_id("<eos>")
    return state.scorer.tokenizer.encode(text, add_special_tokens=False).ids[:3] + [eos]


def submission(state: CoordinatorState, worker_id: str, lease_id: str, version: int, *, alike: bool = False,
               **overrides) -> RolloutSubmission:
    """An informative group: its first completion right, the others wrong (rewards [1, 0]), so
    grpo.drop_uninformative_groups keeps it; `alike`: every completion right (rewards [1, 1]),
    a group that teaches nothing."""
    right, wrong = answer_ids(state, lease_id, correct=True), answer_ids(state, lease_id, correct=alike)
    completions = [RolloutCompletion(token_ids=ids, logprobs=[-0.5] * len(ids))
                   for ids in [right] + [wrong] * (SAMPLING.group_size - 1)]
    data = dict(worker_id=worker_id, lease_id=lease_id, version=version, completions=completions, gen_time_s=0.1)
    data.update(overrides)
    return RolloutSubmission(**data)
