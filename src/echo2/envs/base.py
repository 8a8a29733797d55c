"""The environment interface: `reset(seed)` gives the first observation, `step(action_text)`
gives the next observation, a reward and whether the episode is done.

An environment must be a pure function of its seed and the actions it was given: the
coordinator replays every episode a worker returns from the seed and the decoded actions, and
the reward it computes is the only one that counts. So all randomness (cards, opponents,
secrets) comes from a `random.Random` seeded in `reset`, never from global state or the clock.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class StepResult:
    observation: str
    """What the policy is told next (ignored once `done`: the transcript ends with the action)."""
    reward: float
    """Reward of this step; an episode's reward is the sum over its steps."""
    done: bool
    won: bool = False
    """Set on the last step: the episode counts as a win (`echo2 eval`'s win rate)."""
    illegal: bool = False
    """The action was not a legal one (the episode ends with the environment's penalty)."""


class Environment(ABC):
    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start an episode, everything drawn from `seed`; returns the first observation."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply the policy's action (its decoded text, stripped); never raises on bad text:
        an action that is not legal ends the episode with the environment's penalty."""

    @abstractmethod
    def demo_action(self, rng: random.Random) -> str:
        """A legal action drawn at random: what the format warm start imitates (it teaches the
        action format, not the strategy; RL learns which legal action is good)."""

    def truncated_reward(self) -> float:
        """Added when the turn or token budget ends the episode before the environment did."""
        return 0.0
