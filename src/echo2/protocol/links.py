"""The seams between each role and the coordinator, as `typing.Protocol`s: what the learner's
train loop needs from its link (`LearnerLink`; real: echo2.learner.io.LearnerIO) and what the
rollout worker needs from its link (`WorkerLink`; real: echo2.rollout.link.CoordinatorLink).

Tests stand hand-written fakes in at these seams (tests/unit/learner_fakes.py); a fake that
drifted from the real link would pass tests the real one fails. tests/unit/test_links.py
therefore checks every fake and every real link against its Protocol signature by signature
(names, kinds, defaults, annotations), not just by name as `isinstance` with
`runtime_checkable` would.

Typing only: at import this module runs nothing beyond `typing`. The wire types, the signing
key and the HTTP session are named under TYPE_CHECKING, so `protocol` stays free of aiohttp,
cryptography and torch (tests/unit/test_dependency_rule.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import mmap

    import aiohttp
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from pydantic import BaseModel

    from echo2.protocol.http import TransientError
    from echo2.protocol.learner_api import GroupAudit
    from echo2.protocol.manifest import AdapterSpec
    from echo2.protocol.messages import EvaluationResult, TrainGroup, VersionInfo


class LearnerLink(Protocol):
    """The seam between the learner's train loop (echo2.learner.train.Learner) and the network:
    publishing versions (the broadcast origin plus the coordinator's announcement) and the
    coordinator's learner API (batches, rejected batches, audit verdicts, evaluations).
    Blocking calls: the real link runs its own I/O thread; a fake answers from memory."""

    key: Ed25519PrivateKey
    """The learner's signing key: versions are signed with it, and the rollout audit's choice of
    groups to recompute is keyed on it (a worker cannot predict which are checked)."""
    last_encode_s: float
    """Seconds the last publish spent building its delta (0 for a full version)."""

    def start(self) -> None:
        """Open the link before the first publish."""

    def close(self) -> None:
        """Close the link; the train loop calls it on the way out, also after an error."""

    def publish(self, version: int, payload: bytes | mmap.mmap, *, adapter: AdapterSpec | None = None) -> VersionInfo:
        """Serve `payload` as `version` and announce it; `adapter`: it holds LoRA adapters only."""

    def origin_bytes_sent(self, version: int) -> int:
        """Learner uplink bytes spent on `version` so far."""

    def fetch_batch(self, step: int, *, wait_s: float, step_time_s: float | None = None,
                    durable_step: int | None = None) -> list[TrainGroup]:
        """Groups for `step`, long-polling up to `wait_s`; empty when none were ready in time."""

    def reject_batch(self, step: int, reason: str, requeue_lease_ids: tuple[str, ...] = ()) -> None:
        """Hand back the batch of a skipped step; `requeue_lease_ids` go back to the buffer."""

    def report_audit(self, step: int, verdicts: list[GroupAudit]) -> None:
        """The rollout audit's verdicts on this step's groups."""

    def evaluation_result(self, version: int, *, wait_s: float) -> EvaluationResult:
        """A version's evaluation on a worker, waiting up to `wait_s` for it."""


class WorkerLink(Protocol):
    """The seam between the rollout worker (echo2.rollout.worker.Worker) and the coordinator:
    one call, a call retried through transient failures, and the verdict on a failed call
    (give up, or log and go on). Refusals (echo2.protocol.http.RefusedError) propagate."""

    session: aiohttp.ClientSession | None
    """The worker's HTTP session, set once it opens; the worker swaps its bearer credential in
    after registering."""

    async def once(self, method: str, path: str, body: BaseModel | None, *, timeout_s: float,
                   token: str | None = None) -> str:
        """One call and its answer's text; failures propagate. `token`: this call's bearer."""

    async def retrying(self, method: str, path: str, body: BaseModel | None, *, token: str | None = None) -> str:
        """A call retried through transient failures until the worker stops (Stopping) or the
        coordinator has been silent too long (WorkerFailed), both from echo2.rollout."""

    def check_reachable(self, exc: TransientError, *, next_try_s: float) -> None:
        """Log a failed call, or raise WorkerFailed once the coordinator has been silent too long."""
