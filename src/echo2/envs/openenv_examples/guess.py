"""Guess the number, as an OpenEnv environment: the secret is drawn from [1, high] by the reset
seed, each guess is answered "Higher"/"Lower" until it is found or the guesses run out. Reward 1
for finding it, 0 otherwise. A guess that is not a whole number is refused by the Action's own
schema (echo2 then ends the episode with task.illegal_reward); one out of range ends the game.

The same game as echo2's native `guess_number` task (echo2.envs.guess), written the way an
OpenEnv user writes one: pydantic Action and Observation, reset(seed) and step(action)."""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(pattern=r"^\s*\d{1,7}\s*$", description="The guess: a whole number")


class GuessObservation(Observation):
    prompt: str = ""


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # all its state is the instance's

    def __init__(self, high: int = 16, max_guesses: int = 6) -> None:
        super().__init__()
        self.high, self.max_guesses = high, max_guesses
        self.secret, self.left = 0, max_guesses
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.secret = random.Random(f"openenv-guess:{self.high}:{seed}").randint(1, self.high)
        self.left = self.max_guesses
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(prompt=f"Guess my number from 1 to {self.high}. {self.left} guesses left.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        guess = int(action.message)
        self.left -= 1
        if not 1 <= guess <= self.high:
            return GuessObservation(prompt=f"{guess} is not from 1 to {self.high}. Game over.", done=True, reward=0.0)
        if guess == self.secret:
            return GuessObservation(prompt=f"{guess} is right.", done=True, reward=1.0)
        if self.left == 0:
            return GuessObservation(prompt=f"No guesses left; it was {self.secret}.", done=True, reward=0.0)
        hint = "Higher" if guess < self.secret else "Lower"
        return GuessObservation(prompt=f"{hint} than {guess}. {self.left} left.", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
