"""Held-out evaluation off the learner's path: evaluation leases that workers serve at a version
they hold, scored here like rollouts and never trained on (`[evaluation] where = "workers"`).

Rules, in the order the coordinator applies them to a worker asking for work:
- versions due: 0, every `eval_every`-th, and the last (`final_version`);
- one evaluation runs at a time, on one worker, lease by lease (`problems_per_lease` prompts
  each); that worker holds the evaluated version until the last lease is scored (it is told so
  in every reply), so all of one evaluation's completions come from one version;
- version 0 and the last version are evaluated exactly and before rollouts (the run's "before"
  and "after"), by a worker holding exactly that version;
- any other due version is evaluated only when the worker gets no rollouts (the learner does
  not need it: the window is full, or the worker is idle or behind), at the version the worker
  holds if that is newer: one evaluation settles every due version up to the one it ran at;
- a worker that goes silent or holds a lease past `lease_timeout_s` loses the evaluation; its
  due versions are due again (and a newer worker may take it).

Pure state (no HTTP, no I/O but the store's meta): `CoordinatorState` drives it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from echo2.protocol.messages import EvalTask


@dataclass
class Running:
    eval_id: str
    version: int
    due: list[int]
    """The due versions this evaluation settles (all <= version)."""
    worker_id: str
    started_at: float
    correct: list[bool] = field(default_factory=list)
    lease_id: str = ""
    leased_at: float = 0.0
    gen_s: float = 0.0


@dataclass(frozen=True)
class Finished:
    """An evaluation's result, as it goes to metrics.jsonl (`eval`, role coordinator)."""

    version: int
    due: list[int]
    accuracy: float
    problems: int
    correct: int
    worker_id: str
    gen_s: float
    wall_s: float
    correct_mask: str
    """One character per held-out problem, in order: "1" right, "0" wrong (paired comparisons
    of two versions on the same problems)."""


class Evaluations:
    def __init__(self, *, eval_every: int, final_version: int, problems: int, problems_per_lease: int,
                 max_new_tokens: int, pending: list[int] | None = None, done: dict[int, dict] | None = None) -> None:
        self.eval_every, self.final_version = eval_every, final_version
        self.problems, self.per_lease, self.max_new_tokens = problems, problems_per_lease, max_new_tokens
        self.pending: set[int] = set(pending or [])
        """Due versions not yet settled."""
        self.done: dict[int, dict] = dict(done or {})
        """Due version -> its result (Finished as a dict), for the learner's final question."""
        self.running: Running | None = None

    def is_due(self, version: int) -> bool:
        return version == 0 or version == self.final_version or version % self.eval_every == 0

    def exact(self, version: int) -> bool:
        return version in (0, self.final_version)

    def published(self, version: int) -> bool:
        """A new version: due ones are pending. Returns whether anything changed."""
        if self.is_due(version) and version not in self.done and version not in self.pending:
            self.pending.add(version)
            return True
        return False

    def hold_version(self, worker_id: str) -> int | None:
        running = self.running
        return running.version if running is not None and running.worker_id == worker_id else None

    def offer(self, worker_id: str, worker_version: int, *, spare: bool, now: float,
              prompt_ids) -> EvalTask | None:
        """The next evaluation lease for this worker, or None. `spare`: it gets no rollouts now.
        `prompt_ids(i)`: held-out prompt i as token ids."""
        running = self.running
        if running is None:
            running = self._start(worker_id, worker_version, spare, now)
        if running is None or running.worker_id != worker_id or running.version != worker_version:
            return None
        if not running.lease_id:  # else the same lease again: its reply was lost
            running.lease_id, running.leased_at = f"E{uuid.uuid4().hex[:16]}", now
        start = len(running.correct)
        return EvalTask(lease_id=running.lease_id, version=running.version, max_new_tokens=self.max_new_tokens,
                        prompt_ids=[prompt_ids(i) for i in range(start, min(start + self.per_lease, self.problems))])

    def _start(self, worker_id: str, worker_version: int, spare: bool, now: float) -> Running | None:
        if worker_version < 0:
            return None
        for due in sorted(self.pending):
            if self.exact(due):
                if due == worker_version:
                    return self._run(worker_id, worker_version, [due], now)
            elif spare and due <= worker_version:
                settled = [d for d in sorted(self.pending) if d <= worker_version and not self.exact(d)]
                return self._run(worker_id, worker_version, settled, now)
        return None

    def _run(self, worker_id: str, version: int, due: list[int], now: float) -> Running:
        self.pending -= set(due)
        self.running = Running(f"V{version}-{uuid.uuid4().hex[:8]}", version, due, worker_id, now)
        return self.running

    def moved(self, worker_id: str, worker_version: int) -> Running | None:
        """The worker serving an evaluation now holds another version (restarted, or swapped
        anyway): the evaluation is given up and its due versions are due again."""
        running = self.running
        if running is None or running.worker_id != worker_id or running.version == worker_version:
            return None
        self.running = None
        self.pending |= set(running.due)
        return running

    def lease_of(self, worker_id: str, lease_id: str) -> Running | None:
        running = self.running
        if running is None or running.worker_id != worker_id or running.lease_id != lease_id:
            return None
        return running

    def record(self, running: Running, correct: list[bool], gen_s: float, now: float) -> Finished | None:
        """A lease's completions, scored; the Finished result when it was the last one."""
        running.correct += correct
        running.gen_s += gen_s
        running.lease_id = ""
        if len(running.correct) < self.problems:
            return None
        self.running = None
        right = sum(running.correct)
        result = Finished(version=running.version, due=running.due, accuracy=right / self.problems,
                          problems=self.problems, correct=right, worker_id=running.worker_id, gen_s=running.gen_s,
                          wall_s=now - running.started_at,
                          correct_mask="".join("1" if c else "0" for c in running.correct))
        for due in running.due:
            self.done[due] = result.__dict__
        return result

    def expire(self, alive: set[str], lease_timeout_s: float, now: float) -> Running | None:
        """Give up an evaluation whose worker is gone or whose lease is overdue; its due versions
        are due again. Returns what was given up."""
        running = self.running
        if running is None:
            return None
        overdue = bool(running.lease_id) and now - running.leased_at > lease_timeout_s
        if running.worker_id in alive and not overdue:
            return None
        self.running = None
        self.pending |= set(running.due)
        return running

    def result(self, version: int) -> dict | None:
        return self.done.get(version)
