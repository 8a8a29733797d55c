"""Held-out evaluation of a multi-turn task, shared by the learner's in-run evaluation and
`echo2 eval`: the same seeded episodes against each opponent (greedy, or sampled at a
temperature), reporting mean reward with a 95% confidence interval, win rate and how often the
policy broke the rules. Episodes run side by side: one batched generate per turn."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from echo2.envs.episode import Episode
from echo2.envs.play import play
from echo2.envs.task import EnvTask
from echo2.envs.transcript import Codec
from echo2.models.generation import generate_ids

Z_95 = 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its normal-approximation 95% confidence interval."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("inf")
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, Z_95 * math.sqrt(variance / n)


def play_episodes(model, codec: Codec, episodes: list[Episode], *, temperature: float,
                  batch_size: int = 64) -> None:
    was_training = model.training
    model.eval()
    pad = codec.chat.pad_token_id if codec.chat.pad_token_id is not None else codec.eos_id

    def generate(batch: list[tuple[list[int], int]]):
        longest = max(budget for _, budget in batch)
        out = []
        for start in range(0, len(batch), batch_size):
            chunk = batch[start:start + batch_size]
            ids = generate_ids(model, [c for c, _ in chunk], max_new_tokens=longest, temperature=temperature,
                               pad_id=pad, eos_id=codec.eos_id)
            # a row allowed fewer tokens keeps the first ones: sampling is autoregressive, so they
            # are what a call with its own budget would have produced
            out += [(row[:budget], [0.0] * min(len(row), budget)) for row, (_, budget) in zip(ids, chunk, strict=True)]
        return out

    try:
        play(episodes, generate)
    finally:
        model.train(was_training)


def summarise(episodes: list[Episode]) -> dict:
    rewards = [e.reward for e in episodes]
    mean, half_width = mean_ci(rewards)
    n = len(episodes)
    return {"episodes": n, "mean_reward": mean, "ci95": half_width, "win_rate": sum(e.won for e in episodes) / n,
            "illegal_rate": sum(e.illegal for e in episodes) / n,
            "truncated_rate": sum(e.ended in ("turns", "tokens") for e in episodes) / n,
            "mean_turns": sum(e.turns for e in episodes) / n}


def evaluate_episodes(model, tokenizer, task: EnvTask, max_action_tokens: int, *,
                      opponents: Sequence[str] | None = None,
                      episodes: int | None = None, temperature: float = 0.0, batch_size: int = 64,
                      seeds: Sequence[int] | None = None) -> dict:
    """{"opponents": {name: summary}, ...} over the task's held-out seeds (the same seeds for
    every opponent and every model, so before/after comparisons are paired), or over `seeds`."""
    started = time.perf_counter()
    codec = Codec.from_tokenizer(tokenizer, task.cfg)
    seeds = list(seeds) if seeds is not None else task.eval_seeds(episodes)
    report = {}
    for name in opponents or task.eval_opponents():
        played = [task.episode(codec, seed, max_action_tokens, name) for seed in seeds]
        play_episodes(model, codec, played, temperature=temperature, batch_size=batch_size)
        report[name] = {**summarise(played), "rewards": [e.reward for e in played]}
    return {"episodes_per_opponent": len(seeds), "temperature": temperature, "opponents": report,
            "seconds": time.perf_counter() - started}
