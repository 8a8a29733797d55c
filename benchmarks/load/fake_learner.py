"""The load benchmark's learner: no torch, no training, the real learner's conversation with the
coordinator (learner/train.py, learner/io.py). It publishes version 0, then, step after step,
asks for step t's batch (POST /v1/batch, a long poll, reporting its busy time of the last step
as `step_time_s` and its newest "checkpoint" as `durable_step`, as the real learner does),
"trains" for `train_s` (a sleep), reports the rollout audit's verdicts on the batch (every group
passes: the simulated workers are honest, and the coordinator credits a worker's measured rate
only once the audit has passed some of its groups, policy/credit.py), and publishes version
t+1: a REAL signed manifest of the run's
base weights (base/model.safetensors, a few bytes changed per version so every version hashes
differently), Ed25519-signed with a key made for the run. It serves no chunks: simulated
workers fetch nothing (the origin URL it announces points at no server).

Each step is appended to `<run_dir>/fake_learner_steps.jsonl` as it happens (the harness reads
the pace from it even if this process is killed); request latencies and outcomes go to the
result file at the end.

    python benchmarks/load/fake_learner.py CONFIG.json
"""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402

from echo2.broadcast.signing import generate_private_key, public_key_hex, sign_manifest  # noqa: E402
from echo2.protocol.learner_api import (  # noqa: E402
    AuditReport,
    BatchRequest,
    BatchResponse,
    GroupAudit,
    PublishRequest,
)
from echo2.protocol.manifest import build_manifest  # noqa: E402
from echo2.protocol.messages import TrainGroup, VersionInfo  # noqa: E402
from load.stats import Recorder  # noqa: E402

REQUEST_TIMEOUT_S = 60.0  # learner.request_timeout_s's default (a batch long poll adds its wait)
BATCH_WAIT_S = 20.0  # train.batch_wait_s's default
RETRY_WINDOW_S = 120.0  # learner/io.py: transient failures are retried this long
NO_ORIGIN_URL = "http://127.0.0.1:9"
"""Announced as the origin: the discard port, where nothing serves chunks (none are fetched)."""


class FakeLearner:
    def __init__(self, url: str, learner_token: str, payload: bytes, *, train_s: float, chunk_bytes: int,
                 checkpoint_every: int, recorder: Recorder, steps_path: Path | None = None) -> None:
        self.url, self.token, self.payload = url.rstrip("/"), learner_token, bytearray(payload)
        self.train_s, self.chunk_bytes, self.checkpoint_every = train_s, chunk_bytes, checkpoint_every
        self.recorder, self.steps_path = recorder, steps_path
        self.key = generate_private_key()
        self.public_hex = public_key_hex(self.key.public_key())
        (header_bytes,) = struct.unpack("<Q", payload[:8])
        self.data_start = 8 + header_bytes  # tensor bytes start here: the header stays valid
        self.session: aiohttp.ClientSession | None = None
        self.steps = 0

    async def run(self, stop: asyncio.Event) -> None:
        """learner/train.py's loop, with a sleep for the step; until `stop`."""
        headers = {"Authorization": f"Bearer {self.token}"}
        async with aiohttp.ClientSession(headers=headers) as self.session:
            await self._publish(0)
            step, busy_s = 0, None
            while not stop.is_set():
                started = time.perf_counter()
                groups = await self._batch(step, busy_s, stop)
                if not groups:
                    continue
                wait_s = time.perf_counter() - started
                await asyncio.sleep(self.train_s)
                await self._report_audit(step, groups)
                publish_s = await self._publish(step + 1)
                busy_s = self.train_s + publish_s
                self._record_step(step, len(groups), wait_s, publish_s)
                step += 1

    def _record_step(self, step: int, groups: int, wait_s: float, publish_s: float) -> None:
        self.steps = step + 1
        self.recorder.count("steps")
        if self.steps_path is not None:
            with open(self.steps_path, "a") as handle:
                handle.write(json.dumps({"step": step, "time": time.time(), "groups": groups, "wait_s": wait_s,
                                         "publish_s": publish_s}) + "\n")

    def _durable_step(self, step: int) -> int | None:
        """The step of the newest checkpoint the real learner would have written by `step`."""
        return (step // self.checkpoint_every) * self.checkpoint_every if step >= self.checkpoint_every else None

    async def _batch(self, step: int, busy_s: float | None, stop: asyncio.Event) -> list:
        body = BatchRequest(step=step, wait_s=BATCH_WAIT_S, step_time_s=busy_s, durable_step=self._durable_step(step))
        call = self._with_retries("batch", "/v1/batch", body, REQUEST_TIMEOUT_S + BATCH_WAIT_S)
        job, stopping = asyncio.ensure_future(call), asyncio.ensure_future(stop.wait())
        await asyncio.wait({job, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not job.done():  # stopped while the long poll is held
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
            return []
        return BatchResponse.model_validate_json(job.result()).groups

    async def _report_audit(self, step: int, groups: list[TrainGroup]) -> None:
        """learner/io.py's `report_audit`: each trained group recomputed under its version and
        passed (the real learner audits a keyed share of them; passing all only credits sooner)."""
        verdicts = [GroupAudit(lease_id=g.lease_id, worker_id=g.worker_id, version=g.version,
                               tokens=sum(len(c.token_ids) for c in g.completions), mean_abs_logprob_diff=0.0,
                               recomputed=True, sampler_violations=0, failed=False) for g in groups]
        await self._with_retries("audit", "/v1/audit", AuditReport(step=step, groups=verdicts), REQUEST_TIMEOUT_S)

    async def _publish(self, version: int) -> float:
        """Sign `version` (hashing off the event loop, as the real learner hashes in its
        training thread) and announce it; returns the seconds it took."""
        started = time.perf_counter()
        signed = await asyncio.to_thread(self._sign, version)
        info = VersionInfo(version=version, signed=signed, origin_url=NO_ORIGIN_URL,
                           published_at=signed.unverified_manifest().published_at)
        await self._with_retries("publish", "/v1/publish", PublishRequest(info=info, public_key_hex=self.public_hex),
                                 REQUEST_TIMEOUT_S)
        return time.perf_counter() - started

    def _sign(self, version: int):
        for offset in range(self.data_start, len(self.payload) - 4, self.chunk_bytes):
            self.payload[offset:offset + 4] = struct.pack("<f", float(version))  # every chunk changes
        manifest = build_manifest(version, bytes(self.payload), self.chunk_bytes)
        return sign_manifest(manifest.model_copy(update={"published_at": time.time()}), self.key)

    async def _with_retries(self, kind: str, path: str, body, timeout_s: float) -> str:
        """learner/io.py's `_with_retries`: transient failures retried with backoff."""
        deadline, delay_s = time.monotonic() + RETRY_WINDOW_S, 0.2
        while True:
            try:
                return await self._call(kind, path, body, timeout_s)
            except (aiohttp.ClientError, TimeoutError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay_s)
                delay_s = min(2 * delay_s, 5.0)

    async def _call(self, kind: str, path: str, body, timeout_s: float) -> str:
        started_at, started = time.time(), time.perf_counter()
        try:
            async with self.session.post(self.url + path, data=body.model_dump_json(),
                                         headers={"Content-Type": "application/json"},
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                text = await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.recorder.outcome(kind, "timeout" if isinstance(exc, TimeoutError) else "connect_error", started_at,
                                  reason=type(exc).__name__)
            raise
        self.recorder.took(kind, started_at, (time.perf_counter() - started) * 1000.0)
        self.recorder.outcome(kind, "ok" if resp.status < 400 else f"http_{resp.status}", started_at,
                              reason=text[:200] if resp.status >= 400 else "")
        if resp.status >= 500:
            raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status, message=text[:200])
        if resp.status >= 400:
            raise RuntimeError(f"the coordinator refused the fake learner's {path}: HTTP {resp.status}: {text[:500]}")
        return text


async def _main(cfg: dict) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    recorder = Recorder([(name, at) for name, at in cfg["phases"]])
    learner = FakeLearner(cfg["url"], cfg["learner_token"], Path(cfg["payload"]).read_bytes(),
                          train_s=cfg["train_s"], chunk_bytes=cfg["chunk_bytes"],
                          checkpoint_every=cfg["checkpoint_every"], recorder=recorder,
                          steps_path=Path(cfg["steps_path"]))
    try:
        await learner.run(stop)
    finally:
        Path(cfg["out"]).write_text(json.dumps({"steps": learner.steps, "recorder": recorder.to_dict()}))


if __name__ == "__main__":
    asyncio.run(_main(json.loads(Path(sys.argv[1]).read_text())))
