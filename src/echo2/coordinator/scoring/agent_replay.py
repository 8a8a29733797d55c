"""Rewards of verifiers episodes (task kind "agent"), computed where they can be trusted: the
coordinator names the task of each lease, the worker returns the transcript it played (its
completions with their behaviour log-probs, the environment's segments between them), and the
coordinator plays the task again with those completions (echo2.envs.verifiers_play's replay):
its own renderer, its own tool calls, and the environment's own reward functions. The replay's
reward is the one that counts; a transcript the replay does not reproduce token for token (a
tool result the tool did not give, an episode cut short or run past its end) refuses the whole
submission, as for echo2's own environments (coordinator.scoring.replay)."""

from __future__ import annotations

from echo2.config.task import VerifiersConfig
from echo2.envs.transcript import chat_tokenizer, model_vocab_size
from echo2.envs.verifiers_play import PlayedEpisode
from echo2.envs.verifiers_task import VerifiersTask
from echo2.protocol.messages import RolloutCompletion


class AgentScorer:
    def __init__(self, task: VerifiersTask, model_source: str, max_action_tokens: int) -> None:
        self.task, self.max_action_tokens = task, max_action_tokens
        tokenizer = chat_tokenizer(model_source)
        self.vocab_size = model_vocab_size(model_source, len(tokenizer))
        self.max_episode_tokens: int | None = task.cfg.max_episode_tokens
        # one turn server and agent for the process's life (a daemon thread: it ends with it)
        self.episodes = task.episodes(model_source, max_action_tokens).__enter__()
        # the first dry run imports and starts what every later one reuses (seconds): here, before
        # the coordinator serves, not on its event loop at the first lease. Each later prompt is
        # one dry run to the first model call (about 50 ms), remembered.
        self.prompt_ids(0)

    def episode_seed(self, prompt_index: int) -> int:
        """What a lease tells its worker: the index of the task in the taskset."""
        return self.task.train_index(prompt_index)

    def task_config(self) -> VerifiersConfig:
        return self.task.cfg

    def prompt_ids(self, prompt_index: int) -> list[int]:
        return self.episodes.first_prompt(self.task.train_index(prompt_index))

    def rewards(self, prompt_index: int, completions: list[RolloutCompletion]) -> list[float]:
        return [self.reward_of(prompt_index, c.token_ids, c.segments) for c in completions]

    def reward_of(self, prompt_index: int, token_ids: list[int], segments: list[int]) -> float:
        """One episode's reward from its replay; ReplayMismatch when it does not reproduce."""
        submitted = PlayedEpisode(prompt_ids=self.prompt_ids(prompt_index), token_ids=list(token_ids),
                                  logprobs=[0.0] * len(token_ids), segments=list(segments))
        return self.episodes.replay(self.task.train_index(prompt_index), [submitted])[0]

    def warm(self) -> None:
        """Load what the first replay would (the environment, its renderer, its tools)."""
        self.task.check()
        self.prompt_ids(0)
