"""Task adapter API: a prompt source, an answer checker and a reward function, plus how a
problem becomes prompt text.

Adapters import no torch: the coordinator computes rewards with them (a reward sent by a worker
is never trusted), and new tasks plug in without touching scheduling or training. Adding a task
is one module defining its adapter, its config schema in `echo2.config.task`, and one entry in
`echo2.tasks.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from echo2.config.task import TaskConfigBase
from echo2.envs.chat import first_messages, render_messages

TaskKind = Literal["single", "episode", "agent"]
""""single": one prompt, one completion, one reward (a `TaskAdapter`). "episode": turns in an
environment, rewarded at the end (an echo2.envs.task `EnvTask`). "agent": an environment's own
agent program, its model calls answered turn by turn (echo2.envs.verifiers_task `VerifiersTask`)."""


@runtime_checkable
class Task(Protocol):
    """What every task is, whichever its kind; `kind` says which of the two interfaces it has
    beyond this (callers branch on it, not on the class)."""

    kind: TaskKind
    name: str
    cfg: TaskConfigBase

    @property
    def instruction(self) -> str: ...

    def check(self) -> None:
        """Load and validate the task's data now: a bad file or field is an error before any
        process starts."""


@dataclass(frozen=True)
class Problem:
    prompt: str
    """The question as the task states it (before the instruction and the chat template)."""
    answer: str
    """The reference answer (what a correct completion must be equivalent to)."""
    source_index: int = -1
    """Where the problem came from in its dataset (-1: generated), for adapters that score with
    more than the answer."""
    held_out: bool = False
    """From the held-out set (then `source_index` counts in that set)."""


class TaskAdapter(ABC):
    """The adapter of a single-turn task (a `Task` of kind "single")."""

    kind: TaskKind = "single"
    name: str
    default_instruction: str = ""

    def __init__(self, cfg: TaskConfigBase) -> None:
        self.cfg = cfg

    @abstractmethod
    def train_problem(self, index: int) -> Problem:
        """The index-th training problem of a deterministic stream (never a held-out one): the
        same index gives the same problem in every process and after a restart."""

    @abstractmethod
    def eval_problems(self) -> list[Problem]:
        """The fixed held-out set."""

    @abstractmethod
    def reward(self, problem: Problem, completion: str) -> float:
        """Verifiable reward of a decoded completion (special tokens removed)."""

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Whether the completion answers the problem (held-out accuracy, pass@k)."""
        return self.reward(problem, completion) >= 1.0

    def reference_completion(self, problem: Problem) -> str:
        """The completion a supervised warm start imitates."""
        return problem.answer

    def check(self) -> None:  # noqa: B027  optional hook, deliberately empty here
        """Load and validate the task's data now: a bad file or field is an error before any
        process starts. Adapters with data override it."""

    @property
    def instruction(self) -> str:
        return self.default_instruction if self.cfg.instruction is None else self.cfg.instruction

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return first_messages(problem.prompt, self.instruction, self.cfg.system_prompt)


def render_prompt(tokenizer, task: TaskAdapter, problem: Problem) -> str:
    """The prompt text a policy sees for a problem of `task` (see `render_messages`)."""
    return render_messages(tokenizer, task.messages(problem), task.cfg)
