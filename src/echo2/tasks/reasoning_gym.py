"""Procedural reasoning tasks from the `reasoning-gym` package (chain_sum, basic_arithmetic,
sokoban, logic puzzles, ...), by name with the dataset's own config. Problems are generated
offline and deterministically from the run seed; a completion is scored with the dataset's own
`score_answer` (1.0 right, partial credit where the dataset gives it unless
`task.partial_credit = false`), on the text inside `<answer>...</answer>` when the completion
has one, else on the last match of `task.answer_pattern` when one is set, else on the whole
completion."""

from __future__ import annotations

import re
from functools import cached_property, lru_cache
from typing import Any

from echo2.config.task import ReasoningGymConfig
from echo2.tasks.base import Problem, TaskAdapter
from echo2.tasks.order import row_at

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# held-out problems come from a dataset of their own seed, far from any training seed
_EVAL_SEED_OFFSET = 1_000_003


class ReasoningGymTask(TaskAdapter):
    name = "reasoning_gym"

    def __init__(self, cfg: ReasoningGymConfig, seed: int) -> None:
        super().__init__(cfg)
        self.rg_cfg, self.seed = cfg, seed
        # generating an entry is cheap but not free, and the coordinator asks for the same row
        # when it leases the prompt and again when it scores the group
        self._train_entry = lru_cache(maxsize=4096)(self._make_train_entry)

    def check(self) -> None:
        _ = self._train_set, self._eval_entries  # unknown dataset names or settings fail here

    @cached_property
    def _train_set(self):
        return _create(self.rg_cfg.dataset, self.rg_cfg.config, self.seed, self.rg_cfg.size)

    @cached_property
    def _eval_entries(self) -> list[dict]:
        held = _create(self.rg_cfg.dataset, self.rg_cfg.config, self.seed + _EVAL_SEED_OFFSET, self.rg_cfg.eval_size)
        return [held[i] for i in range(len(held))]

    @cached_property
    def _eval_questions(self) -> frozenset[str]:
        return frozenset(e["question"] for e in self._eval_entries)

    def train_problem(self, index: int) -> Problem:
        size = self.rg_cfg.size
        row = row_at(index, size, self.seed)
        # a training problem equal to a held-out one is replaced by the next row that is not
        for step in range(size):
            candidate = (row + step * 7919) % size
            entry = self._train_entry(candidate)
            if entry["question"] not in self._eval_questions:
                return Problem(prompt=entry["question"], answer=str(entry["answer"]), source_index=candidate)
        raise ValueError(f"task: every {self.rg_cfg.dataset} training problem is also held out; raise task.size "
                         "or lower task.eval_size")

    def _make_train_entry(self, row: int) -> dict:
        return self._train_set[row]

    def eval_problems(self) -> list[Problem]:
        return [Problem(prompt=e["question"], answer=str(e["answer"]), source_index=i, held_out=True)
                for i, e in enumerate(self._eval_entries)]

    def reward(self, problem: Problem, completion: str) -> float:
        entries = self._eval_entries if problem.held_out else None
        entry = entries[problem.source_index] if entries is not None else self._train_entry(problem.source_index)
        answer = self._answer(completion)
        if answer is None:
            return 0.0
        try:
            score = float(self._train_set.score_answer(answer=answer, entry=entry))
        except Exception:  # noqa: BLE001  an untrusted completion that breaks a scorer earns nothing
            return 0.0
        score = min(1.0, max(0.0, score))
        return score if self.rg_cfg.partial_credit or score == 1.0 else 0.0


    def _answer(self, completion: str) -> str | None:
        """The text scored: the last `<answer>` tag's, else the pattern's last match (None when
        it has none), else the whole completion."""
        tagged = _ANSWER_TAG.findall(completion)
        if tagged:
            return tagged[-1].strip()
        if not self.rg_cfg.answer_pattern:
            return completion.strip()
        matches = list(self._pattern.finditer(completion))
        if not matches:
            return None
        last = matches[-1]
        return (last.group(1) if self._pattern.groups else last.group(0)).strip()

    @cached_property
    def _pattern(self) -> re.Pattern:
        return re.compile(self.rg_cfg.answer_pattern)


def _create(name: str, config: dict[str, Any], seed: int, size: int):
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **config)
    except Exception as exc:  # noqa: BLE001  unknown dataset or setting: the user's config is wrong
        raise ValueError(f"task.dataset={name!r} with task.config={config!r}: "
                         f"reasoning-gym refused it: {exc}") from None
