"""Play many episodes at once with any generator: every turn, the live episodes' contexts go
to `generate` in one batch and each one's sampled action is applied. Workers pass their engine,
the evaluation the model itself, the warm start a scripted policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from echo2.envs.episode import Episode

Action = tuple[list[int], list[float]]
"""An action's token ids (up to and including the end-of-sequence token) and their log-probs."""
Generate = Callable[[list[tuple[list[int], int]]], list[Action]]
"""(context ids, most tokens of the action) for each live episode -> its action."""
Policy = Callable[[list[int]], list[Action]]
"""The indices (into the episodes played) of the live episodes -> each one's action."""


def play(episodes: Sequence[Episode], generate: Generate) -> None:
    """Run every episode to its end."""
    play_turns(episodes, lambda live: generate([(episodes[i].context_ids(), episodes[i].action_budget())
                                                for i in live]))


def play_turns(episodes: Sequence[Episode], policy: Policy) -> None:
    """Run every episode to its end, telling `policy` which episodes act: a caller that keeps
    something per episode beside the list (a worker: each one's sampler seed and sample index)
    finds it by the index."""
    while live := [i for i, e in enumerate(episodes) if not e.finished]:
        for index, (token_ids, logprobs) in zip(live, policy(live), strict=True):
            episodes[index].act(token_ids, logprobs)
