"""An episode's transcript and the rules that end it, in one place for everyone who plays one:
the worker (actions sampled by its engine), the coordinator (replaying the actions a worker
returned, to compute the reward itself), the format warm start and the evaluation.

The transcript after the first prompt alternates segments: the model's action (trained, with its
behaviour log-probs), then the environment's answer (masked out of the loss), and so on; it ends
with an action. An episode ends when the environment says so, after `max_turns` actions, or when
the next environment segment plus one action token would pass `max_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from echo2.envs.base import Environment
from echo2.envs.transcript import Codec


class EpisodeError(ValueError):
    """An action the episode cannot take (too long, after its end, end-of-sequence inside)."""


class ReplayMismatch(ValueError):
    """A submitted transcript that the seed and its own actions do not reproduce."""


@dataclass(frozen=True)
class Budget:
    max_turns: int
    """Actions per episode."""
    max_tokens: int
    """Transcript tokens after the first prompt (actions and environment segments)."""
    max_action_tokens: int
    """Tokens of one action (the run's sampling.max_new_tokens)."""


@dataclass
class Episode:
    env: Environment
    codec: Codec
    seed: int
    budget: Budget
    instruction: str = ""
    prompt_ids: list[int] = field(init=False)
    token_ids: list[int] = field(init=False, default_factory=list)
    logprobs: list[float] = field(init=False, default_factory=list)
    """Behaviour log-prob of each action token; 0.0 for environment tokens (never trained)."""
    segments: list[int] = field(init=False, default_factory=list)
    """Lengths of the segments, the model's first, alternating with the environment's."""
    reward: float = field(init=False, default=0.0)
    turns: int = field(init=False, default=0)
    ended: str = field(init=False, default="")
    """Why it ended: "done" (the environment), "turns" or "tokens" (the budget); "" while live."""
    won: bool = field(init=False, default=False)
    illegal: bool = field(init=False, default=False)
    actions: list[str] = field(init=False, default_factory=list)
    token_versions: list[tuple[int, int]] = field(init=False, default_factory=list)
    """Runs of (version, tokens) over `token_ids` when a worker swapped versions while playing
    (`protocol.token_versions`; set by its episode player); empty: one version played it all."""

    def __post_init__(self) -> None:
        self.prompt_ids = self.codec.prompt_ids(self.env.reset(self.seed), self.instruction)

    @property
    def finished(self) -> bool:
        return bool(self.ended)

    def context_ids(self) -> list[int]:
        """What the policy sees before its next action."""
        return self.prompt_ids + self.token_ids

    def action_budget(self) -> int:
        """The most tokens the next action may have."""
        return min(self.budget.max_action_tokens, self.budget.max_tokens - len(self.token_ids))

    def act(self, action_ids: list[int], logprobs: list[float] | None = None) -> None:
        """Take the policy's next action (its token ids, up to and including an end-of-sequence
        token): the environment steps on the decoded text and, unless the episode ends, its
        answer is appended as the next segment."""
        self._check_action(action_ids)
        self._append(action_ids, logprobs if logprobs is not None else [0.0] * len(action_ids))
        action = self.codec.decode_action(action_ids)
        self.actions.append(action)
        result = self.env.step(action)
        self.turns += 1
        self.reward += result.reward
        if result.done:
            self.ended, self.won, self.illegal = "done", result.won, result.illegal
            return
        if self.turns >= self.budget.max_turns:
            self._truncate("turns")
            return
        answer = self.codec.env_ids(result.observation, action_ids)
        if len(self.token_ids) + len(answer) + 1 > self.budget.max_tokens:
            self._truncate("tokens")
            return
        self._append(answer, [0.0] * len(answer))

    def _check_action(self, action_ids: list[int]) -> None:
        if self.finished:
            raise EpisodeError(f"the episode ended after turn {self.turns} ({self.ended}); no more actions")
        if not 1 <= len(action_ids) <= self.action_budget():
            raise EpisodeError(f"an action of {len(action_ids)} tokens; turn {self.turns + 1} allows 1.."
                               f"{self.action_budget()}")
        if self.codec.eos_id in action_ids[:-1]:
            raise EpisodeError(f"turn {self.turns + 1}: the end-of-sequence token inside the action (it ends one)")

    def _append(self, token_ids: list[int], logprobs: list[float]) -> None:
        self.token_ids += token_ids
        self.logprobs += logprobs
        self.segments.append(len(token_ids))

    def _truncate(self, why: str) -> None:
        self.ended = why
        self.reward += self.env.truncated_reward()


def replay(episode: Episode, token_ids: list[int], segments: list[int]) -> Episode:
    """Play a fresh `episode` with the actions of a submitted transcript and check that it
    reproduces the transcript exactly: every environment segment, and the end. Returns the
    episode (its reward is the one that counts); raises ReplayMismatch saying where they part."""
    if not segments or sum(segments) != len(token_ids) or min(segments) < 1:
        raise ReplayMismatch(f"segments {segments[:8]}... must be positive lengths summing to the {len(token_ids)} "
                             "tokens of the transcript")
    start = 0
    for index, length in enumerate(segments):
        piece = token_ids[start:start + length]
        if episode.finished:
            raise ReplayMismatch(f"segment {index}: the episode ended after turn {episode.turns} ({episode.ended}) "
                                 "but the transcript goes on")
        if index % 2 == 0:  # the model's action
            try:
                episode.act(piece)
            except EpisodeError as exc:
                raise ReplayMismatch(f"segment {index}: {exc}") from None
        elif episode.token_ids[start:] != piece:
            raise ReplayMismatch(f"segment {index} (the environment's answer to action {index // 2 + 1}, "
                                 f"{episode.actions[-1]!r}) is not what the environment answers from this seed")
        start += length
    if not episode.finished:
        raise ReplayMismatch(f"the transcript stops after turn {episode.turns}, before the episode ended "
                             f"(turn budget {episode.budget.max_turns}, token budget {episode.budget.max_tokens})")
    return episode
