"""A scorer for the scoring pool's tests, built inside its processes from a recipe: the
addition task's, except that a completion starting with "#" never finishes scoring (a busy
loop, as sympy computing a tower of powers would be), and one starting with "~" takes
SLOW_CPU_S of this process's CPU time to score."""

from __future__ import annotations

import time

from echo2.config.task import AdditionConfig
from echo2.coordinator.scoring.scorer import Scorer
from echo2.tasks import make_task

HANG = "#"
SLOW = "~"
SLOW_CPU_S = 0.3


class HangingScorer(Scorer):
    def reward_of(self, prompt_index: int, token_ids: list[int], segments: list[int]) -> float:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if text.startswith(HANG):
            while True:  # the whole point: only a kill ends this
                pass
        if text.startswith(SLOW):
            started = time.process_time()
            while time.process_time() - started < SLOW_CPU_S:
                pass
        return super().reward_of(prompt_index, token_ids, segments)


def hanging_scorer(*, model_source: str) -> HangingScorer:
    return HangingScorer(make_task(AdditionConfig(), seed=0), model_source)


def hanging_recipe(model_source: str) -> dict:
    return {"factory": f"{__name__}:hanging_scorer", "kwargs": {"model_source": model_source}}
