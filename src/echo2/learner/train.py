"""The learner's main loop: fetch the batch for step t, take one GRPO step, publish version
t+1, checkpoint and evaluate on schedule. Resumes from the newest checkpoint in the run dir.

A step whose loss or gradient is not finite changes nothing: its batch goes back to the
coordinator and step t is tried again on fresh groups.

Under torchrun with several ranks the model is sharded (FSDP2) and every rank runs this loop in
lockstep: rank 0 fetches each batch and hands it to the others, each rank trains on its share of
the micro-batches, rank 0 publishes each version from the gathered full weights and alone talks
to the coordinator and writes metrics."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import os
import time
from pathlib import Path

import torch

from echo2.broadcast.signing import private_key_bytes
from echo2.config.run import RunConfig
from echo2.learner.audit import Auditor, audit_skip_reason, audit_summary
from echo2.learner.checkpoint import latest_checkpoint, save_checkpoint
from echo2.learner.checkpoint_reader import load_checkpoint
from echo2.learner.distributed import init_ranks
from echo2.learner.episode_eval import evaluate_episodes_in_run
from echo2.learner.io import LearnerIO
from echo2.learner.precision import resolve_precision
from echo2.learner.samples import sample_rows
from echo2.learner.step import emulate_slower_learner, train_step
from echo2.models.device import DTYPES, checkpoint_dtype
from echo2.models.evaluation import evaluate
from echo2.models.loading import enable_activation_checkpointing, load_model, load_tokenizer
from echo2.models.lora import adapter_payload, add_lora, audit_payload, lora_parameters
from echo2.models.weights import require_finite, tensors_payload, unique_tensors
from echo2.protocol.learner_api import GroupAudit
from echo2.protocol.links import LearnerLink
from echo2.protocol.manifest import AdapterSpec
from echo2.protocol.messages import TrainGroup
from echo2.report.metrics import MetricsWriter
from echo2.tasks import make_task

log = logging.getLogger("echo2.learner")


class Learner:
    def __init__(self, cfg: RunConfig, coordinator_url: str, *, learner_token: str = "", join_token: str = "",
                 io: LearnerLink | None = None) -> None:
        """`io`: the link to the coordinator (a LearnerIO to `coordinator_url` when None; tests
        pass a fake); only rank 0 holds one."""
        self.cfg = cfg
        torch.set_num_threads(cfg.learner_threads(os.cpu_count() or 1))
        precision = resolve_precision(cfg.learner)
        self.ranks, device = init_ranks(precision.device)
        self.precision = dataclasses.replace(precision, device=device)
        self.leader = self.ranks.leader
        if not self.leader:  # rank 0 tells the story; the others speak only of trouble
            logging.getLogger("echo2").setLevel(logging.WARNING)
        self.tokenizer = load_tokenizer(cfg.base_model_path)
        # fp32 master weights; a sharded model is cut on the CPU and each shard moved to the device
        self.model = load_model(cfg.base_model_path, "cpu" if self.ranks.sharded else device)
        if cfg.grpo.lora is not None:  # only the adapters train; versions carry them alone
            if self.ranks.sharded:
                raise ValueError(f"grpo.lora with learner.ranks={self.ranks.world}: a sharded learner does not train "
                                 "LoRA adapters yet; set learner.ranks=1 (adapters need no sharding) or drop grpo.lora")
            add_lora(self.model, cfg.grpo.lora)
        self.publish_names = list(unique_tensors(self.model))  # tied weights travel once
        self.wire_dtype = wire_dtype(cfg.broadcast.wire_dtype, cfg.base_model_path)
        if cfg.learner.gradient_checkpointing:
            enable_activation_checkpointing(self.model)
        self.ref_model = copy.deepcopy(self.model).eval() if cfg.grpo.kl_coef > 0 else None
        if self.ranks.sharded:
            from echo2.learner.sharding import shard_model

            for model in filter(None, (self.model, self.ref_model)):
                shard_model(model, self.precision, self.ranks)
            log.info("learner sharded over %d ranks (FSDP2, %s): rank 0 talks to the coordinator", self.ranks.world,
                     torch.distributed.get_backend())
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.grpo.lr, weight_decay=cfg.grpo.weight_decay
        )
        self.scoring_model: torch.nn.Module | None = None  # a sharded learner's audit recomputes on it
        self.task = make_task(cfg.task, cfg.seed)
        self.multi_turn = self.task.kind != "single"  # episodes: echo2's environments, or a verifiers one
        if self.multi_turn and self.ranks.sharded:
            # episode evaluation generates turn by turn on one rank; sharded ranks would wait on
            # each other's collectives inside generate
            raise ValueError(f"learner.ranks={self.ranks.world} with the multi-turn task {cfg.task.name!r}: "
                             "a sharded learner does not evaluate episodes yet; set learner.ranks=1")
        # evaluation leases: workers evaluate versions off this loop; else the learner does, between steps
        self.eval_on_workers = cfg.evaluation.on_workers(self.multi_turn)
        self.eval_set = [] if self.multi_turn or self.eval_on_workers else self.task.eval_problems()
        self.metrics = MetricsWriter(cfg.run_path / "metrics.jsonl" if self.leader else None, role="learner",
                                     segment_bytes=cfg.metrics_segment_bytes)
        self.ckpt_dir = Path(cfg.run_path) / "checkpoints"
        self.durable_step: int | None = None  # step of the newest checkpoint on disk, told to the coordinator
        self.io: LearnerLink | None = None
        if self.leader:
            self.io = io or LearnerIO(cfg, coordinator_url, learner_token, join_token)
        self.published: set[int] = set()  # versions this process served
        self.skips_in_a_row = 0
        # only rank 0 picks stale groups to recompute (with its key) and keeps published versions
        exact_wire = self.wire_dtype == next(self.model.parameters()).dtype
        self.auditor = Auditor(cfg.audit, cfg.train.max_staleness, private_key_bytes(self.io.key) if self.io else b"",
                               exact_wire=exact_wire)

    def train(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        step = self._restore()
        if self.io:
            self.io.start()
        try:
            self._publish(step)
            if step == 0 and not self.eval_on_workers:
                self._evaluate(0)
            busy_s = None
            while step < cfg.train.steps:
                groups, wait_s = self._wait_for_batch(step, busy_s)
                stats, verdicts = self._train_audited(groups, step)
                if stats["skipped"]:
                    busy_s = self._skip(step, wait_s=wait_s, stats=stats, groups=groups, verdicts=verdicts)
                    continue  # the same step again, on a fresh batch
                self.skips_in_a_row = 0
                publish_s = self._publish(step + 1)
                # logged before the checkpoint: a crash in between re-logs the step on resume
                # instead of losing its record
                self.metrics.write("train_step", step=step, wait_s=wait_s, publish_s=publish_s, **stats,
                                   **learner_tokens_per_s(stats))
                self._log_samples(step, groups)
                log.info("step %d/%d: waited %.1f s for the batch, trained in %.2f s (reward %.3f, loss %.4f, "
                         "staleness <= %d), published version %d in %.2f s", step + 1, cfg.train.steps, wait_s,
                         stats["train_s"], stats["reward_mean"], stats["loss"], stats["staleness_max"], step + 1,
                         publish_s)
                busy_s = stats["train_s"] + publish_s + self._maybe_checkpoint(step + 1)
                step += 1
                if not self.eval_on_workers and (step % cfg.train.eval_every == 0 or step == cfg.train.steps):
                    self._evaluate(step)
            if self.eval_on_workers and self.io:
                self._await_evaluation(cfg.train.steps)
            self.metrics.write("learner_done", steps=cfg.train.steps)
            log.info("done: %d steps trained", cfg.train.steps)
        finally:
            if self.io:
                self.io.close()
            self.metrics.close()
            self.ranks.close()

    def _restore(self) -> int:
        path = latest_checkpoint(self.ckpt_dir)
        if path is None:
            return 0
        step = self.durable_step = load_checkpoint(path, self.model, self.optimizer)
        self.metrics.write("learner_resumed", step=step, checkpoint=str(path))
        log.info("resumed at step %d from %s", step, path)
        return step

    def _wait_for_batch(self, step: int, busy_s: float | None) -> tuple[list[TrainGroup], float]:
        started = time.perf_counter()
        if not self.io:  # another rank: rank 0 fetches and hands the batch on
            return [TrainGroup.model_validate(g) for g in self.ranks.broadcast_json()], time.perf_counter() - started
        while True:
            groups = self.io.fetch_batch(step, wait_s=self.cfg.train.batch_wait_s, step_time_s=busy_s,
                                         durable_step=self.durable_step)
            if groups:
                if self.ranks.sharded:
                    self.ranks.broadcast_json([g.model_dump(mode="json") for g in groups])
                return groups, time.perf_counter() - started
            # one line per long poll (train.batch_wait_s): the operator sees the learner is starved
            log.info("step %d: still waiting for rollouts after %.0f s (are workers registered and loading "
                     "versions? see the coordinator's log)", step + 1, time.perf_counter() - started)

    def _train_audited(self, groups: list[TrainGroup], step: int) -> tuple[dict, list[GroupAudit]]:
        """The step, with the rollout audit around it: chosen groups are recomputed under the
        versions their workers were sent first (a failure skips the step before any training);
        with a wire equal to the learner's weights, groups at this version are checked inside
        the step. The verdicts go to the coordinator either way."""
        cfg, started, cpu_started = self.cfg, time.perf_counter(), time.process_time()
        verdicts = self.auditor.check_before_step(self._scoring_model(), groups, step=step, grpo=cfg.grpo,
                                                  temperature=cfg.sampling.temperature,
                                                  pad_id=self.tokenizer.pad_token_id,
                                                  precision=self.precision) if self.io else []
        reason = audit_skip_reason(verdicts, cfg.audit.max_mean_abs_logprob_diff)
        if self.ranks.sharded:  # every rank skips, or none does
            reason = self.ranks.broadcast_json(reason)
        if reason:
            stats = {"skipped": True, "skip_kind": "audit", "train_s": time.perf_counter() - started,
                     "skip_reason": reason, "prompt_indices": [g.prompt_index for g in groups],
                     "log_ratio_outliers": 0}
        else:
            stats = train_step(self.model, self.optimizer, groups, step=step, cfg=cfg.grpo,
                               temperature=cfg.sampling.temperature, pad_id=self.tokenizer.pad_token_id,
                               ref_model=self.ref_model, precision=self.precision,
                               audit_tolerance=self.auditor.tolerance, ranks=self.ranks,
                               max_new_tokens=cfg.sampling.max_new_tokens, max_staleness=cfg.train.max_staleness)
            emulate_slower_learner(cfg.learner.slowdown, cfg.learner.slowdown_clock, time.perf_counter() - started,
                                   time.process_time() - cpu_started)
            stats["train_s"] = time.perf_counter() - started  # the recomputation included
            if stats["skip_kind"] != "non_finite":  # a broken learner's log-probs say nothing of workers
                verdicts += self.auditor.check_current(groups, step, stats.pop("group_abs_diff"))
        stats.pop("group_abs_diff", None)
        if verdicts and self.io:
            self.io.report_audit(step, verdicts)
            self.metrics.write("audit", step=step, **audit_summary(verdicts))
        return stats, verdicts

    def _skip(self, step: int, *, wait_s: float, stats: dict, groups: list[TrainGroup],
              verdicts: list[GroupAudit]) -> float:
        """Nothing was applied: record why, hand the batch back, and stop on a run of skips. A
        step skipped by the audit hands back the groups that passed and were not held out, and
        does not count toward the run of skips (the coordinator quarantines the worker that
        failed)."""
        audit = stats["skip_kind"] == "audit"
        self.skips_in_a_row += 0 if audit else 1
        if self.io:  # every rank counts the run of skips; rank 0 reports it and hands the batch back
            self._report_skip(step, wait_s=wait_s, stats=stats, groups=groups,
                              failed={v.lease_id for v in verdicts if v.failed or v.held_out})
        if audit:
            return stats["train_s"]
        limit = self.cfg.train.max_consecutive_skips
        if self.skips_in_a_row >= limit:
            raise RuntimeError(
                f"learner: {self.skips_in_a_row} steps in a row had a non-finite loss or gradient (last: "
                f"{stats['skip_reason']}); train.max_consecutive_skips={limit}. Lower grpo.lr, or check the "
                "task's rewards and the workers' log-probs (the step_skipped records in metrics.jsonl name the prompts)"
            )
        return stats["train_s"]

    def _report_skip(self, step: int, *, wait_s: float, stats: dict, groups: list[TrainGroup],
                     failed: set[str]) -> None:
        audit = stats["skip_kind"] == "audit"
        if not audit:
            log.warning("step %d skipped (%d in a row): %s", step + 1, self.skips_in_a_row, stats["skip_reason"])
        else:
            log.warning("step %d skipped by the rollout audit: %s", step + 1, stats["skip_reason"])
        self.metrics.write("step_skipped", step=step, wait_s=wait_s, reason=stats["skip_reason"],
                           skip_kind=stats["skip_kind"], in_a_row=self.skips_in_a_row, train_s=stats["train_s"],
                           prompt_indices=stats["prompt_indices"], log_ratio_outliers=stats["log_ratio_outliers"])
        requeue = tuple(g.lease_id for g in groups if g.lease_id not in failed) if audit else ()
        self.io.reject_batch(step, stats["skip_reason"], requeue)

    def _log_samples(self, step: int, groups: list[TrainGroup]) -> None:
        """Every report.samples_every_steps steps, a few of the batch's completions as text."""
        every = self.cfg.report.samples_every_steps
        if self.leader and every and step % every == 0:
            self.metrics.write("samples", step=step,
                               samples=sample_rows(groups, self.tokenizer.decode, self.cfg.report))

    def _publish(self, version: int) -> float:
        started = time.perf_counter()
        versioned = self._version_payload(version)
        if versioned is None:  # another rank: it gave its shards to rank 0's full copy
            return time.perf_counter() - started
        payload, audit, adapter = versioned
        info = self.io.publish(version, payload, adapter=adapter)
        self.auditor.published(version, audit)  # the audit recomputes under what workers got
        elapsed = time.perf_counter() - started
        manifest = info.signed.unverified_manifest()  # we signed it a moment ago
        # the digest lets a test prove a resumed learner republishes bit-identical versions
        digest = hashlib.sha256("".join(manifest.chunk_sha256).encode()).hexdigest()
        self.metrics.write("version_published", version=version, bytes=manifest.total_bytes,
                           full_bytes=manifest.loaded_bytes, form=manifest.form, anchor=info.full is not None,
                           encode_s=self.io.last_encode_s,
                           wire_dtype=str(self.wire_dtype).removeprefix("torch."), manifest_digest=digest,
                           publish_s=elapsed)
        if version - 1 in self.published:  # its broadcast is (nearly) done: the uplink it cost
            self.metrics.write("origin_bytes", version=version - 1, total_bytes=manifest.total_bytes,
                               bytes_sent=self.io.origin_bytes_sent(version - 1))
        if not self.published:  # later publishes are in each step's line
            log.info("published version %d; workers pull versions from the origin at %s (learner.advertise_host)",
                     version, info.origin_url)
        self.published.add(version)
        return elapsed

    def _version_payload(self, version: int):
        """What version `version` carries: every weight, or with grpo.lora the adapters alone
        (and the same adapters under the model's own names for the audit). Never a broken model.
        None on the ranks other than 0 of a sharded learner (they take part in the gather)."""
        lora = self.cfg.grpo.lora
        if lora is None:
            tensors = self._full_tensors()
            if not self.io:
                return None
            require_finite(tensors, f"version {version}")
            payload = tensors_payload(tensors, self.wire_dtype)
            return payload, payload, None
        require_finite(lora_parameters(self.model), f"version {version}")
        adapter = AdapterSpec(r=lora.r, alpha=lora.alpha, target_modules=list(lora.target_modules))
        return adapter_payload(self.model, self.wire_dtype), audit_payload(self.model, self.wire_dtype), adapter

    def _full_tensors(self) -> dict[str, torch.Tensor]:
        """The weights to publish, tied aliases left out: the model's own tensors, or on a
        sharded learner the full state dict gathered to rank 0's CPU (every rank takes part;
        the others get nothing)."""
        if not self.ranks.sharded:
            return unique_tensors(self.model)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {name: full[name] for name in self.publish_names} if self.leader else {}

    def _scoring_model(self) -> torch.nn.Module:
        """What the audit recomputes stale groups on: the model itself, or for a sharded learner
        an unsharded copy on rank 0 in the wire dtype (the audit runs it under each version's
        weights, which rank 0 alone keeps), made on first use."""
        if not self.ranks.sharded:
            return self.model
        if self.scoring_model is None:
            dtype = str(self.wire_dtype).removeprefix("torch.")
            self.scoring_model = load_model(self.cfg.base_model_path, self.precision.device, dtype).eval()
        return self.scoring_model

    def _maybe_checkpoint(self, step: int) -> float:
        if step % self.cfg.train.checkpoint_every and step != self.cfg.train.steps:
            return 0.0
        started = time.perf_counter()
        if self.ranks.sharded:
            from echo2.learner.sharded_checkpoint import save_sharded_checkpoint

            path = save_sharded_checkpoint(self.ckpt_dir, step, self.model, self.optimizer, ranks=self.ranks)
        else:
            path = save_checkpoint(self.ckpt_dir, step, self.model, self.optimizer)
        self.durable_step = step
        elapsed = time.perf_counter() - started
        # attributed to the step that produced it (step - 1) in the learner's busy time
        self.metrics.write("checkpoint", step=step, checkpoint_s=elapsed, path=str(path))
        return elapsed

    def _evaluate(self, step: int) -> None:
        """Greedy pass@1 on the held-out set (task.eval_size problems, every train.eval_every
        steps), with the code `echo2 eval` runs; for a multi-turn task, task.eval_size greedy
        episodes against the training opponent (`accuracy` is then the win rate)."""
        if self.multi_turn:  # echo2's environments, or a verifiers one (learner.episode_eval)
            evaluate_episodes_in_run(self.model, self.tokenizer, self.task, self.cfg, step=step,
                                     autocast=self.precision.autocast, metrics=self.metrics)
            return
        with self.precision.autocast():
            report = evaluate(self.model, self.tokenizer, self.task, self.eval_set,
                              max_new_tokens=self.cfg.sampling.max_new_tokens,
                              synced_ranks=self.ranks.sharded)
        self.metrics.write("eval", step=step, accuracy=report.accuracy, problems=report.problems,
                           eval_s=report.seconds)
        log.info("eval after step %d: accuracy %.3f on %d held-out problems", step, report.accuracy, report.problems)

    def _await_evaluation(self, version: int) -> None:
        """The last version's evaluation runs on a worker; the run's "after" accuracy is it, so
        the learner waits for it (nothing else is left to do) up to evaluation.final_wait_s."""
        limit_s = self.cfg.evaluation.final_wait_s
        deadline = time.monotonic() + limit_s
        log.info("waiting for a worker to evaluate version %d (up to %.0f s)", version, limit_s)
        while time.monotonic() < deadline:
            result = self.io.evaluation_result(version, wait_s=min(20.0, max(0.0, deadline - time.monotonic())))
            if result.done:
                log.info("eval of version %d on a worker: accuracy %.3f on %d held-out problems", version,
                         result.accuracy, result.problems)
                return
        log.warning("no evaluation of version %d within evaluation.final_wait_s=%.0f s (are workers alive and "
                    "holding it?); stopping without it", version, limit_s)


def learner_tokens_per_s(stats: dict) -> dict[str, float]:
    """What the step's passes computed per second of its training time (the audit's
    recomputation included), prompt and completion tokens apart: a shared prompt counts once."""
    seconds = stats.get("train_s") or 0.0
    if seconds <= 0:
        return {}
    return {"prompt_tokens_per_s": stats.get("prompt_tokens_computed", 0) / seconds,
            "completion_tokens_per_s": stats.get("completion_tokens_computed", 0) / seconds}


def wire_dtype(name: str, base_model_path: str) -> torch.dtype:
    """broadcast.wire_dtype resolved: "auto" is the dtype the base checkpoint is stored in."""
    if name != "auto":
        return DTYPES[name]
    from transformers import AutoConfig

    return checkpoint_dtype(AutoConfig.from_pretrained(base_model_path))

