"""In-run held-out evaluation (`[evaluation]`): where it runs and how it is split. How often is
`train.eval_every` (versions 0, every eval_every-th, and the last are due)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from echo2.config.base import Frozen


class EvaluationConfig(Frozen):
    where: Literal["auto", "workers", "learner"] = "auto"
    """"workers": evaluation leases. A worker holding a due version (or a newer one) generates
    greedy completions of the held-out prompts, the coordinator scores them like rollouts and
    records the accuracy under that version; nothing of it is trained on and the learner never
    waits for it. Version 0 and the last version are evaluated exactly (before rollouts); the
    others in capacity the learner does not need, so a due version may be evaluated at a newer
    one, or skipped when evaluations cannot keep up. "learner": the learner evaluates between
    steps (its step loop waits). "auto": workers for single-turn tasks, the learner for
    multi-turn ones (their evaluation plays episodes against opponents)."""
    problems_per_lease: int = Field(50, ge=1, le=10_000)
    """Held-out prompts in one evaluation lease: one worker serves a whole evaluation lease by
    lease, holding its version until the last one; smaller leases keep each request small and
    each generation short."""
    final_wait_s: float = Field(900.0, gt=0)
    """After its last step the learner waits this long for the last version's evaluation (the
    run's "after" accuracy) before it stops without it."""

    def on_workers(self, multi_turn: bool) -> bool:
        if multi_turn and self.where == "workers":
            raise ValueError("evaluation.where='workers' with a multi-turn task: its evaluation plays episodes against "
                             "opponents, which workers do not serve yet; set evaluation.where='auto' or 'learner'")
        return self.where == "workers" or (self.where == "auto" and not multi_turn)
