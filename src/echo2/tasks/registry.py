"""The task registry: a task's name -> its config schema and its adapter. Adding a task is one
module under echo2/tasks (a `TaskConfigBase` subclass whose `name` is a Literal, and a
`TaskAdapter`) and one entry in TASKS. The run config's [task] table is validated against the
schema its `name` picks."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from echo2.envs.task import EnvTask, GuessNumberConfig, GuessNumberTask, PokerConfig, PokerTask
from echo2.tasks.addition import AdditionConfig, AdditionTask
from echo2.tasks.base import TaskAdapter
from echo2.tasks.math import MathConfig, MathTask
from echo2.tasks.reasoning_gym import ReasoningGymConfig, ReasoningGymTask

TASKS: dict[str, tuple[type, type[TaskAdapter] | type[EnvTask]]] = {
    "addition": (AdditionConfig, AdditionTask),
    "math": (MathConfig, MathTask),
    "reasoning_gym": (ReasoningGymConfig, ReasoningGymTask),
    # multi-turn: episodes in an environment (echo2.envs)
    "poker": (PokerConfig, PokerTask),
    "guess_number": (GuessNumberConfig, GuessNumberTask),
}

TaskConfig = Annotated[Union[tuple(schema for schema, _ in TASKS.values())], Field(discriminator="name")]  # noqa: UP007


def make_task(cfg, seed: int) -> TaskAdapter | EnvTask:
    """The adapter for a validated task config; data is loaded lazily (call `check()` to load
    and validate it now). Multi-turn tasks' adapters are `EnvTask`s (`multi_turn` is True)."""
    entry = TASKS.get(cfg.name)
    if entry is None:
        raise ValueError(f"task.name: unknown task {cfg.name!r} (allowed: {sorted(TASKS)})")
    return entry[1](cfg, seed)
