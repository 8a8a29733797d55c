"""The coordinator's side of evaluation leases (`echo2.coordinator.parts.evaluations` holds the rules):
it renders the held-out prompts, checks and scores what workers return with the task (the
check `echo2 eval` makes; on the server's path in the scoring pool, off the event loop), keeps
what is due and what is done in the store across restarts, and phrases the events
metrics.jsonl records."""

from __future__ import annotations

from echo2.coordinator.parts import Parts
from echo2.coordinator.parts.evaluations import Evaluations, Running
from echo2.coordinator.records import events as ev
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.scoring.jobs import Outcome, Scoring, eval_jobs, inline_outcomes
from echo2.protocol.messages import EvalAck, EvalSubmission, EvalTask, EvaluationResult, LeaseResponse

STORE_KEY = "evaluations"


class EvaluationDesk:
    def __init__(self, state: Parts) -> None:
        """The run's due versions (train.eval_every, the last one train.steps), split into
        leases of evaluation.problems_per_lease prompts; its events go to the state's list."""
        cfg, scorer = state.cfg, state.scorer
        self.scorer, self.store, self.limits, self.events = scorer, state.store, state.limits, state.events
        self.registry, self.clock = state.registry, state.clock
        saved = self.store.get_meta(STORE_KEY, {})
        self.board = Evaluations(eval_every=cfg.train.eval_every, final_version=cfg.train.steps,
                                 problems=len(scorer.eval_problems),
                                 problems_per_lease=cfg.evaluation.problems_per_lease,
                                 max_new_tokens=cfg.sampling.max_new_tokens, pending=saved.get("pending"),
                                 done={int(k): v for k, v in saved.get("done", {}).items()})
        self.vocab_size = scorer.vocab_size
        self._prompts: dict[int, list[int]] = {}
        if state.versions.latest is not None:  # a restarted coordinator: what is due since its newest version
            self.published(state.versions.latest.version)

    def _save(self) -> None:
        with self.store.tx():
            self.store.set_meta(STORE_KEY, {"pending": sorted(self.board.pending),
                                            "done": {str(k): v for k, v in self.board.done.items()}})

    def _prompt(self, index: int) -> list[int]:
        if index not in self._prompts:
            self._prompts[index] = self.scorer.eval_prompt_ids(index)
        return self._prompts[index]

    def published(self, version: int) -> None:
        if self.board.published(version):
            self._save()

    def hold_version(self, worker_id: str, worker_version: int) -> int | None:
        """The version this worker must keep for the evaluation it serves (None: none); one
        that moved to another version has lost it."""
        lost = self.board.moved(worker_id, worker_version)
        if lost is not None:
            self._save()
            self.events.append(ev.EvaluationAbandoned(version=lost.version, due=lost.due, worker_id=worker_id,
                                                      scored=len(lost.correct),
                                                      reason=f"the worker moved to version {worker_version}"))
        return self.board.hold_version(worker_id)

    def offer(self, worker_id: str, worker_version: int, spare: bool, now: float) -> EvalTask | None:
        started = self.board.running
        task = self.board.offer(worker_id, worker_version, spare=spare, now=now, prompt_ids=self._prompt)
        running = self.board.running
        if running is not None and running is not started:
            self._save()
            self.events.append(ev.EvaluationStarted(version=running.version, due=running.due, worker_id=worker_id,
                                                    problems=self.board.problems))
        return task

    def first_reply(self, worker_id: str, version: int, now: float) -> LeaseResponse | None:
        """The lease reply evaluations take before rollouts: a worker holding a version for its
        evaluation gets only that evaluation's leases (or a refusal), then the run's exact
        evaluations (versions 0 and last) go first; None: rollouts may be leased."""
        held = self.hold_version(worker_id, version)
        if held is not None:
            return self.spare_reply(worker_id, version, now) or LeaseResponse(
                tasks=[], retry_after_s=1.0,
                reason=f"holding version {held} for its evaluation: load it again or wait for the evaluation to move",
                refusal="evaluation_hold")
        return self._reply(self.offer(worker_id, version, False, now))

    def spare_reply(self, worker_id: str, version: int, now: float) -> LeaseResponse | None:
        """A due evaluation for a worker that gets no rollouts (None: none is due)."""
        return self._reply(self.offer(worker_id, version, True, now))

    @staticmethod
    def _reply(task: EvalTask | None) -> LeaseResponse | None:
        if task is None:
            return None
        return LeaseResponse(tasks=[], evaluation=task, hold_version=task.version)

    def submit(self, req: EvalSubmission) -> EvalAck:
        """A worker's greedy completions for its evaluation lease, scored here and now (tests;
        the server scores off its event loop, `submit_scored`)."""
        running, start = self.check(req)
        outcomes = inline_outcomes(self.scorer, eval_jobs(start, req.completions))
        return self.apply(req, running, start, outcomes, now=self.clock())

    async def submit_scored(self, req: EvalSubmission, scoring: Scoring) -> EvalAck:
        """The server's path: checked, scored by `scoring` (the pool) off the event loop, applied."""
        running, start = self.check(req)
        with self.limits.scoring(req.worker_id):
            outcomes = await scoring.score(eval_jobs(start, req.completions),
                                           give_up_after=self.limits.strikes_left(req.worker_id))
        return self.apply(req, running, start, outcomes, now=self.clock())

    def check(self, req: EvalSubmission) -> tuple[Running, int]:
        """The evaluation this submission answers and the index of its first problem; refused
        (RequestError) having changed nothing when the lease is not the worker's (409), the
        completions do not fit it (422) or the scoring limits say no (429)."""
        self.registry.live(req.worker_id)
        running = self.board.lease_of(req.worker_id, req.lease_id)
        if running is None:
            raise RequestError(409, self._not_held(req))
        problem = self._check(req, running)
        if problem:
            raise RequestError(422, problem)
        self.limits.admit(req.worker_id)
        return running, len(running.correct)

    def apply(self, req: EvalSubmission, running: Running, start: int, outcomes: list[Outcome], *,
              now: float) -> EvalAck:
        """A checked submission's scores, recorded (a completion cut off over its budget is wrong
        and counts against the worker). The lease is checked again: it may have expired while
        the completions were scored (409, nothing recorded)."""
        correct = [value >= 1.0 for value in self.limits.values(req.worker_id, "evaluation", req.lease_id, outcomes)]
        if self.board.lease_of(req.worker_id, req.lease_id) is not running or len(running.correct) != start:
            raise RequestError(409, self._not_held(req))
        finished = self.board.record(running, correct, req.gen_time_s, now)
        if finished is not None:
            self._save()
            self.events.append(ev.EvaluationDone(step=finished.version, **finished.__dict__, eval_s=finished.gen_s))
        return EvalAck(accepted=True, done=finished is not None)

    @staticmethod
    def _not_held(req: EvalSubmission) -> str:
        return f"evaluation lease {req.lease_id!r} is not held by {req.worker_id!r} (expired or never leased)"

    def _check(self, req: EvalSubmission, running: Running) -> str:
        expected = min(self.board.per_lease, self.board.problems - len(running.correct))
        if req.version != running.version:
            return f"evaluation.version={req.version}; this evaluation is of version {running.version}"
        if len(req.completions) != expected:
            return f"evaluation.completions has {len(req.completions)} entries; the lease has {expected} prompts"
        limit = self.board.max_new_tokens
        for i, ids in enumerate(req.completions):
            if len(ids) > limit:
                return f"evaluation.completions[{i}] has {len(ids)} tokens; at most {limit} (sampling.max_new_tokens)"
            if any(not 0 <= t < self.vocab_size for t in ids):
                return f"evaluation.completions[{i}] has a token id outside the vocabulary (0..{self.vocab_size - 1})"
        return ""

    def sweep(self, alive_versions: dict[str, int], lease_timeout_s: float, now: float) -> None:
        """Give up an evaluation whose worker is gone or stalled, and exact versions no live
        worker holds any more (nothing will ever evaluate them)."""
        lost = self.board.expire(set(alive_versions), lease_timeout_s, now)
        if lost is not None:
            self.events.append(ev.EvaluationAbandoned(version=lost.version, due=lost.due, worker_id=lost.worker_id,
                                                      scored=len(lost.correct)))
        unreachable = [d for d in self.board.pending if self.board.exact(d) and d != self.board.final_version
                       and alive_versions and min(alive_versions.values()) > d]
        for due in unreachable:
            self.board.pending.discard(due)
            self.events.append(ev.EvaluationSkipped(version=due, reason="no live worker holds it any more"))
        if lost is not None or unreachable:
            self._save()

    def result(self, version: int) -> EvaluationResult:
        done = self.board.result(version)
        if done is None:
            return EvaluationResult(version=version, done=False)
        return EvaluationResult(version=version, done=True, accuracy=done["accuracy"], problems=done["problems"],
                                evaluated_version=done["version"])

    def snapshot(self) -> dict:
        running = self.board.running
        return {"pending": sorted(self.board.pending), "done": sorted(self.board.done),
                "running": None if running is None else {"version": running.version, "worker_id": running.worker_id,
                                                         "scored": len(running.correct)}}
