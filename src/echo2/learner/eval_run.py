"""What `echo2 eval` runs: load a model (a Hugging Face model or an echo2 checkpoint over its
run's base model) and evaluate it on the configured task's held-out problems."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from echo2.config.run import RunConfig


def load_for_eval(model_source: str, checkpoint: Path | None, device: str):
    from echo2.learner.checkpoint_reader import load_model_weights
    from echo2.models.device import resolve_device
    from echo2.models.loading import load_model, load_tokenizer

    where = resolve_device(device, "--device")
    model = load_model(model_source, where)
    if checkpoint is not None:
        load_model_weights(checkpoint, model)
    return model, load_tokenizer(model_source)


def run_eval(cfg: RunConfig, model, tokenizer, *, n: int, temperature: float, ks: Sequence[int], max_new_tokens: int,
             limit: int | None = None, progress: Callable[[int, int], None] | None = None) -> dict:
    from echo2.models.evaluation import evaluate
    from echo2.tasks import make_task

    task = make_task(cfg.task, cfg.seed)
    task.check()
    if task.kind == "agent":
        from echo2.models.agent_evaluation import evaluate_agent

        report = evaluate_agent(model, tokenizer, task, max_new_tokens, tokenizer_source=cfg.base_model_path,
                                indices=task.eval_indices(limit) * n, temperature=temperature)
        report.pop("rewards")
        return {**report, "samples_per_episode": n}
    if task.kind == "episode":
        return _run_episodes(task, model, tokenizer, n=n, temperature=temperature, max_new_tokens=max_new_tokens,
                             limit=limit)
    problems = task.eval_problems()[:limit] if limit else task.eval_problems()
    report = evaluate(model, tokenizer, task, problems, max_new_tokens=max_new_tokens, n=n,
                      temperature=temperature, ks=ks, progress=progress)
    return report.to_dict()


def _run_episodes(task, model, tokenizer, *, n: int, temperature: float, max_new_tokens: int,
                  limit: int | None) -> dict:
    """A multi-turn task: `limit` (else task.eval_size) held-out episodes against each of the
    task's evaluation opponents; n > 1 plays each seed n times (sampled)."""
    from echo2.models.env_evaluation import evaluate_episodes

    if n > 1 and temperature == 0:
        raise ValueError("--n > 1 greedy episodes would all be the same; set a --temperature > 0")
    seeds = task.eval_seeds(limit) * n
    report = evaluate_episodes(model, tokenizer, task, max_new_tokens, temperature=temperature, seeds=seeds)
    for result in report["opponents"].values():
        result.pop("rewards")
    return {**report, "samples_per_episode": n}
