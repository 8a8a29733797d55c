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


def play(episodes: Sequence[Episode], generate: Generate) -> None:
    """Run every episode to its end."""
    while live := [e for e in episodes if not e.finished]:
        actions = generate([(e.context_ids(), e.action_budget()) for e in live])
        for episode, (token_ids, logprobs) in zip(live, actions, strict=True):
            episode.act(token_ids, logprobs)
