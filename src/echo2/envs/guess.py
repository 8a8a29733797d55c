"""Guess the number: the secret is drawn from [1, high] by the seed; each guess is answered
"higher" or "lower" until it is found or the guesses run out. Reward 1 for finding it, 0 for
running out, `illegal_reward` (and the end) for a guess that is not a number in range. The
best policy halves the interval every turn."""

from __future__ import annotations

import random

from echo2.envs.base import Environment, StepResult


class GuessNumberEnv(Environment):
    def __init__(self, high: int, max_guesses: int, illegal_reward: float = -1.0) -> None:
        self.high, self.max_guesses, self.illegal_reward = high, max_guesses, illegal_reward
        # one episode's state, drawn from the seed by reset (0 is never a secret: they start at 1)
        self.secret = 0
        self.low_bound, self.high_bound, self.left = 1, high, max_guesses

    def reset(self, seed: int) -> str:
        self.secret = random.Random(f"echo2-guess:{self.high}:{seed}").randint(1, self.high)
        self.low_bound, self.high_bound, self.left = 1, self.high, self.max_guesses
        return f"Guess my number from 1 to {self.high}. {self.left} guesses left."

    def step(self, action: str) -> StepResult:
        text = action.strip()
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= self.high:
            return StepResult(observation=f"{action[:20]!r} is not a number from 1 to {self.high}. Game over.",
                              reward=self.illegal_reward, done=True, illegal=True)
        guess = int(text)
        self.left -= 1
        if guess == self.secret:
            return StepResult(observation=f"{guess} is right.", reward=1.0, done=True, won=True)
        if self.left == 0:
            return StepResult(observation=f"No guesses left; it was {self.secret}.", reward=0.0, done=True)
        if guess < self.secret:
            self.low_bound = max(self.low_bound, guess + 1)
            return StepResult(observation=f"Higher than {guess}. {self.left} left.", reward=0.0, done=False)
        self.high_bound = min(self.high_bound, guess - 1)
        return StepResult(observation=f"Lower than {guess}. {self.left} left.", reward=0.0, done=False)

    def demo_action(self, rng: random.Random) -> str:
        """A guess consistent with every answer so far (not necessarily the middle one)."""
        return str(rng.randint(self.low_bound, self.high_bound))
