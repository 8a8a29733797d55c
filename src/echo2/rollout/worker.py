"""The rollout worker: register, load the base model, then lease prompts, generate groups and
return them, while a background task fetches newer policy versions so generation never waits
for bytes in flight. Weights are swapped only between generations."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from echo2.config.worker import WorkerConfig
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
    VersionInfo,
)
from echo2.report.metrics import MetricsWriter
from echo2.rollout.engine import GenRequest, make_engine
from echo2.rollout.weights import DirectFetcher, WeightFetcher

# a heartbeat slower than this is as good as lost (the coordinator evicts after a few missed)
HEARTBEAT_TIMEOUT_S = 5.0
# pause between failed weight fetches (learner restarting, version evicted): short enough that
# a worker catches up within a step or two
FETCH_RETRY_S = 0.5


class Stopping(Exception):
    """Raised out of a retry loop when the worker has been asked to stop."""


@dataclass
class Staged:
    info: VersionInfo
    tensors: dict
    fetch_s: float


class Worker:
    def __init__(self, cfg: WorkerConfig, coordinator_url: str, token: str, metrics: MetricsWriter) -> None:
        self.cfg = cfg
        self.url = coordinator_url.rstrip("/")
        self.token = token
        self.metrics = metrics
        self.version = -1  # version the engine holds
        self.latest: VersionInfo | None = None
        self.staged: Staged | None = None
        self.announced = asyncio.Event()  # a newer version was announced: the fetcher wakes
        self.beat_now = asyncio.Event()  # a reply mentioned a newer version: heartbeat at once
        self.weights_ready = asyncio.Event()  # a fetched version is staged: the work loop wakes
        self.registration = asyncio.Lock()
        self.active = True  # the coordinator may tell us to idle (cost-aware activation)
        self.swap_s: float | None = None
        self.registered_at = 0.0
        self.stats = {"tasks": 0, "rollouts": 0, "tokens": 0, "gen_s": 0.0, "busy_s": 0.0, "dropped": 0}

    async def run(self, stop: asyncio.Event) -> None:
        self.stop = stop
        try:
            await self._run(stop)
        except Stopping:
            pass  # asked to stop while the coordinator was unreachable

    async def _run(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with aiohttp.ClientSession(headers=headers) as self.session:
            reg = await self._register()
            # beat while the model loads: a slow load must not look like a dead worker
            background = [asyncio.create_task(self._heartbeats(stop))]
            try:
                source = self.cfg.model_source or reg.model_source
                self.engine = await asyncio.to_thread(make_engine, self.cfg.engine, source, self.cfg.device)
                background.append(asyncio.create_task(self._fetch_versions(DirectFetcher(self.session), stop)))
                await self._work(stop)
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                await self._leave()
                self.metrics.write("worker_done", worker_id=self.worker_id, **self.stats)

    async def _work(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._swap_if_staged()
            if self.version < 0 or self._too_stale():
                await _wait_either(self.weights_ready, stop, timeout_s=1.0)
                continue
            if not self.active:  # told to idle: no leases until a heartbeat says otherwise
                await _wait_either(stop, stop, timeout_s=self.heartbeat_interval_s)
                continue
            cycle_started = time.perf_counter()
            lease = await self._lease()
            if lease is None or not lease.tasks:
                await _wait_either(stop, stop, timeout_s=lease.retry_after_s if lease else 1.0)
                continue
            await self._generate_and_submit(lease.tasks)
            # lease + generate + submit: the worker's full-load throughput is rollouts / busy_s
            self.stats["busy_s"] += time.perf_counter() - cycle_started

    async def _leave(self) -> None:
        try:
            await call(self.session, "POST", self.url + "/v1/leave", LeaveRequest(worker_id=self.worker_id),
                       HEARTBEAT_TIMEOUT_S)
        except (TransientError, RefusedError):
            pass  # the coordinator will time us out instead

    def _too_stale(self) -> bool:
        return self.latest is not None and self.latest.version - self.version > self.max_staleness

    # ---- control plane ----
    async def _reregister(self, seen_at: float) -> None:
        """Join again after an eviction, once, however many loops noticed it."""
        async with self.registration:
            if self.registered_at == seen_at:
                await self._register()

    async def _register(self) -> RegisterResponse:
        req = RegisterRequest(worker_id=self.cfg.worker_id, engine=self.cfg.engine,
                              price_per_hour=self.cfg.price_per_hour)
        text = await self._retrying("POST", "/v1/register", req)
        reg = RegisterResponse.model_validate_json(text)
        self.worker_id, self.max_staleness = reg.worker_id, reg.max_staleness
        self.heartbeat_interval_s = reg.heartbeat_interval_s
        self.registered_at = time.monotonic()
        self._note_latest(reg.latest)
        self.metrics.write("worker_registered", worker_id=self.worker_id, engine=self.cfg.engine)
        return reg

    async def _retrying(self, method: str, path: str, body) -> str:
        """Transient failures are retried with backoff until the worker is told to stop;
        refusals propagate."""
        delay_s = 0.2
        while True:
            try:
                return await call(self.session, method, self.url + path, body, self.cfg.request_timeout_s)
            except TransientError:
                if self.stop.is_set():
                    raise Stopping from None
                await _wait_either(self.stop, self.stop, timeout_s=delay_s)
                delay_s = min(2 * delay_s, 5.0)

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _wait_either(self.beat_now, stop, timeout_s=self.heartbeat_interval_s)
            body = Heartbeat(worker_id=self.worker_id, version=self.version, swap_s=self.swap_s,
                             rollouts_total=self.stats["rollouts"], busy_s_total=self.stats["busy_s"])
            seen_at = self.registered_at
            try:
                text = await call(self.session, "POST", self.url + "/v1/heartbeat", body, HEARTBEAT_TIMEOUT_S)
                reply = HeartbeatResponse.model_validate_json(text)
                self._note_latest(reply.latest)
                self.active = reply.active
            except RefusedError as exc:
                if exc.status == 404:  # evicted (or the coordinator restarted): join again
                    await self._reregister(seen_at)
            except TransientError:
                pass  # the next beat will try again; eviction takes several missed beats

    def _note_version_number(self, version: int) -> None:
        if version > (self.latest.version if self.latest else -1):
            self.beat_now.set()  # the heartbeat reply carries the full announcement

    def _note_latest(self, info: VersionInfo | None) -> None:
        if info is None or info == self.latest:
            return
        # same version, new source: a restarted learner serves it again from a new address
        if self.latest is None or info.version >= self.latest.version:
            self.latest = info
            self.announced.set()

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
            return None

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

    # ---- weights ----
    async def _fetch_versions(self, fetcher: WeightFetcher, stop: asyncio.Event) -> None:
        while not stop.is_set():
            target = self.latest
            have = max(self.version, self.staged.info.version if self.staged else -1)
            if target is None or target.version <= have:
                await _wait_either(self.announced, stop, timeout_s=1.0)
                continue
            try:
                started = time.perf_counter()
                payload = await fetcher.fetch(target)
                tensors = await asyncio.to_thread(_deserialize, payload)
            except TransientError as exc:
                self.metrics.write("weights_fetch_failed", worker_id=self.worker_id, version=target.version,
                                   error=str(exc)[:300])
                await asyncio.sleep(FETCH_RETRY_S)
                continue
            self.staged = Staged(target, tensors, time.perf_counter() - started)
            self.weights_ready.set()

    async def _swap_if_staged(self) -> None:
        staged, self.staged = self.staged, None
        if staged is None or staged.info.version <= self.version:
            return
        started = time.perf_counter()
        await asyncio.to_thread(self.engine.load_state_dict, staged.tensors)
        self.swap_s = time.perf_counter() - started
        self.version = staged.info.version
        self.metrics.write(
            "weights_loaded", worker_id=self.worker_id, version=self.version,
            bytes=staged.info.manifest.total_bytes, fetch_s=staged.fetch_s, swap_s=self.swap_s,
            publish_to_loaded_s=time.time() - staged.info.manifest.published_at,
        )


async def _wait_either(event: asyncio.Event, stop: asyncio.Event, timeout_s: float) -> None:
    """Sleep until `event` or `stop` is set or the timeout passes; consume `event`."""
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())}
    _, pending = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for waiter in pending:
        waiter.cancel()
    if event is not stop:
        event.clear()


def _deserialize(payload: bytes) -> dict:
    from echo2.models.weights import bytes_to_state_dict

    return bytes_to_state_dict(payload)
