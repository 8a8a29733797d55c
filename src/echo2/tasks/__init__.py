"""Task adapters with verifiable rewards (no torch): the registry of tasks, prompt rendering."""

from __future__ import annotations

from echo2.tasks.base import Problem, TaskAdapter, render_prompt
from echo2.tasks.registry import TASKS, TaskConfig, make_task

__all__ = ["TASKS", "Problem", "TaskAdapter", "TaskConfig", "make_task", "render_prompt"]
