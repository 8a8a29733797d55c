"""Task adapter API: a prompt source, an answer checker and a reward function.

Adapters import no torch: the coordinator computes rewards with them (a reward sent by a worker
is never trusted), and new tasks plug in without touching scheduling or training.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


class TaskAdapter(ABC):
    name: str

    @abstractmethod
    def train_problem(self, index: int) -> Problem:
        """The index-th training problem of a deterministic stream (never a held-out one)."""

    @abstractmethod
    def eval_problems(self) -> list[Problem]:
        """The fixed held-out set for greedy accuracy."""

    @abstractmethod
    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Whether a decoded completion (special tokens removed) answers the problem."""

    def reward(self, problem: Problem, completion: str) -> float:
        """Verifiable reward; binary correctness unless an adapter shapes it."""
        return 1.0 if self.is_correct(problem, completion) else 0.0

    def reference_completion(self, problem: Problem) -> str:
        """The completion a supervised warm start imitates."""
        return problem.answer
