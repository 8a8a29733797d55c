"""Rewards computed where they can be trusted: the coordinator renders each prompt (the task's
messages through the model's chat template), decodes the completion tokens a worker returned
and scores them with the task adapter. Uses `tokenizers` and transformers' torch-free
PreTrainedTokenizerFast (for the chat template) only."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from pydantic import TypeAdapter

from echo2.config.task import TaskConfig, TaskConfigBase
from echo2.envs.transcript import chat_tokenizer, model_vocab_size, tokenizer_file
from echo2.protocol.messages import RolloutCompletion
from echo2.tasks import make_task
from echo2.tasks.base import Problem, TaskAdapter, render_prompt


class Scorer:
    max_episode_tokens: int | None = None
    """Single-turn: completions are bounded by sampling.max_new_tokens (see EpisodeScorer)."""

    def __init__(self, task: TaskAdapter, model_source: str) -> None:
        from tokenizers import Tokenizer

        self.task, self.model_source = task, model_source
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file(model_source)))
        self.vocab_size = model_vocab_size(model_source, self.tokenizer.get_vocab_size(with_added_tokens=True))
        self.chat = chat_tokenizer(model_source) if task.cfg.chat_template else None

    @cached_property
    def eos_ids(self) -> frozenset[int]:
        """Ids a completion ends with when the model stopped by itself (a worker keeps the EOS it
        stopped at): the tokenizer's EOS and the generation config's, what HF and vLLM stop on."""
        return model_eos_ids(self.model_source, self.tokenizer)

    def problem(self, prompt_index: int) -> Problem:
        return self.task.train_problem(prompt_index)

    def prompt_ids(self, prompt_index: int) -> list[int]:
        text = render_prompt(self.chat, self.task, self.problem(prompt_index))
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def episode_seed(self, prompt_index: int) -> int | None:
        return None

    def task_config(self) -> TaskConfig | None:
        """What a worker needs of the task beyond each lease's prompt: nothing."""
        return None

    def rewards(self, prompt_index: int, completions: list[RolloutCompletion]) -> list[float]:
        return [self.reward_of(prompt_index, c.token_ids, c.segments) for c in completions]

    def reward_of(self, prompt_index: int, token_ids: list[int], segments: list[int]) -> float:
        """One completion's reward (`segments`: none, single-turn)."""
        return self.task.reward(self.problem(prompt_index), self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def warm(self) -> None:
        """Load what the first reward would (the task's data, the grader's imports): a scoring
        process does this before it takes work, so no completion's budget pays for it."""
        self.task.check()
        self.task.reward(self.problem(0), "\\boxed{\\frac{1}{2}} 1/2")

    # ---- held-out evaluation (evaluation leases) ----
    @cached_property
    def eval_problems(self) -> list[Problem]:
        return self.task.eval_problems()

    def eval_prompt_ids(self, index: int) -> list[int]:
        """The held-out prompt as workers see every prompt (the task's messages, chat template)."""
        text = render_prompt(self.chat, self.task, self.eval_problems[index])
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def eval_correct(self, index: int, token_ids: list[int]) -> bool:
        """The check `echo2 eval` makes (task.is_correct on the decoded completion)."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return self.task.is_correct(self.eval_problems[index], text)


def model_eos_ids(model_source: str, tokenizer) -> frozenset[int]:
    """EOS ids named by the model's tokenizer_config.json (`eos_token`) and generation_config.json
    (`eos_token_id`, one or a list), read as JSON: no transformers import for two fields."""
    ids: set[int] = set()
    token = _model_json(model_source, "tokenizer_config.json").get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
        ids.add(tokenizer.token_to_id(token))
    found = _model_json(model_source, "generation_config.json").get("eos_token_id")
    ids.update(found if isinstance(found, list) else [] if found is None else [found])
    return frozenset(int(i) for i in ids)


def _model_json(model_source: str, name: str) -> dict:
    local = Path(model_source)
    if local.is_dir():
        path = local / name
        return json.loads(path.read_text()) if path.is_file() else {}
    from huggingface_hub import hf_hub_download  # a hub id: the file its workers load
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return json.loads(Path(hf_hub_download(model_source, name)).read_text())
    except EntryNotFoundError:
        return {}


def make_scorer(task, model_source: str, max_action_tokens: int):
    """The coordinator's scorer for `task`: decoded completions scored by a task adapter, or
    multi-turn episodes replayed in their environment (echo2's own, or a verifiers one)."""
    if task.kind == "episode":
        from echo2.coordinator.scoring.replay import EpisodeScorer

        return EpisodeScorer(task, model_source, max_action_tokens)
    if task.kind == "agent":
        from echo2.coordinator.scoring.agent_replay import AgentScorer

        return AgentScorer(task, model_source, max_action_tokens)
    return Scorer(task, model_source)


def scorer_recipe(task_cfg: TaskConfigBase, seed: int, model_source: str, max_action_tokens: int) -> dict:
    """How a scoring process builds the coordinator's scorer itself (echo2.coordinator.scoring.child):
    plain JSON, nothing pickled; the process calls `factory` with `kwargs`."""
    return {"factory": f"{__name__}:scorer_from_recipe",
            "kwargs": {"task": task_cfg.model_dump(mode="json"), "seed": seed, "model_source": model_source,
                       "max_action_tokens": max_action_tokens}}


def scorer_from_recipe(*, task: dict, seed: int, model_source: str, max_action_tokens: int):
    """The scorer `scorer_recipe` describes, its task's data loaded."""
    adapter = make_task(TypeAdapter(TaskConfig).validate_python(task), seed)
    adapter.check()
    return make_scorer(adapter, model_source, max_action_tokens)
