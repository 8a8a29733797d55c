"""Held-out evaluation of a verifiers environment (task kind "agent"), shared by the base model's
preparation, the learner's in-run evaluation and `echo2 eval`: the held-out tasks played by the
environment's agent loop, every turn's calls answered in one batched generate (greedy, or
sampled at a temperature), each episode rewarded by the environment's own reward functions.
Reported: mean reward with a 95% confidence interval, accuracy (the share rewarded 1 or more),
how often the model called a tool, turns and tokens per episode."""

from __future__ import annotations

import time
from collections.abc import Sequence

from echo2.envs.verifiers_play import Action, GenerationCall
from echo2.envs.verifiers_task import VerifiersTask
from echo2.models.env_evaluation import mean_ci
from echo2.models.generation import generate_ids


def evaluate_agent(model, tokenizer, task: VerifiersTask, max_new_tokens: int, *, tokenizer_source: str,
                   indices: Sequence[int] | None = None, temperature: float = 0.0, batch_size: int = 64) -> dict:
    """`tokenizer_source`: where verifiers' renderer loads the model's tokenizer (its directory)."""
    started = time.perf_counter()
    indices = list(indices) if indices is not None else task.eval_indices()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    was_training = model.training
    model.eval()

    def answer(calls: list[GenerationCall]) -> list[Action]:
        out = []
        for start in range(0, len(calls), batch_size):
            chunk = calls[start:start + batch_size]
            rows = generate_ids(model, [c.prompt_ids for c in chunk], max_new_tokens=max(c.max_tokens for c in chunk),
                                temperature=temperature, pad_id=pad, eos_id=tokenizer.eos_token_id)
            # a call allowed fewer tokens keeps the first ones (generation is autoregressive)
            out += [(row[:c.max_tokens], [0.0] * min(len(row), c.max_tokens))
                    for row, c in zip(rows, chunk, strict=True)]
        return out

    played = []
    try:
        with task.episodes(tokenizer_source, max_new_tokens) as episodes:
            # in waves of one generation batch: played together, every episode's turn would wait
            # for all the others' and count that wait against task.episode_timeout_s
            for start in range(0, len(indices), batch_size):
                played += episodes.play(indices[start:start + batch_size], answer)
    finally:
        model.train(was_training)
    rewards = [e.reward for e in played]
    mean, half_width = mean_ci(rewards)
    n = len(played)
    return {"episodes": n, "mean_reward": mean, "ci95": half_width, "accuracy": sum(r >= 1.0 for r in rewards) / n,
            "tool_call_rate": sum(len(e.segments) > 1 for e in played) / n,
            "mean_turns": sum((len(e.segments) + 1) // 2 for e in played) / n,
            "tokens_per_episode": sum(len(e.token_ids) for e in played) / n,
            "failed": sum(bool(e.errors) for e in played), "rewards": rewards,
            "seconds": time.perf_counter() - started}
