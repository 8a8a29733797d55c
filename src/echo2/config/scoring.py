"""The coordinator's scoring (`[coordinator.scoring]`): rewards are computed in a small pool of
processes off its event loop (echo2.coordinator.scoring.pool), each completion within a time
budget, and a worker whose completions keep running over it is refused for a while
(echo2.coordinator.scoring.limits)."""

from __future__ import annotations

from pydantic import Field

from echo2.config.base import Frozen


class ScoringConfig(Frozen):
    timeout_s: float = Field(2.0, gt=0, le=600)
    """Time scoring one completion may take (a rollout's reward, or an evaluation completion's
    check); past it its process is killed and replaced, the completion scores 0 and counts
    against its worker. Honest answers take milliseconds; math-verify's own timeouts are 2 s."""
    processes: int = Field(2, ge=1, le=64)
    """Scoring processes (each holds the tokenizer and the task's data); a group's completions
    are scored in parallel across them."""
    strikes: int = Field(4, ge=1, le=10_000)
    strike_window_s: float = Field(60.0, gt=0)
    """A worker with `strikes` completions over `timeout_s` within the last `strike_window_s`
    seconds has its rollout and evaluation submissions refused (429) until the oldest of them
    is that old; a submission stops being scored once it has used up its worker's strikes."""
