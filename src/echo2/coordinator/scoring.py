"""Rewards computed where they can be trusted: the coordinator renders each prompt (the task's
messages through the model's chat template), decodes the completion tokens a worker returned
and scores them with the task adapter. Uses `tokenizers` and transformers' torch-free
PreTrainedTokenizerFast (for the chat template) only."""

from __future__ import annotations

import json
from pathlib import Path

from echo2.tasks.base import Problem, TaskAdapter, render_prompt


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


def _chat_tokenizer(model_source: str):
    """The model's tokenizer as transformers loads it, for its chat template (the class imports
    no torch, unlike AutoTokenizer)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(model_source)


class Scorer:
    def __init__(self, task: TaskAdapter, model_source: str) -> None:
        from tokenizers import Tokenizer

        self.task = task
        self.tokenizer = Tokenizer.from_file(str(_tokenizer_file(model_source)))
        self.vocab_size = _vocab_size(model_source, self.tokenizer.get_vocab_size(with_added_tokens=True))
        self.chat = _chat_tokenizer(model_source) if task.cfg.chat_template else None

    def problem(self, prompt_index: int) -> Problem:
        return self.task.train_problem(prompt_index)

    def prompt_ids(self, prompt_index: int) -> list[int]:
        text = render_prompt(self.chat, self.task, self.problem(prompt_index))
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def rewards(self, prompt_index: int, completions: list[list[int]]) -> list[float]:
        problem = self.problem(prompt_index)
        return [
            self.task.reward(problem, self.tokenizer.decode(ids, skip_special_tokens=True)) for ids in completions
        ]
