"""Multi-digit addition: prompt "37+45=", answer "82". Verifiable and cheap to score; the
embedded demo's task."""

from __future__ import annotations

import random
from functools import cached_property

from echo2.config.task import AdditionConfig
from echo2.tasks.base import Problem, TaskAdapter

# Distinct streams for training and evaluation so held-out problems are drawn independently.
_EVAL_STREAM = 1_000_003
_TRAIN_STREAM = 2_000_003
_PAD_STREAM = 3_000_017


class AdditionTask(TaskAdapter):
    name = "addition"

    def __init__(self, cfg: AdditionConfig, seed: int) -> None:
        super().__init__(cfg)
        self.digits, self.pad_tokens, self.pad_range = cfg.digits, cfg.pad_tokens, cfg.pad_range
        self.eval_size = min(cfg.eval_size, (10**cfg.digits) ** 2 // 2)
        self.seed = seed

    def _problem(self, a: int, b: int) -> Problem:
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b))

    def _draw(self, rng: random.Random) -> tuple[int, int]:
        high = 10**self.digits - 1
        return rng.randint(0, high), rng.randint(0, high)

    @cached_property
    def _eval_pairs(self) -> list[tuple[int, int]]:
        rng = random.Random(self.seed * 7919 + _EVAL_STREAM)
        pairs: dict[tuple[int, int], None] = {}
        while len(pairs) < self.eval_size:
            pairs[self._draw(rng)] = None
        return list(pairs)

    @cached_property
    def _eval_set(self) -> frozenset[tuple[int, int]]:
        return frozenset(self._eval_pairs)

    def eval_problems(self) -> list[Problem]:
        return [self._problem(a, b) for a, b in self._eval_pairs]

    def train_problem(self, index: int) -> Problem:
        # each index seeds its own draw, so problem i is the same whoever asks and in any order
        rng = random.Random((self.seed * 7919 + _TRAIN_STREAM) * 1_000_000_007 + index)
        pair = self._draw(rng)
        while pair in self._eval_set:
            pair = self._draw(rng)
        return self._problem(*pair)

    def trailing_dots_of(self, problem: Problem) -> int:
        """task.pad_range: the dots the warm start writes after this problem's answer, log-uniform
        in [low, high] and drawn once per problem (from the task's seed and the prompt)."""
        low, high = self.pad_range
        draw = random.Random(f"{self.seed * 7919 + _PAD_STREAM}:{problem.prompt}").random()
        return min(high, round(low * (high / low) ** draw))

    def reward(self, problem: Problem, completion: str) -> float:
        """1 for the answer: alone; after at least task.pad_tokens dots and nothing else; or, with
        task.pad_range, first and followed by dots only, any number of them."""
        text = completion.strip()
        if self.pad_range is not None:
            return 1.0 if text.startswith(problem.answer) and set(text[len(problem.answer):]) <= {"."} else 0.0
        if self.pad_tokens == 0:
            return 1.0 if text == problem.answer else 0.0
        padding = text[: len(text) - len(problem.answer)]
        ok = text.endswith(problem.answer) and len(padding) >= self.pad_tokens and set(padding) <= {"."}
        return 1.0 if ok else 0.0

    def reference_completion(self, problem: Problem) -> str:
        """pad_tokens: the answer after a quarter more dots than the rule asks (at exactly the
        minimum, any update that shortens the padding by one dot fails every greedy answer).
        pad_range: the answer, then the problem's drawn dots, so the warm-started policy's lengths
        (where it stops writing dots) follow the draw's long tail."""
        if self.pad_range is not None:
            return problem.answer + "." * self.trailing_dots_of(problem)
        return "." * (self.pad_tokens + self.pad_tokens // 4) + problem.answer
