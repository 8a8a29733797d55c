"""Rewards of multi-turn episodes, computed where they can be trusted: the coordinator seeds
every episode, the worker returns the transcript it played (the model's actions with their
behaviour log-probs, the environment's answers in between), and the coordinator replays the
episode from the seed and the decoded actions. The replay's reward is the one that counts, and a
transcript the replay does not reproduce token for token (an environment answer the environment
did not give, an episode cut short or run past its end) refuses the whole submission."""

from __future__ import annotations

from functools import lru_cache

from echo2.config.task import TaskConfig
from echo2.envs.episode import Episode, ReplayMismatch, replay
from echo2.envs.task import EnvTask
from echo2.envs.transcript import Codec, model_vocab_size
from echo2.protocol.messages import RolloutCompletion


class EpisodeScorer:
    def __init__(self, task: EnvTask, model_source: str, max_action_tokens: int) -> None:
        self.task, self.max_action_tokens = task, max_action_tokens
        self.codec = Codec.from_source(model_source, task.cfg)
        self.vocab_size = model_vocab_size(model_source, self.codec.vocab_size)
        self.max_episode_tokens: int | None = task.cfg.max_episode_tokens
        # the first prompt is rendered when a prompt is leased and again when its group is accepted
        self._prompt_ids = lru_cache(maxsize=4096)(self._first_prompt)

    def episode_seed(self, prompt_index: int) -> int:
        return self.task.train_seed(prompt_index)

    def task_config(self) -> TaskConfig:
        return self.task.cfg

    def _episode(self, prompt_index: int) -> Episode:
        return self.task.episode(self.codec, self.episode_seed(prompt_index), self.max_action_tokens)

    def _first_prompt(self, prompt_index: int) -> tuple[int, ...]:
        return tuple(self._episode(prompt_index).prompt_ids)

    def prompt_ids(self, prompt_index: int) -> list[int]:
        return list(self._prompt_ids(prompt_index))

    def rewards(self, prompt_index: int, completions: list[RolloutCompletion]) -> list[float]:
        """Each episode's reward from its replay; ReplayMismatch naming the completion when one
        does not reproduce."""
        rewards = []
        for index, completion in enumerate(completions):
            try:
                rewards.append(self.reward_of(prompt_index, completion.token_ids, completion.segments))
            except ReplayMismatch as exc:
                raise ReplayMismatch(f"rollout.completions[{index}] does not replay: {exc}") from None
        return rewards

    def reward_of(self, prompt_index: int, token_ids: list[int], segments: list[int]) -> float:
        """One episode's reward from its replay; ReplayMismatch when it does not reproduce."""
        return replay(self._episode(prompt_index), token_ids, segments).reward

    def warm(self) -> None:
        """Load what the first replay would (a scoring process does this before it takes work)."""
        self.task.check()
        self._episode(0)
