"""Rewards computed where they can be trusted: the coordinator decodes the completion tokens a
worker returned and scores them with the task adapter. Uses `tokenizers` directly (no torch)."""

from __future__ import annotations

import json
from pathlib import Path

from echo2.tasks.base import Problem, TaskAdapter


def _tokenizer_file(model_source: str) -> Path:
    local = Path(model_source)
    if local.is_dir():
        return local / "tokenizer.json"
    from huggingface_hub import hf_hub_download  # a hub id: same file users' workers load

    return Path(hf_hub_download(model_source, "tokenizer.json"))


def _vocab_size(model_source: str, tokenizer_size: int) -> int:
    """Model vocabulary (embedding rows) when a config.json is at hand; ids beyond it are invalid."""
    config = Path(model_source) / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("vocab_size", tokenizer_size))
    return tokenizer_size


class Scorer:
    def __init__(self, task: TaskAdapter, model_source: str) -> None:
        from tokenizers import Tokenizer

        self.task = task
        self.tokenizer = Tokenizer.from_file(str(_tokenizer_file(model_source)))
        self.vocab_size = _vocab_size(model_source, self.tokenizer.get_vocab_size(with_added_tokens=True))

    def problem(self, prompt_index: int) -> Problem:
        return self.task.train_problem(prompt_index)

    def prompt_ids(self, prompt_index: int) -> list[int]:
        return self.tokenizer.encode(self.problem(prompt_index).prompt, add_special_tokens=False).ids

    def rewards(self, prompt_index: int, completions: list[list[int]]) -> list[float]:
        problem = self.problem(prompt_index)
        return [
            self.task.reward(problem, self.tokenizer.decode(ids, skip_special_tokens=True)) for ids in completions
        ]
