"""Hand-written stand-ins for the learner's network side (echo2.protocol.links.LearnerLink; real:
LearnerIO): batches come from a list (FakeIO) or are made per step (StepIO), publishes are
signed for real and recorded, rejected batches are recorded. The learner itself (model, step,
checkpoints, metrics) is the real one. tests/unit/test_links.py checks every fake here against
the Protocol, signature by signature."""

from __future__ import annotations

import mmap
import random
import time
from pathlib import Path

from echo2.broadcast.signing import generate_private_key, sign_manifest
from echo2.config.run import RunConfig
from echo2.protocol.learner_api import GroupAudit
from echo2.protocol.links import LearnerLink
from echo2.protocol.manifest import AdapterSpec, build_manifest
from echo2.protocol.messages import EvaluationResult, RolloutCompletion, TrainGroup, VersionInfo


class FakeIO(LearnerLink):
    def __init__(self, batches: list[list[TrainGroup]]) -> None:
        self.batches = list(batches)  # handed out in order: a rejected step gets the next one
        self.key = generate_private_key()
        self.published: list[tuple[int, bytes]] = []
        self.rejected: list[tuple[int, str]] = []
        self.requeued: list[tuple[str, ...]] = []
        self.audits: list[tuple[int, list[GroupAudit]]] = []
        self.asked: list[int] = []
        self.durable: list[int | None] = []  # the checkpoint step reported with each batch request
        self.last_encode_s = 0.0
        self.evaluations_asked: list[int] = []

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def publish(self, version: int, payload: bytes | mmap.mmap, *, adapter: AdapterSpec | None = None) -> VersionInfo:
        data = bytes(payload)
        self.published.append((version, data))
        signed = sign_manifest(build_manifest(version, data, 1 << 16, published_at=time.time()), self.key)
        return VersionInfo(version=version, signed=signed, origin_url="http://fake", published_at=time.time())

    def origin_bytes_sent(self, version: int) -> int:
        return 0

    def fetch_batch(self, step: int, *, wait_s: float, step_time_s: float | None = None,
                    durable_step: int | None = None) -> list[TrainGroup]:
        self.asked.append(step)
        self.durable.append(durable_step)
        return self.batches.pop(0)

    def reject_batch(self, step: int, reason: str, requeue_lease_ids: tuple[str, ...] = ()) -> None:
        self.rejected.append((step, reason))
        self.requeued.append(tuple(requeue_lease_ids))

    def report_audit(self, step: int, verdicts: list[GroupAudit]) -> None:
        self.audits.append((step, verdicts))

    def evaluation_result(self, version: int, *, wait_s: float) -> EvaluationResult:
        """The last version's evaluation on a worker (here: done at once, as asked)."""
        self.evaluations_asked.append(version)
        return EvaluationResult(version=version, done=True, accuracy=0.5, problems=4, evaluated_version=version)


class StepIO(FakeIO):
    """Batches made per step (step t: seed t + 1, whatever step a resume starts at), so runs of
    different lengths and resumed runs see the same batch at the same step."""

    def __init__(self, tokenizer) -> None:
        super().__init__([])
        self.tokenizer = tokenizer

    def fetch_batch(self, step: int, *, wait_s: float, step_time_s: float | None = None,
                    durable_step: int | None = None) -> list[TrainGroup]:
        self.asked.append(step)
        return addition_batch(self.tokenizer, step + 1)


def learner_config(run_dir: Path, model_dir: Path, **sections) -> RunConfig:
    data = {
        "run_dir": str(run_dir),
        "model": {"source": str(model_dir)},
        "warmstart": {"steps": 0},
        "task": {"digits": 1, "eval_size": 4},
        "sampling": {"max_new_tokens": 4, "group_size": 4},
        "grpo": {"prompts_per_step": 2, "lr": 1e-2},
        "train": {"steps": 2, "checkpoint_every": 1, "eval_every": 1000},
        # the batches here carry made-up behaviour log-probs; the audit's own tests turn it on
        "audit": {"enabled": False},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return RunConfig.model_validate(data)


def addition_batch(tokenizer, seed: int, groups: int = 2, group_size: int = 4, behaviour: float | None = None):
    """Groups of a 1-digit addition prompt with random completions, mixed rewards; `behaviour`
    overrides one token's behaviour log-prob (a fabricated value)."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tokenizer.encode(f"{rng.randint(0, 9)}+{rng.randint(0, 9)}=", add_special_tokens=False)
        completions = []
        for _ in range(group_size):
            ids = [rng.randint(4, 40) for _ in range(rng.randint(1, 3))] + [tokenizer.eos_token_id]
            completions.append(RolloutCompletion(token_ids=ids, logprobs=[-rng.random() * 3 - 1 for _ in ids]))
        if behaviour is not None:
            first = completions[0]
            completions[0] = RolloutCompletion(token_ids=first.token_ids, logprobs=[behaviour] + first.logprobs[1:])
        out.append(TrainGroup(lease_id=f"{seed}-{g}", prompt_index=seed * 10 + g, prompt_ids=prompt, version=0,
                              worker_id="w", rewards=[float(i % 2) for i in range(group_size)],
                              completions=completions))
    return out
