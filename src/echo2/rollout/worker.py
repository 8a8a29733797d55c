"""The rollout worker: register, load the base model, then lease prompts, generate groups and
return them, while the version follower pulls newer policy versions through the broadcast in
the background so generation never waits for bytes in flight. Weights are swapped only between
generations."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from pydantic import ValidationError

from echo2.config.base import validate
from echo2.config.broadcast import BroadcastConfig
from echo2.config.worker import WorkerConfig
from echo2.protocol import tls
from echo2.protocol.http import RefusedError, TransientError, call
from echo2.protocol.messages import (
    Heartbeat,
    HeartbeatResponse,
    LeaseRequest,
    LeaseResponse,
    LeaveRequest,
    RegisterRequest,
    RegisterResponse,
    RolloutCompletion,
    RolloutSubmission,
    SubmitResponse,
    Task,
)
from echo2.report.metrics import MetricsWriter
from echo2.rollout.engine import GenRequest, make_engine
from echo2.rollout.follower import VersionFollower, wait_either
from echo2.rollout.weights import WeightReceiver

# a heartbeat slower than this is as good as lost (the coordinator evicts after a few missed)
HEARTBEAT_TIMEOUT_S = 5.0
# a worker restarted under its old id waits this long for the coordinator to time out its old
# self: several worker_timeout_s (6 s by default) on a loaded box
JOIN_WAIT_S = 60.0


class Stopping(Exception):
    """Raised out of a retry loop when the worker has been asked to stop."""


class Worker:
    def __init__(self, cfg: WorkerConfig, coordinator_url: str, token: str, metrics: MetricsWriter) -> None:
        self.cfg = cfg
        self.url = coordinator_url.rstrip("/")
        self.token = token
        self.metrics = metrics
        self.worker_id = cfg.worker_id
        self.beat_now = asyncio.Event()  # a reply mentioned a newer version: heartbeat at once
        self.registration = asyncio.Lock()
        self.active = True  # the coordinator may tell us to idle (cost-aware activation)
        self.registered_at = 0.0
        self.generation_s: float | None = None  # last lease-generate-submit cycle
        self.refusal = ""  # why the coordinator cut this worker off (403), if it did
        self.stats = {"tasks": 0, "rollouts": 0, "tokens": 0, "gen_s": 0.0, "busy_s": 0.0, "dropped": 0}

    @property
    def version(self) -> int:
        return self.follower.version

    async def run(self, stop: asyncio.Event) -> None:
        self.stop = stop
        try:
            await self._run(stop)
        except Stopping:
            pass  # asked to stop while the coordinator was unreachable

    async def _run(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        tls.warn_plain_url(self.url, "the coordinator")
        async with aiohttp.ClientSession(headers=headers, connector=tls.connector(self.cfg.tls)) as self.session:
            broadcast = validate(BroadcastConfig, await self._broadcast_config(), source="coordinator broadcast config")
            receiver = WeightReceiver(self.cfg, broadcast, self.token, self.url, self.session)
            self.relay_address = await receiver.start()
            self.follower = VersionFollower(receiver, self.metrics)
            reg = await self._register()
            # beat while the model loads: a slow load must not look like a dead worker
            background = [asyncio.create_task(self._heartbeats(stop))]
            try:
                source = self.cfg.model_source or reg.model_source
                self.engine = await asyncio.to_thread(make_engine, self.cfg, source)
                background.append(asyncio.create_task(self.follower.run(stop)))
                await self._work(stop)
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                await self._leave()
                await receiver.stop()
                self.metrics.write("worker_done", worker_id=self.worker_id, **self.stats)

    async def _work(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.follower.swap_into(self.engine)
            if self.version < 0 or self._too_stale():
                await wait_either(self.follower.ready, stop, timeout_s=1.0)
                continue
            if not self.active:  # told to idle: no leases, but keep the weights current
                await wait_either(self.follower.ready, stop, timeout_s=self.heartbeat_interval_s)
                continue
            cycle_started = time.perf_counter()
            lease = await self._lease()
            if lease is None or not lease.tasks:
                await wait_either(stop, stop, timeout_s=lease.retry_after_s if lease else 1.0)
                continue
            await self._generate_and_submit(lease.tasks)
            # lease + generate + submit: the worker's full-load throughput is rollouts / busy_s
            self.generation_s = time.perf_counter() - cycle_started
            self.stats["busy_s"] += self.generation_s

    def _too_stale(self) -> bool:
        latest = self.follower.latest
        return latest is not None and latest.version - self.version > self.max_staleness

    # ---- control plane ----
    async def _broadcast_config(self) -> dict:
        return json.loads(await self._retrying("GET", "/v1/broadcast_config", None, token=self.token))

    async def _register(self) -> RegisterResponse:
        cfg = self.cfg
        req = RegisterRequest(worker_id=self.worker_id, engine=cfg.engine, price_per_hour=cfg.price_per_hour,
                              relay_address=self.relay_address, upload_bps=cfg.bandwidth_bps,
                              download_bps=cfg.bandwidth_bps)
        reg = RegisterResponse.model_validate_json(await self._join(req))
        # every later call speaks with this worker's own credential, not the shared join token
        self.session.headers["Authorization"] = f"Bearer {reg.credential}"
        self.worker_id, self.max_staleness = reg.worker_id, reg.max_staleness
        self.follower.receiver.worker_id = reg.worker_id
        self.heartbeat_interval_s = reg.heartbeat_interval_s
        self.registered_at = time.monotonic()
        self.follower.note(reg.latest, None, reg.learner_public_key)
        self.beat_now.set()  # the first heartbeat brings this worker's broadcast assignment
        self.metrics.write("worker_registered", worker_id=self.worker_id, engine=cfg.engine,
                           relay_address=self.relay_address)
        return reg

    async def _join(self, req: RegisterRequest) -> str:
        """Register with the join token. A worker restarted under the same id finds its old self
        still live until the coordinator times it out (409), and a fleet joining from behind one
        address may meet the registration rate limit (429): it waits and tries again."""
        deadline = time.monotonic() + JOIN_WAIT_S
        while True:
            try:
                return await self._retrying("POST", "/v1/register", req, token=self.token)
            except RefusedError as exc:
                if exc.status not in (409, 429) or time.monotonic() > deadline:
                    raise
                await wait_either(self.stop, self.stop, timeout_s=1.0)
                if self.stop.is_set():
                    raise Stopping from None

    async def _reregister(self, seen_at: float) -> None:
        """Join again after an eviction, once, however many loops noticed it."""
        async with self.registration:
            if self.registered_at == seen_at:
                await self._register()

    async def _leave(self) -> None:
        try:
            await call(self.session, "POST", self.url + "/v1/leave", LeaveRequest(worker_id=self.worker_id),
                       HEARTBEAT_TIMEOUT_S)
        except (TransientError, RefusedError):
            pass  # the coordinator will time us out instead

    async def _retrying(self, method: str, path: str, body, token: str | None = None) -> str:
        """Transient failures are retried with backoff until the worker is told to stop;
        refusals propagate."""
        delay_s = 0.2
        while True:
            try:
                return await call(self.session, method, self.url + path, body, self.cfg.request_timeout_s, token)
            except TransientError:
                if self.stop.is_set():
                    raise Stopping from None
                await wait_either(self.stop, self.stop, timeout_s=delay_s)
                delay_s = min(2 * delay_s, 5.0)

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_either(self.beat_now, stop, timeout_s=self.heartbeat_interval_s)
            body = Heartbeat(worker_id=self.worker_id, version=self.version, swap_s=self.follower.swap_s,
                             dissemination_s=self.follower.dissemination_s, generation_s=self.generation_s,
                             rollouts_total=self.stats["rollouts"], busy_s_total=self.stats["busy_s"])
            seen_at = self.registered_at
            try:
                text = await call(self.session, "POST", self.url + "/v1/heartbeat", body, HEARTBEAT_TIMEOUT_S)
                reply = HeartbeatResponse.model_validate_json(text)
                self.follower.note(reply.latest, reply.assignment, reply.learner_public_key)
                self.active = reply.active
            except RefusedError as exc:
                if exc.status == 404:  # evicted (or the coordinator restarted): join again
                    await self._reregister(seen_at)
                self._cut_off(exc)
            except TransientError:
                pass  # the next beat will try again; eviction takes several missed beats
            except ValidationError as exc:  # a malformed reply must not end the heartbeats
                self.metrics.write("worker_bad_reply", worker_id=self.worker_id, what="heartbeat",
                                   error=str(exc)[:300])

    def _note_version_number(self, version: int) -> None:
        latest = self.follower.latest
        if version > (latest.version if latest else -1):
            self.beat_now.set()  # the heartbeat reply carries the announcement and assignment

    async def _lease(self) -> LeaseResponse | None:
        body = LeaseRequest(worker_id=self.worker_id, version=self.version, max_tasks=self.cfg.tasks_per_lease)
        seen_at = self.registered_at
        try:
            reply = LeaseResponse.model_validate_json(await self._retrying("POST", "/v1/lease", body))
            self._note_version_number(reply.latest_version)
            return reply
        except RefusedError as exc:
            self.metrics.write("worker_refused", worker_id=self.worker_id, what="lease", error=exc.message)
            if exc.status == 404:
                await self._reregister(seen_at)
            self._cut_off(exc)
            return None

    def _cut_off(self, exc: RefusedError) -> None:
        """403: the coordinator refuses this worker for good (quarantined by the rollout audit, or
        a credential that is not its own). Retrying cannot help: stop, and say why."""
        if exc.status == 403 and not self.refusal:
            self.refusal = exc.message
            self.metrics.write("worker_cut_off", worker_id=self.worker_id, reason=exc.message)
            self.stop.set()

    # ---- rollouts ----
    async def _generate_and_submit(self, tasks: list[Task]) -> None:
        requests = [GenRequest(t.prompt_ids, t.sampling.group_size, t.sampling.temperature,
                               t.sampling.max_new_tokens) for t in tasks]
        version = self.version
        started = time.perf_counter()
        groups = await asyncio.to_thread(self.engine.generate, requests)
        if self.cfg.slowdown > 1:  # emulated slower hardware (config: slowdown)
            await asyncio.sleep((self.cfg.slowdown - 1) * (time.perf_counter() - started))
        gen_s = time.perf_counter() - started
        per_task_s = gen_s / len(tasks)
        for task, completions in zip(tasks, groups, strict=True):
            body = RolloutSubmission(
                worker_id=self.worker_id, task_id=task.task_id, version=version, gen_time_s=per_task_s,
                completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in completions],
            )
            await self._submit(body)
        self.stats["tasks"] += len(tasks)
        self.stats["rollouts"] += sum(len(g) for g in groups)
        self.stats["tokens"] += sum(len(c.token_ids) for g in groups for c in g)
        self.stats["gen_s"] += gen_s

    async def _submit(self, body: RolloutSubmission) -> None:
        try:
            reply = SubmitResponse.model_validate_json(await self._retrying("POST", "/v1/rollout", body))
            self._note_version_number(reply.latest_version)
            if not reply.accepted:
                self.stats["dropped"] += 1
        except RefusedError as exc:
            # 409: our lease expired and the prompt went to someone else; the group is discarded
            self.stats["dropped"] += 1
            self.metrics.write("worker_refused", worker_id=self.worker_id, what="rollout", error=exc.message)
