"""Multi-turn tasks: a config schema and an adapter that builds the task's environment, derives
each episode's seed from the run seed (training episodes by prompt index, held-out episodes from
a stream of their own) and starts episodes under the task's budgets. Registered beside the
single-turn tasks in echo2.tasks.registry, so `[task] name = "poker"` works everywhere."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Literal

from pydantic import Field

from echo2.config.base import MAX_NEW_TOKENS
from echo2.config.task import TaskConfigBase
from echo2.envs.base import Environment
from echo2.envs.episode import Budget, Episode
from echo2.envs.guess import GuessNumberEnv
from echo2.envs.opponents import opponent
from echo2.envs.poker import ACTION_LEGEND, PokerEnv

OpponentName = Literal["random", "calling_station", "equity"]


class EnvTaskConfigBase(TaskConfigBase):
    """What every multi-turn task has. `eval_size` is the number of held-out episodes per
    opponent; `sampling.max_new_tokens` bounds one action."""

    max_turns: int = Field(8, ge=1, le=1000)
    """Actions per episode: an episode still going after this many ends (truncated)."""
    max_episode_tokens: int = Field(256, ge=2, le=MAX_NEW_TOKENS)
    """Transcript tokens after the first prompt (actions and environment answers): an episode
    whose next environment answer would not leave room for an action ends (truncated). With
    the first prompt it must fit the model's context."""


def episode_seed(run_seed: int, stream: str, index: int) -> int:
    """A 48-bit seed per (run seed, stream, index): training and held-out episodes come from
    different streams, and every process derives the same seed for the same episode."""
    digest = hashlib.sha256(f"echo2-episode:{stream}:{run_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


class EnvTask(ABC):
    """The adapter of a multi-turn task (no torch)."""

    name: str
    default_instruction: str = ""
    multi_turn = True

    def __init__(self, cfg: EnvTaskConfigBase, seed: int) -> None:
        self.cfg, self.seed = cfg, seed

    @abstractmethod
    def make_env(self, opponent_name: str | None = None) -> Environment:
        """A fresh environment; `opponent_name` None: the one training episodes are played against."""

    def eval_opponents(self) -> list[str]:
        """Who held-out episodes are played against (a game without opponents: one entry, "-")."""
        return ["-"]

    def training_opponent(self) -> str:
        """Who training episodes are played against (what the in-run evaluation measures)."""
        return "-"

    @property
    def instruction(self) -> str:
        return self.default_instruction if self.cfg.instruction is None else self.cfg.instruction

    def check(self) -> None:
        for name in self.eval_opponents():
            self.make_env(None if name == "-" else name).reset(0)

    def train_seed(self, index: int) -> int:
        return episode_seed(self.seed, "train", index)

    def eval_seeds(self, count: int | None = None) -> list[int]:
        return [episode_seed(self.seed, "eval", i) for i in range(count or self.cfg.eval_size)]

    def budget(self, max_action_tokens: int) -> Budget:
        return Budget(max_turns=self.cfg.max_turns, max_tokens=self.cfg.max_episode_tokens,
                      max_action_tokens=max_action_tokens)

    def episode(self, codec, seed: int, max_action_tokens: int, opponent_name: str | None = None) -> Episode:
        env = self.make_env(None if opponent_name == "-" else opponent_name)
        return Episode(env, codec, seed, self.budget(max_action_tokens), self.instruction)


class PokerConfig(EnvTaskConfigBase):
    name: Literal["poker"] = "poker"
    game: Literal["kuhn", "leduc"] = "kuhn"
    """"kuhn": 3 cards, one betting round, at most one bet. "leduc": 6 cards, a board card after
    the first round, two fixed-limit rounds of up to two bets each."""
    opponent: OpponentName = "random"
    """Who training episodes are played against: "random" (a uniformly random legal action),
    "calling_station" (always checks or calls), "equity" (raises with at least 65% equity
    against a random hand, calls above 40%, else checks or folds)."""
    eval_opponents: list[OpponentName] = Field(default_factory=lambda: ["random", "calling_station", "equity"],
                                               min_length=1)
    """Opponents `echo2 eval` and the learner's in-run evaluation play `eval_size` episodes each
    against (the in-run evaluation: the training opponent only)."""
    illegal_reward: float = Field(-1.0, ge=-10.0, le=0.0)
    """Reward of an action that is not a legal letter (the hand ends there); -1 equals losing a
    whole stack, worse than any legal line of play."""


class PokerTask(EnvTask):
    name = "poker"
    default_instruction = ACTION_LEGEND

    def __init__(self, cfg: PokerConfig, seed: int) -> None:
        super().__init__(cfg, seed)
        self.poker_cfg = cfg

    def make_env(self, opponent_name: str | None = None) -> Environment:
        cfg = self.poker_cfg
        return PokerEnv(cfg.game, opponent(opponent_name or cfg.opponent), cfg.illegal_reward)

    def eval_opponents(self) -> list[str]:
        return list(self.poker_cfg.eval_opponents)

    def training_opponent(self) -> str:
        return self.poker_cfg.opponent


class GuessNumberConfig(EnvTaskConfigBase):
    name: Literal["guess_number"] = "guess_number"
    high: int = Field(16, ge=2, le=1_000_000)
    """The secret is drawn from 1..high."""
    max_guesses: int = Field(6, ge=1, le=1000)
    """Guesses before the game is lost (reward 0)."""
    illegal_reward: float = Field(-1.0, ge=-10.0, le=0.0)
    """Reward of a guess that is not a number from 1 to high (the game ends there)."""


class GuessNumberTask(EnvTask):
    name = "guess_number"
    default_instruction = "Reply with a number."

    def __init__(self, cfg: GuessNumberConfig, seed: int) -> None:
        super().__init__(cfg, seed)
        self.guess_cfg = cfg

    def make_env(self, opponent_name: str | None = None) -> Environment:
        cfg = self.guess_cfg
        return GuessNumberEnv(cfg.high, cfg.max_guesses, cfg.illegal_reward)
