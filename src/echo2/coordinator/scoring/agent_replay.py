"""Rewards of verifiers episodes (task kind "agent"), computed where they can be trusted: the
coordinator names the task of each lease, the worker returns the transcript it played (its
completions with their behaviour log-probs, the environment's segments between them), and the
coordinator plays the task again with those completions (echo2.envs.verifiers_play's replay):
its own renderer, its own tool calls (a worker-trusted environment's: the answers the worker
recorded, task.trust), and the environment's own reward functions. The replay's reward is the
one that counts; a transcript the replay does not reproduce token for token (a
tool result the tool did not give, an episode cut short or run past its end) refuses the whole
submission, as for echo2's own environments (coordinator.scoring.replay)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence

from echo2.config.task import VerifiersConfig
from echo2.envs.transcript import chat_tokenizer, model_vocab_size
from echo2.envs.verifiers_play import PlayedEpisode
from echo2.envs.verifiers_task import VerifiersTask
from echo2.protocol.messages import RolloutCompletion

log = logging.getLogger("echo2.coordinator")

PROMPTS_AHEAD = 64
"""First prompts rendered on a thread ahead of the newest one a lease asked for: each is a dry
run of the episode to its first model call (about 50 ms), which the event loop would otherwise
wait on, lease after lease."""


class AgentScorer:
    def __init__(self, task: VerifiersTask, model_source: str, max_action_tokens: int) -> None:
        self.task, self.max_action_tokens = task, max_action_tokens
        tokenizer = chat_tokenizer(model_source)
        self.vocab_size = model_vocab_size(model_source, len(tokenizer))
        self.max_episode_tokens: int | None = task.cfg.max_episode_tokens
        # one turn server and agent for the process's life (a daemon thread: it ends with it)
        self.episodes = task.episodes(model_source, max_action_tokens).__enter__()
        self._playing = threading.Lock()  # the turn server plays one batch of episodes at a time
        self._wanted: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._ahead_to = 0
        """Prompt indices below this are made, or queued for the render thread."""
        self._rendering: threading.Thread | None = None
        # the first dry run imports and starts what every later one reuses (seconds): here, before
        # the coordinator serves, not on its event loop at the first lease
        self._first_prompt(0)

    def episode_seed(self, prompt_index: int) -> int:
        """What a lease tells its worker: the index of the task in the taskset."""
        return self.task.train_index(prompt_index)

    def task_config(self) -> VerifiersConfig:
        """What workers are told of the task: all but the judges' endpoint, which they never call."""
        return self.task.cfg.model_copy(update={"judge": None})

    def prompt_ids(self, prompt_index: int) -> list[int]:
        """A lease's prompt, made ahead on a thread (PROMPTS_AHEAD); made here if not yet."""
        self._render_ahead(prompt_index)
        return self._first_prompt(prompt_index)

    def rewards(self, prompt_index: int, completions: list[RolloutCompletion]) -> list[float]:
        return [self.reward_of(prompt_index, c.token_ids, c.segments, c.tool_answers) for c in completions]

    def reward_of(self, prompt_index: int, token_ids: list[int], segments: list[int],
                  tool_answers: Sequence[str] = ()) -> float:
        """One episode's reward from its replay; ReplayMismatch when it does not reproduce.
        `tool_answers`: a worker-trusted episode's, given to its tool calls in the replay."""
        submitted = PlayedEpisode(prompt_ids=self._first_prompt(prompt_index), token_ids=list(token_ids),
                                  logprobs=[0.0] * len(token_ids), segments=list(segments),
                                  tool_answers=list(tool_answers))
        with self._playing:
            return self.episodes.replay(self.task.train_index(prompt_index), [submitted])[0]

    def warm(self) -> None:
        """Load what the first replay would (the environment, its renderer, its tools)."""
        self.task.check()
        self._first_prompt(0)

    def _first_prompt(self, prompt_index: int) -> list[int]:
        task_index = self.task.train_index(prompt_index)
        made = self.episodes.known_first_prompt(task_index)
        if made is not None:
            return made
        with self._playing:
            return self.episodes.first_prompt(task_index)

    def _render_ahead(self, prompt_index: int) -> None:
        """Queue the prompts up to PROMPTS_AHEAD past `prompt_index` not yet queued."""
        start, stop = max(self._ahead_to, prompt_index + 1), prompt_index + 1 + PROMPTS_AHEAD
        if start >= stop:
            return
        self._ahead_to = stop
        if self._rendering is None:  # daemon: a dry run in progress never holds the process's exit
            self._rendering = threading.Thread(target=self._render_loop, name="echo2-first-prompts", daemon=True)
            self._rendering.start()
        self._wanted.put((start, stop))

    def _render_loop(self) -> None:
        while True:
            start, stop = self._wanted.get()
            for prompt_index in range(start, stop):
                try:
                    self._first_prompt(prompt_index)
                except Exception as exc:  # the lease that needs it makes it again and reports what fails
                    log.debug("first prompt %d not made ahead: %s", prompt_index, exc)
