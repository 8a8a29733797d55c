"""The learner's network side, on one background thread with its own asyncio loop: the
broadcast origin workers pull published versions from (echo2.broadcast), and the client for the
coordinator. The torch training loop calls the blocking wrappers and never touches the loop."""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from echo2.broadcast.origin import LoopThread, Origin
from echo2.broadcast.signing import generate_private_key, load_private_key, public_key_hex, save_private_key
from echo2.config.run import RunConfig
from echo2.protocol import tls
from echo2.protocol.http import TransientError, call
from echo2.protocol.learner_api import (
    AuditReport,
    BatchRequest,
    BatchResponse,
    GroupAudit,
    PublishRequest,
    PublishResponse,
    RejectBatchRequest,
)
from echo2.protocol.manifest import AdapterSpec
from echo2.protocol.messages import EvaluationResult, TrainGroup, VersionInfo

# transient failures (coordinator restarting, connection reset) are retried for this long
# before the learner gives up; long enough to ride out a coordinator restart
RETRY_WINDOW_S = 120.0
KEY_FILE = "keys/learner_ed25519.pem"
log = logging.getLogger("echo2.learner")


def learner_key(cfg: RunConfig) -> Ed25519PrivateKey:
    """The learner's signing key: the configured file, else one kept in the run dir (created on
    first use, owner-readable only) so a restarted learner signs with the same key."""
    path = Path(cfg.broadcast.learner_key_path or cfg.run_path / KEY_FILE)
    if not path.is_file():
        if cfg.broadcast.learner_key_path:
            raise ValueError(f"broadcast.learner_key_path={str(path)!r} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_private_key(generate_private_key(), path)
    return load_private_key(path)


class LearnerIO:
    """The real echo2.protocol.links.LearnerLink: the broadcast origin and the coordinator's
    learner API, on one background I/O thread."""

    def __init__(self, cfg: RunConfig, coordinator_url: str, learner_token: str, join_token: str) -> None:
        """`learner_token` authorizes publishes and batches at the coordinator; `join_token` is
        what workers present when they pull chunks from the learner's origin."""
        self.cfg = cfg
        self.coordinator_url = coordinator_url.rstrip("/")
        self.learner_token, self.join_token = learner_token, join_token
        self.request_timeout_s = cfg.learner.request_timeout_s
        self.key = learner_key(cfg)
        self.io_loop: LoopThread | None = None
        self.last_encode_s = 0.0
        """Seconds the last publish spent building its delta (0 for a full version)."""
        # made on the I/O loop by `start` (aiohttp objects belong to the loop that runs them)
        self.session: aiohttp.ClientSession | None = None
        self.origin: Origin | None = None
        self.origin_url = ""

    # ---- lifecycle ----
    def start(self) -> None:
        self.io_loop = LoopThread("learner-io")
        self._call(self._setup(), timeout_s=30)

    def close(self) -> None:
        if self.io_loop is not None:
            self._call(self._teardown(), timeout_s=30)
            self.io_loop.close(timeout_s=10)
            self.io_loop = None

    def _call(self, coro: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        assert self.io_loop is not None, "LearnerIO.start() first"
        return self.io_loop.call(coro, timeout_s)

    async def _setup(self) -> None:
        tls.warn_plain_url(self.coordinator_url, "the coordinator")
        self.session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.learner_token}"},
                                             connector=tls.connector(self.cfg.tls))
        lc = self.cfg.learner
        context = tls.server_context(self.cfg.tls)
        self.origin = Origin(self.key, self.cfg.broadcast, auth_token=self.join_token, host=lc.host, port=lc.port,
                             ssl_context=context)
        await self.origin.start()
        self.origin_url = tls.base_url(lc.advertise_host or lc.host, self.origin.relay.port, tls=context is not None)

    async def _teardown(self) -> None:
        await self.session.close()
        await self.origin.stop()

    # ---- publishing ----
    def publish(self, version: int, payload: bytes | mmap.mmap, *, adapter: AdapterSpec | None = None) -> VersionInfo:
        """Encode `version` in its forms (a delta against the previous version, a full anchor,
        or both: broadcast.deltas), sign each (hashing here, in the training thread), serve them
        from the origin and announce them to the coordinator. The origin serves `payload`
        itself (no copy); a delta is built next to it. `adapter`: the payload holds LoRA
        adapters only (grpo.lora)."""
        forms = self.origin.prepare_version(version, payload, adapter=adapter)
        for signed, form in forms:
            self._call(_run(self.origin.install, signed, form.payload), timeout_s=30)
        primary = forms[0][0]
        info = VersionInfo(version=version, signed=primary, full=forms[1][0] if len(forms) > 1 else None,
                           origin_url=self.origin_url, published_at=primary.unverified_manifest().published_at)
        body = PublishRequest(info=info, public_key_hex=public_key_hex(self.key.public_key()))
        reply = self._with_retries(lambda: self._post("/v1/publish", body), self.request_timeout_s)
        # a worker's way to the newest version got too long: the next version goes out full as well
        self.origin.encoder.anchor_requested |= PublishResponse.model_validate_json(reply).anchor_wanted
        self.last_encode_s = sum(form.encode_s for _, form in forms)
        return info

    def origin_bytes_sent(self, version: int) -> int:
        """Learner uplink bytes spent on `version` so far (one copy per first-hop child)."""
        return self._call(_run(lambda: self.origin.stats(version).bytes_sent), timeout_s=10)

    # ---- coordinator client ----
    def fetch_batch(self, step: int, *, wait_s: float, step_time_s: float | None = None,
                    durable_step: int | None = None) -> list[TrainGroup]:
        """Groups for `step`; empty when the long poll ended before the batch was ready.
        `step_time_s`, the learner's busy time on its last step, feeds the activation controller;
        `durable_step`, the step of the newest checkpoint on disk, lets the coordinator delete
        the batches of earlier steps (a resumed learner never asks for them)."""
        body = BatchRequest(step=step, wait_s=wait_s, step_time_s=step_time_s, durable_step=durable_step)
        text = self._with_retries(lambda: self._post("/v1/batch", body, extra_timeout_s=wait_s),
                                  self.request_timeout_s + wait_s)
        return BatchResponse.model_validate_json(text).groups

    def evaluation_result(self, version: int, *, wait_s: float) -> EvaluationResult:
        """A version's evaluation on a worker (evaluation leases), waiting up to wait_s for it."""
        url = f"/v1/evaluation?version={version}&wait_s={wait_s:.3f}"
        text = self._with_retries(lambda: self._get(url, extra_timeout_s=wait_s), self.request_timeout_s + wait_s)
        return EvaluationResult.model_validate_json(text)

    def reject_batch(self, step: int, reason: str, requeue_lease_ids: tuple[str, ...] = ()) -> None:
        """Hand back the batch of a skipped step; the next `fetch_batch(step)` gets new groups.
        `requeue_lease_ids` are fine and go back to the buffer; the rest are retired."""
        body = RejectBatchRequest(step=step, reason=reason[:500], requeue_lease_ids=list(requeue_lease_ids))
        self._with_retries(lambda: self._post("/v1/batch/reject", body), self.request_timeout_s)

    def report_audit(self, step: int, verdicts: list[GroupAudit]) -> None:
        """The rollout audit's verdicts on this step's groups; the coordinator keeps per-worker
        statistics and quarantines workers whose groups fail."""
        body = AuditReport(step=step, groups=verdicts)
        self._with_retries(lambda: self._post("/v1/audit", body), self.request_timeout_s)

    def _with_retries(self, make_call, timeout_s: float) -> str:
        deadline = time.monotonic() + RETRY_WINDOW_S
        delay_s = 0.2
        while True:
            try:
                # the request carries its own timeout; this outer one only guards a wedged loop
                return self._call(make_call(), timeout_s=timeout_s + 10)
            except TransientError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("cannot reach the coordinator: %s; next try in %.1f s (giving up %.0f s after the first "
                            "failure)", exc, delay_s, RETRY_WINDOW_S)
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)

    async def _post(self, path: str, body: PublishRequest | RejectBatchRequest | AuditReport | BatchRequest,
                    extra_timeout_s: float = 0.0) -> str:
        return await call(self.session, "POST", self.coordinator_url + path, body,
                          timeout_s=self.request_timeout_s + extra_timeout_s)

    async def _get(self, path: str, extra_timeout_s: float) -> str:
        return await call(self.session, "GET", self.coordinator_url + path, None,
                          timeout_s=self.request_timeout_s + extra_timeout_s)


async def _run(fn, *args):
    return fn(*args)
