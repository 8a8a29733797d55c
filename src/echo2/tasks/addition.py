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

    @cached_property
    def _pads_by_first_operand(self) -> list[int]:
        """task.pad_range: the least padding for each value of the first operand, log-uniform."""
        low, high = self.pad_range or (self.pad_tokens, self.pad_tokens)
        rng = random.Random(self.seed * 7919 + _PAD_STREAM)
        return [min(high, round(low * (high / low) ** rng.random())) for _ in range(10**self.digits)]

    def pad_tokens_of(self, problem: Problem) -> int:
        """The least number of dots before this problem's answer (task.pad_tokens, or task.pad_range's
        draw for its first operand)."""
        if self.pad_range is None:
            return self.pad_tokens
        return self._pads_by_first_operand[int(problem.prompt.split("+", 1)[0])]

    def reward(self, problem: Problem, completion: str) -> float:
        """1 for the answer, after at least the problem's padding in dots and nothing else."""
        text, pad = completion.strip(), self.pad_tokens_of(problem)
        if pad == 0:
            return 1.0 if text == problem.answer else 0.0
        padding = text[: len(text) - len(problem.answer)]
        return 1.0 if text.endswith(problem.answer) and len(padding) >= pad and set(padding) <= {"."} else 0.0

    def reference_completion(self, problem: Problem) -> str:
        """The answer after a quarter more dots than the rule asks (the problem's padding): at exactly
        the minimum, any update that shortens the padding by one dot fails every greedy answer."""
        pad = self.pad_tokens_of(problem)
        return "." * (pad + pad // 4) + problem.answer
