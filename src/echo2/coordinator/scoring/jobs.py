"""What scoring is asked and what it answers, as plain data: a job per completion (a rollout's
reward, or whether an evaluation completion is right), built from a submission; its outcome a
float, `OverBudget` (it ran past the time budget, or its process died: it scores 0) or
`Mismatch` (a multi-turn transcript that does not replay). Jobs are JSON-ready dicts, so the
scoring processes (echo2.coordinator.scoring.pool) get them over a pipe with nothing pickled.

`score_job` is the one place a job becomes a scorer call: the scoring processes run it, and
`InlineScoring` runs it in-process (the state machine's synchronous `submit`, servers built
without a pool in tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from echo2.envs.episode import ReplayMismatch
from echo2.protocol.messages import RolloutCompletion


@dataclass(frozen=True)
class OverBudget:
    """A completion whose scoring was cut off: it scores 0 and counts against its worker."""

    reason: str
    pid: int = 0
    """The scoring process that was killed for it (0: none)."""


@dataclass(frozen=True)
class Mismatch:
    """A multi-turn transcript its seed and its own actions do not reproduce."""

    reason: str


Outcome = float | OverBudget | Mismatch


class Scoring(Protocol):
    """Where the server's submissions are scored: a `ScoringPool`, or `InlineScoring`."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def score(self, jobs: list[dict], give_up_after: int | None = None) -> list[Outcome]:
        """Each job's outcome; once `give_up_after` of them are cut off, the rest may be skipped
        (OverBudget)."""
        ...


def rollout_jobs(prompt_index: int, completions: list[RolloutCompletion]) -> list[dict]:
    return [{"op": "reward", "prompt_index": prompt_index, "token_ids": c.token_ids, "segments": c.segments,
             **({"tool_answers": c.tool_answers} if c.tool_answers else {})} for c in completions]


def eval_jobs(first_index: int, completions: list[list[int]]) -> list[dict]:
    """Held-out problems first_index, first_index + 1, ... (an evaluation lease's prompts)."""
    return [{"op": "eval", "index": first_index + i, "token_ids": ids} for i, ids in enumerate(completions)]


def score_job(scorer, job: dict) -> Outcome:
    """One job's outcome from `scorer` (a Scorer or EpisodeScorer)."""
    if job["op"] == "reward":
        try:
            # tool answers only reach a worker-trusted environment's scorer (scoring.validation)
            answers = {"tool_answers": job["tool_answers"]} if job.get("tool_answers") else {}
            return float(scorer.reward_of(job["prompt_index"], job["token_ids"], job["segments"], **answers))
        except ReplayMismatch as exc:
            return Mismatch(str(exc))
    if job["op"] == "eval":
        return 1.0 if scorer.eval_correct(job["index"], job["token_ids"]) else 0.0
    raise ValueError(f"scoring job op {job['op']!r}: expected 'reward' or 'eval'")


def inline_outcomes(scorer, jobs: list[dict]) -> list[Outcome]:
    """The jobs scored here and now, with no time budget."""
    return [score_job(scorer, job) for job in jobs]


class InlineScoring:
    """Scoring in the coordinator's own process and thread, with no budget: what a server built
    without a pool does (tests). The coordinator itself scores in a `ScoringPool`."""

    def __init__(self, scorer) -> None:
        self.scorer = scorer

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def score(self, jobs: list[dict], give_up_after: int | None = None) -> list[Outcome]:
        return inline_outcomes(self.scorer, jobs)  # nothing is cut off here
