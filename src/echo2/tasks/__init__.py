"""Task adapters with verifiable rewards (no torch): the registry of tasks, prompt rendering (the
tasks' config schemas are echo2.config.task's)."""

from __future__ import annotations

from echo2.tasks.base import Problem, Task, TaskAdapter, render_prompt
from echo2.tasks.registry import TASKS, make_task

__all__ = ["TASKS", "Problem", "Task", "TaskAdapter", "make_task", "render_prompt"]
