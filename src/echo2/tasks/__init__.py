"""Task adapters with verifiable rewards (no torch)."""

from __future__ import annotations

from echo2.config.run import TaskConfig
from echo2.tasks.base import Problem, TaskAdapter


def make_task(cfg: TaskConfig, seed: int) -> TaskAdapter:
    if cfg.name == "addition":
        from echo2.tasks.addition import AdditionTask

        return AdditionTask(digits=cfg.digits, eval_size=cfg.eval_size, seed=seed)
    raise ValueError(f"task.name: unknown task {cfg.name!r} (allowed: 'addition')")


__all__ = ["Problem", "TaskAdapter", "make_task"]
