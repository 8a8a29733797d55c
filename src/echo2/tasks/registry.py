"""The task registry: a task's name -> its config schema and its adapter. Adding a task is one
module under echo2/tasks (a `TaskAdapter`), its schema in echo2.config.task (a `TaskConfigBase`
subclass whose `name` is a Literal, listed in TASK_SCHEMAS) and one entry in TASKS. The run
config's [task] table is validated against the schema its `name` picks."""

from __future__ import annotations

from echo2.config.task import TASK_SCHEMAS, TaskConfigBase
from echo2.envs.openenv_env import OpenEnvTask
from echo2.envs.task import EnvTask, GuessNumberTask, PokerTask
from echo2.envs.verifiers_task import VerifiersTask
from echo2.tasks.addition import AdditionTask
from echo2.tasks.base import Task, TaskAdapter
from echo2.tasks.math import MathTask
from echo2.tasks.reasoning_gym import ReasoningGymTask

_ADAPTERS: dict[str, type[TaskAdapter] | type[EnvTask] | type[VerifiersTask]] = {
    "addition": AdditionTask,
    "math": MathTask,
    "reasoning_gym": ReasoningGymTask,
    # multi-turn: episodes in an environment (echo2.envs)
    "poker": PokerTask,
    "guess_number": GuessNumberTask,
    # an agent program in an environment users bring (verifiers), played turn by turn
    "verifiers": VerifiersTask,
    # an OpenEnv environment users bring, played turn by turn like poker
    "openenv": OpenEnvTask,
}
if _ADAPTERS.keys() != TASK_SCHEMAS.keys():  # a task with a schema and no adapter, or the reverse
    raise ImportError(f"echo2.tasks.registry: tasks with an adapter {sorted(_ADAPTERS)} and tasks with a schema in "
                      f"echo2.config.task.TASK_SCHEMAS {sorted(TASK_SCHEMAS)} differ")

TASKS: dict[str, tuple[type[TaskConfigBase], type[TaskAdapter] | type[EnvTask] | type[VerifiersTask]]] = {
    name: (TASK_SCHEMAS[name], adapter) for name, adapter in _ADAPTERS.items()
}

def make_task(cfg, seed: int) -> Task:
    """The adapter for a validated task config; data is loaded lazily (call `check()` to load
    and validate it now). Its `kind` says which it is: a `TaskAdapter` ("single"), for a
    multi-turn task an `EnvTask` ("episode"), or for a verifiers environment a `VerifiersTask`
    ("agent")."""
    entry = TASKS.get(cfg.name)
    if entry is None:
        raise ValueError(f"task.name: unknown task {cfg.name!r} (allowed: {sorted(TASKS)})")
    return entry[1](cfg, seed)
