"""Prepare the run's starting policy in `<run_dir>/base`: build the tiny model, dequantize a GGUF
file (or take the user's checkpoint), run the supervised warm start, measure held-out accuracy,
and cache the result (echo2.models.prepare's cache). A later run with the same
model/task/warm-start settings reuses it; a GGUF model without a warm start is dequantized once
for every run and task."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from echo2.config.run import RunConfig
from echo2.models.prepare import (
    MARKER,
    cache_path,
    copy_dir,
    dequantize_only,
    fingerprint,
    prepared_gguf,
    prepared_info,
)
from echo2.models.sources import dequantize_gguf


def prepare_base_model(cfg: RunConfig, log: Callable[[str], None] = print) -> dict:
    """Make `cfg.base_model_path` ready; returns what was done (accuracy, seconds)."""
    if cfg.base_model_path == cfg.model.source:
        return {"base": cfg.model.source, "warm_start_steps": 0}  # the user's checkpoint as is
    cached = prepared_info(cfg)
    if cached is not None:
        log(f"base model ready in {cfg.base_model_path} ({_what(cached)})")
        return cached
    if dequantize_only(cfg):
        prepared_gguf(cfg.model, cfg.cache_dir, log)
    if prepared_info(cfg, cache_path(cfg)) is not None:
        copy_dir(cache_path(cfg), Path(cfg.base_model_path))
        return prepare_base_model(cfg, log)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)  # nothing else runs yet: use every core
    base, tmp = Path(cfg.base_model_path), cfg.run_path / ".base.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    started = time.perf_counter()
    info = _build(cfg, tmp, log)
    info.update(fingerprint=fingerprint(cfg), seconds=time.perf_counter() - started)
    (tmp / MARKER).write_text(json.dumps(info, indent=2))
    copy_dir(tmp, cache_path(cfg))
    shutil.rmtree(base, ignore_errors=True)
    os.rename(tmp, base)
    log(f"base model ready in {base} after {info['seconds']:.0f}s ({_what(info)})")
    return info


def _what(info: dict) -> str:
    if "as_given" in info:
        return info["as_given"]
    if "accuracy" not in info:
        return f"{info.get('architecture', 'model')} dequantized from {info.get('gguf', 'GGUF')}"
    return f"{info.get('measure', 'held-out accuracy')} {info['accuracy']:.3f}"


def _agent_base(cfg: RunConfig, task, model, tokenizer, *, out: Path) -> dict:
    """A verifiers environment has no reference answers to warm-start on: the base is the model
    as given (the learner's first evaluation measures it)."""
    if cfg.warmstart.steps > 0:
        raise ValueError(f"warmstart.steps = {cfg.warmstart.steps} with task.name = 'verifiers': a verifiers "
                         "environment has no reference completions to imitate; set warmstart.steps = 0 and start "
                         "from a model that can already act in it")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"warm_start_steps": 0, "as_given": f"no warm start: {task.cfg.environment} has no reference answers"}


def _build(cfg: RunConfig, out: Path, log: Callable[[str], None]) -> dict:
    # deferred, as torch is: a base found in the cache is ready without either
    from echo2.learner.warmstart import CHECK_OFFSET, warm_start
    from echo2.models.env_evaluation import evaluate_episodes
    from echo2.models.evaluation import evaluate
    from echo2.models.loading import load_model, load_tokenizer
    from echo2.models.tiny import save_tiny
    from echo2.tasks import make_task

    source = cfg.model.source
    if source == "tiny":
        save_tiny(cfg.model, out, seed=cfg.seed)
        source = str(out)
    elif cfg.model.is_gguf:  # dequantized, then warm-started (without a warm start: prepared_gguf)
        log(f"dequantizing {source} with transformers' GGUF loader")
        dequantize_gguf(cfg.model, out)
        source = str(out)
    model, tokenizer = load_model(source), load_tokenizer(source)
    task = make_task(cfg.task, cfg.seed)
    if task.kind == "agent":
        return _agent_base(cfg, task, model, tokenizer, out=out)

    def progress(step: int, loss: float) -> None:
        if step % max(1, cfg.warmstart.steps // 10) == 0 or step == cfg.warmstart.steps:
            log(f"warm start {step}/{cfg.warmstart.steps}: loss {loss:.3f}")

    ws = cfg.warmstart
    max_new = cfg.sampling.max_new_tokens
    multi_turn = task.kind == "episode"

    def training_accuracy() -> float:
        if multi_turn:  # the share of training episodes played without an illegal action
            seeds = [task.train_seed(CHECK_OFFSET + i) for i in range(ws.check_problems)]
            summary = evaluate_episodes(model, tokenizer, task, max_new, opponents=[task.training_opponent()],
                                        seeds=seeds)
            reached = 1.0 - next(iter(summary["opponents"].values()))["illegal_rate"]
        else:
            check = [task.train_problem(CHECK_OFFSET + i) for i in range(ws.check_problems)]
            reached = evaluate(model, tokenizer, task, check, max_new_tokens=max_new).accuracy
        log(f"warm start: training-problem accuracy {reached:.3f} (stop at {ws.stop_at_accuracy})")
        return reached

    log(f"warm start: up to {ws.steps} supervised steps on {task.name} (stands in for a pretrained base)")
    loss, steps = warm_start(model, tokenizer, task, ws, seed=cfg.seed, progress=progress,
                             accuracy=training_accuracy, max_action_tokens=max_new)
    measure = "held-out accuracy"
    if multi_turn:  # the in-run evaluation's measure: mean reward against the training opponent
        summary = evaluate_episodes(model, tokenizer, task, max_new, opponents=[task.training_opponent()])
        accuracy = next(iter(summary["opponents"].values()))["mean_reward"]
        measure = "held-out mean reward"
    else:
        accuracy = evaluate(model, tokenizer, task, task.eval_problems(), max_new_tokens=max_new).accuracy
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"accuracy": accuracy, "measure": measure, "final_loss": loss, "warm_start_steps": steps}
