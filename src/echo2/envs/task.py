"""Multi-turn tasks: an adapter that builds the task's environment, derives
each episode's seed from the run seed (training episodes by prompt index, held-out episodes from
a stream of their own) and starts episodes under the task's budgets (the schemas are
echo2.config.task's). Registered beside the single-turn tasks in echo2.tasks.registry, so
`[task] name = "poker"` works everywhere."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Literal

from echo2.config.task import EnvTaskConfigBase, GuessNumberConfig, PokerConfig
from echo2.envs.base import Environment
from echo2.envs.episode import Budget, Episode
from echo2.envs.guess import GuessNumberEnv
from echo2.envs.opponents import opponent
from echo2.envs.poker import ACTION_LEGEND, PokerEnv


def episode_seed(run_seed: int, stream: str, index: int) -> int:
    """A 48-bit seed per (run seed, stream, index): training and held-out episodes come from
    different streams, and every process derives the same seed for the same episode."""
    digest = hashlib.sha256(f"echo2-episode:{stream}:{run_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


class EnvTask(ABC):
    """The adapter of a multi-turn task (no torch): an echo2.tasks.base `Task` of kind "episode"
    (a protocol, so this package need not import echo2.tasks, which imports it)."""

    kind: Literal["episode"] = "episode"
    name: str
    default_instruction: str = ""

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


class GuessNumberTask(EnvTask):
    name = "guess_number"
    default_instruction = "Reply with a number."

    def __init__(self, cfg: GuessNumberConfig, seed: int) -> None:
        super().__init__(cfg, seed)
        self.guess_cfg = cfg

    def make_env(self, opponent_name: str | None = None) -> Environment:
        cfg = self.guess_cfg
        return GuessNumberEnv(cfg.high, cfg.max_guesses, cfg.illegal_reward)
