"""The learner's main loop: fetch the batch for step t, take one GRPO step, publish version
t+1, checkpoint and evaluate on schedule. Resumes from the newest checkpoint in the run dir."""

from __future__ import annotations

import copy
import hashlib
import time
from pathlib import Path

import torch

from echo2.config.run import RunConfig
from echo2.learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from echo2.learner.io import LearnerIO
from echo2.learner.step import train_step
from echo2.models.generation import greedy_accuracy
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import state_dict_to_bytes
from echo2.protocol.messages import TrainGroup
from echo2.report.metrics import MetricsWriter
from echo2.tasks import make_task


class Learner:
    def __init__(self, cfg: RunConfig, coordinator_url: str, token: str) -> None:
        self.cfg = cfg
        torch.set_num_threads(cfg.train.torch_threads)
        self.tokenizer = load_tokenizer(cfg.base_model_path)
        self.model = load_model(cfg.base_model_path)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.grpo.lr, weight_decay=cfg.grpo.weight_decay
        )
        self.ref_model = copy.deepcopy(self.model).eval() if cfg.grpo.kl_coef > 0 else None
        self.task = make_task(cfg.task, cfg.seed)
        self.eval_set = self.task.eval_problems()
        self.metrics = MetricsWriter(cfg.run_path / "metrics.jsonl", role="learner")
        self.ckpt_dir = Path(cfg.run_path) / "checkpoints"
        self.io = LearnerIO(cfg, coordinator_url, token)
        self.published: set[int] = set()  # versions this process served

    def train(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        start = self._restore()
        self.io.start()
        try:
            self._publish(start)
            if start == 0:
                self._evaluate(0)
            busy_s = None
            for step in range(start, cfg.train.steps):
                groups, wait_s = self._wait_for_batch(step, busy_s)
                stats = train_step(self.model, self.optimizer, groups, step, cfg.grpo,
                                   cfg.sampling.temperature, self.tokenizer.pad_token_id, self.ref_model)
                publish_s = self._publish(step + 1)
                # logged before the checkpoint: a crash in between re-logs the step on resume
                # instead of losing its record
                self.metrics.write("train_step", step=step, wait_s=wait_s, publish_s=publish_s, **stats)
                busy_s = stats["train_s"] + publish_s + self._maybe_checkpoint(step + 1)
                if (step + 1) % cfg.train.eval_every == 0 or step + 1 == cfg.train.steps:
                    self._evaluate(step + 1)
            self.metrics.write("learner_done", steps=cfg.train.steps)
        finally:
            self.io.close()
            self.metrics.close()

    def _restore(self) -> int:
        path = latest_checkpoint(self.ckpt_dir)
        if path is None:
            return 0
        step = load_checkpoint(path, self.model, self.optimizer)
        self.metrics.write("learner_resumed", step=step, checkpoint=str(path))
        return step

    def _wait_for_batch(self, step: int, busy_s: float | None) -> tuple[list[TrainGroup], float]:
        started = time.perf_counter()
        while True:
            groups = self.io.fetch_batch(step, wait_s=self.cfg.train.batch_wait_s, step_time_s=busy_s)
            if groups:
                return groups, time.perf_counter() - started

    def _publish(self, version: int) -> float:
        started = time.perf_counter()
        info = self.io.publish(version, state_dict_to_bytes(self.model))
        elapsed = time.perf_counter() - started
        manifest = info.signed.unverified_manifest()  # we signed it a moment ago
        # the digest lets a test prove a resumed learner republishes bit-identical versions
        digest = hashlib.sha256("".join(manifest.chunk_sha256).encode()).hexdigest()
        self.metrics.write("version_published", version=version, bytes=manifest.total_bytes,
                           manifest_digest=digest, publish_s=elapsed)
        if version - 1 in self.published:  # its broadcast is (nearly) done: the uplink it cost
            self.metrics.write("origin_bytes", version=version - 1, total_bytes=manifest.total_bytes,
                               bytes_sent=self.io.origin_bytes_sent(version - 1))
        self.published.add(version)
        return elapsed

    def _maybe_checkpoint(self, step: int) -> float:
        if step % self.cfg.train.checkpoint_every and step != self.cfg.train.steps:
            return 0.0
        started = time.perf_counter()
        path = save_checkpoint(self.ckpt_dir, step, self.model, self.optimizer)
        elapsed = time.perf_counter() - started
        # attributed to the step that produced it (step - 1) in the learner's busy time
        self.metrics.write("checkpoint", step=step, checkpoint_s=elapsed, path=str(path))
        return elapsed

    def _evaluate(self, step: int) -> None:
        started = time.perf_counter()
        accuracy = greedy_accuracy(self.model, self.tokenizer, self.task, self.eval_set,
                                   self.cfg.sampling.max_new_tokens)
        self.metrics.write("eval", step=step, accuracy=accuracy, eval_s=time.perf_counter() - started)
