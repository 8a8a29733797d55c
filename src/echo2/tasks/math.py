"""Math word problems from a Hugging Face dataset or a local JSONL, Parquet or CSV file, loaded
with `datasets.load_dataset` (the path users take with GSM8K or MATH), scored by the final
answer: extracted from `\\boxed{}`, `####` or the last number, and compared with `math-verify`.

Every row is checked when the task is built (a missing field or a malformed row is an error
naming the file, the row and the field, before any process starts). Training rows are served
epoch after epoch, each epoch in a shuffle of the run seed (echo2.tasks.order).
"""

from __future__ import annotations

import json
import random
from functools import cached_property
from pathlib import Path

from echo2.config.task import MathConfig
from echo2.tasks.answers import equivalent, extract_answer, reference_answer
from echo2.tasks.base import Problem, TaskAdapter
from echo2.tasks.order import row_at

_LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class MathTask(TaskAdapter):
    name = "math"
    default_instruction = "Please reason step by step, and put your final answer within \\boxed{}."

    def __init__(self, cfg: MathConfig, seed: int) -> None:
        super().__init__(cfg)
        self.math_cfg, self.seed = cfg, seed

    def check(self) -> None:
        _ = self._split  # loads and validates every row

    @cached_property
    def _split(self) -> tuple[list[Problem], list[Problem]]:
        cfg = self.math_cfg
        train = _load_rows(cfg, cfg.train_split)
        if cfg.eval_split:
            held = _load_rows(cfg, cfg.eval_split, source=cfg.eval_split if _is_file(cfg.eval_split) else cfg.dataset)
        else:
            order = list(range(len(train)))
            random.Random(f"echo2-heldout:{self.seed}").shuffle(order)
            count = max(1, round(len(train) * cfg.eval_fraction))
            if count >= len(train):
                raise ValueError(f"task.eval_fraction={cfg.eval_fraction} of {len(train)} rows leaves none to train on")
            held = [train[i] for i in sorted(order[:count])]
            train = [train[i] for i in sorted(order[count:])]
        return train, held[: cfg.eval_size]

    def train_problem(self, index: int) -> Problem:
        train = self._split[0]
        return train[row_at(index, len(train), self.seed)]

    def eval_problems(self) -> list[Problem]:
        return list(self._split[1])

    def _score(self, problem: Problem, completion: str) -> tuple[bool, bool]:
        answer, how = extract_answer(completion)
        return equivalent(reference_answer(problem.answer), answer), how == "boxed"

    def reward(self, problem: Problem, completion: str) -> float:
        correct, boxed = self._score(problem, completion)
        return float(correct) + (self.math_cfg.format_reward if boxed else 0.0)

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self._score(problem, completion)[0]

    def reference_completion(self, problem: Problem) -> str:
        return f"\\boxed{{{reference_answer(problem.answer)}}}"


def _is_file(source: str) -> bool:
    return Path(source).suffix.lower() in _LOADERS


def _load_rows(cfg: MathConfig, split: str, source: str | None = None) -> list[Problem]:
    """Rows of `split` (or of the file `source`) as problems; ValueError naming the source, the
    row and the field for anything unusable."""
    source = source or cfg.dataset
    rows = _load(cfg, source, split)
    problems = []
    for index, row in enumerate(rows):
        where = f"task.dataset {source!r}, row {index}"
        question = _field(row, cfg.question_field, where, "question_field")
        answer = _field(row, cfg.answer_field, where, "answer_field")
        problems.append(Problem(prompt=question, answer=answer, source_index=index))
    if not problems:
        raise ValueError(f"task.dataset {source!r} (split {split!r}) has no rows")
    return problems


def _field(row: dict, field: str, where: str, setting: str) -> str:
    if field not in row:
        raise ValueError(f"{where}: no field {field!r} (it has {sorted(row)}); set task.{setting} to the right column")
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value).strip():
        raise ValueError(f"{where}: field {field!r} is missing or empty (got {value!r}); expected text or a number")
    return str(value).strip()


def _load(cfg: MathConfig, source: str, split: str):
    from datasets import load_dataset

    path = Path(source)
    if _is_file(source):
        if not path.is_file():
            raise ValueError(f"task.dataset {source!r} does not exist")
        if path.suffix.lower() == ".jsonl":
            _check_jsonl(path)
        try:
            return load_dataset(_LOADERS[path.suffix.lower()], data_files=str(path), split="train")
        except Exception as exc:  # noqa: BLE001  datasets raises many kinds; the user needs the file named
            raise ValueError(f"task.dataset {source!r} could not be read: {exc}") from None
    try:
        return load_dataset(source, cfg.dataset_config or None, split=split)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"task.dataset {source!r} (config {cfg.dataset_config!r}, split {split!r}) could not be "
                         f"loaded: {exc}") from None


def _check_jsonl(path: Path) -> None:
    """Every non-empty line one JSON object: datasets' own error would not say which line."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"task.dataset {str(path)!r}, line {number}: not valid JSON ({exc.msg})") from None
            if not isinstance(value, dict):
                raise ValueError(f"task.dataset {str(path)!r}, line {number}: expected a JSON object, got "
                                 f"{type(value).__name__}")
