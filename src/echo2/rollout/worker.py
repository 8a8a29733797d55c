"""The rollout worker: register, load the base model, then lease prompts, generate groups and
return them, while the version follower pulls newer policy versions through the broadcast in
the background so generation never waits for bytes in flight. Weights are swapped between
generations, and with sampling.segment_tokens also at segment boundaries of a generation in
flight (each token then carries the version that sampled it)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp

from echo2.config.base import validate
from echo2.config.broadcast import BroadcastConfig
from echo2.config.run import LoraConfig
from echo2.config.worker import WorkerConfig, slowdown_idle_s
from echo2.policy import too_stale
from echo2.protocol import tls
from echo2.protocol.http import RefusedError, TransientError
from echo2.protocol.messages import (
    RELEASE,
    EvalAck,
    EvalSubmission,
    EvalTask,
    LeaseRequest,
    LeaseResponse,
    LeaveRequest,
    RegisterRequest,
    RegisterResponse,
    RolloutSubmission,
    SubmitResponse,
    Task,
)
from echo2.protocol.trusted import TRUSTED_HEADER, trusted_worker_token
from echo2.report.metrics import MetricsWriter
from echo2.rollout.activity import ActivityLog
from echo2.rollout.agent_episodes import EpisodesFailed
from echo2.rollout.control import HEARTBEAT_TIMEOUT_S, ControlLine
from echo2.rollout.diagnosis import WorkerFailed, refusal_fix, registration_reply
from echo2.rollout.engine import Engine, InFlight
from echo2.rollout.engine_factory import engine_type, make_engine
from echo2.rollout.episodes import episode_player, sample_groups
from echo2.rollout.follower import VersionFollower
from echo2.rollout.link import CoordinatorLink, Stopping
from echo2.rollout.waits import unless_set, wait_either
from echo2.rollout.weights import WeightReceiver

log = logging.getLogger("echo2.worker")

# a worker restarted under its old id waits this long for the coordinator to time out its old
# self: several worker_timeout_s (6 s by default) on a loaded box
JOIN_WAIT_S = 60.0
# the longest a lease request may be held at the coordinator while the window is full: a
# refused worker asks about once per this many seconds instead of ten times a second
LEASE_WAIT_S = 5.0


class Worker:
    def __init__(self, cfg: WorkerConfig, coordinator_url: str, token: str, metrics: MetricsWriter) -> None:
        self.cfg = cfg
        self.url = coordinator_url.rstrip("/")
        self.token = token
        self.metrics = metrics
        self.worker_id = cfg.worker_id
        self.beat_now = asyncio.Event()  # send a heartbeat now (its reply has the next fetch)
        self.woken = asyncio.Event()  # activated: an idle worker asks for work at once
        self.registration = asyncio.Lock()
        self.active = True  # the coordinator may tell us to idle (cost-aware activation)
        self.registered_at = 0.0
        self.generation_s: float | None = None  # last lease-generate-submit cycle
        self.stats = {"tasks": 0, "rollouts": 0, "tokens": 0, "gen_s": 0.0, "busy_s": 0.0, "dropped": 0,
                      "eval_prompts": 0, "eval_s": 0.0}
        self.failure: WorkerFailed | None = None  # set by a background loop that gave up
        self.activity = ActivityLog(self.stats, cfg.log_every_s)
        self.episodes = None  # set on joining a run whose task is multi-turn (rollout.episodes.episode_player)
        self.hold_version: int | None = None  # the version an evaluation this worker serves needs
        # set once the run starts (`run`, `_run`) and the worker registers (`_register`)
        self.stop: asyncio.Event | None = None
        self.link: CoordinatorLink | None = None
        self.follower: VersionFollower | None = None
        self.relay_address = ""
        self.engine: Engine | None = None
        self.heartbeat_interval_s = 1.0
        self.max_staleness = 0

    @property
    def version(self) -> int:
        return self.follower.version

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set. Raises WorkerFailed when the coordinator refuses this worker
        or stays unreachable for cfg.coordinator_unreachable_s."""
        self.stop = stop
        self.link = CoordinatorLink(self.url, self.cfg, stop)
        try:
            await self._run(stop)
        except Stopping:
            pass  # asked to stop while the coordinator was unreachable
        if self.failure is not None:
            raise self.failure

    async def _run(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        tls.warn_plain_url(self.url, "the coordinator")
        async with aiohttp.ClientSession(headers=headers, connector=tls.connector(self.cfg.tls)) as session:
            self.link.session = session
            log.info("contacting the coordinator at %s", self.url)
            broadcast = validate(BroadcastConfig, await self._broadcast_config(), source="coordinator broadcast config")
            receiver = WeightReceiver(self.cfg, broadcast, token=self.token, coordinator_url=self.url, control=session)
            self.relay_address = await receiver.start()
            self.follower = VersionFollower(receiver, self.metrics, ask_newest=self.beat_now.set)
            try:  # the relay stops even when registration is refused
                await self._join_and_work(stop)
            finally:
                await receiver.stop()

    async def _join_and_work(self, stop: asyncio.Event) -> None:
        reg = await self._register()
        # beat while the model loads: a slow load must not look like a dead worker
        background = [asyncio.create_task(ControlLine(self).run(stop)),
                      asyncio.create_task(self.activity.run(stop, lambda: self.follower.version, lambda: self.active))]
        try:
            source = self.cfg.model_source or reg.model_source
            self.engine = await self._load_engine(source, reg.lora)
            self.episodes = await asyncio.to_thread(episode_player, self.engine, reg.task, source,
                                                    reg.sampling.max_new_tokens)
            background.append(asyncio.create_task(self.follower.run(stop)))
            await self._work(stop)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if self.episodes is not None:  # a verifiers environment's turn server and tool servers
                await asyncio.to_thread(self.episodes.close)
            await self._leave()
            self.metrics.write("worker_done", worker_id=self.worker_id, **self.stats)
            log.info("stopped: %d rollouts (%d tokens) generated, %d groups dropped", self.stats["rollouts"],
                     self.stats["tokens"], self.stats["dropped"])

    async def _load_engine(self, source: str, lora: LoraConfig | None):
        started = time.perf_counter()
        engine = await asyncio.to_thread(make_engine, self.cfg, source, lora)
        log.info("model loaded from %s in %.1f s (engine %s, device %s); waiting for a policy version", source,
                 time.perf_counter() - started, self.cfg.engine, self.cfg.device)
        return engine

    async def _work(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            holding = self.hold_version is not None  # serving an evaluation: its version stays
            if not holding:
                await self.follower.swap_into(self.engine)
            if self.version < 0 or (not holding and self._too_stale()):
                await wait_either(self.follower.ready, stop, timeout_s=1.0)
                continue
            cycle_started = time.perf_counter()
            # told to idle, a worker still asks (at the coordinator's retry pace): idle workers
            # serve evaluation leases, and its weights stay current meanwhile
            lease = await self._lease()
            if lease is not None and lease.evaluation is not None:
                await self._evaluate(lease.evaluation)
                continue
            if lease is None or not lease.tasks:
                self.activity.refused(lease.reason if lease else "")
                if lease is not None and self._behind():  # refused at this version: load the next one
                    await wait_either(self.follower.ready, stop, timeout_s=max(lease.retry_after_s, 1.0))
                else:  # an idle worker is told to come back late: activation cuts its wait short
                    self.woken.clear()
                    await wait_either(self.woken, stop, timeout_s=lease.retry_after_s if lease else 1.0)
                continue
            await self._generate_and_submit(lease.tasks)
            # lease + generate + submit: the worker's full-load throughput is rollouts / busy_s
            self.generation_s = time.perf_counter() - cycle_started
            self.stats["busy_s"] += self.generation_s

    def _behind(self) -> bool:
        """A newer version than the one held has been announced (it is on its way here)."""
        latest = self.follower.latest
        return latest is not None and latest.version > self.version and self.hold_version is None

    def _too_stale(self) -> bool:
        """The coordinator would refuse a lease (the same rule): wait for the newer version."""
        latest = self.follower.latest
        return too_stale(latest.version if latest is not None else None, self.version, self.max_staleness)

    # ---- control plane ----
    async def _broadcast_config(self) -> dict:
        path = "/v1/broadcast_config"
        try:
            return json.loads(await self.link.retrying("GET", path, None, token=self.token))
        except RefusedError as exc:  # a wrong token or a wrong URL: retrying cannot help
            raise WorkerFailed(refusal_fix(exc, self.url, path)) from None

    async def _register(self) -> RegisterResponse:
        cfg = self.cfg
        req = RegisterRequest(worker_id=self.worker_id, engine=cfg.engine, price_per_hour=cfg.price_per_hour,
                              relay_address=self.relay_address, upload_bps=cfg.bandwidth_bps,
                              download_bps=cfg.bandwidth_bps, release=RELEASE, worker_class=cfg.worker_class,
                              sampler="seeded" if engine_type(cfg.engine).seeded else "free")
        try:
            reg = registration_reply(await self._join(req))
        except RefusedError as exc:
            raise WorkerFailed(refusal_fix(exc, self.url, "/v1/register")) from None
        # every later call speaks with this worker's own credential, not the shared join token
        self.link.session.headers["Authorization"] = f"Bearer {reg.credential}"
        self.worker_id, self.max_staleness = reg.worker_id, reg.max_staleness
        self.follower.receiver.worker_id = reg.worker_id
        self.heartbeat_interval_s = reg.heartbeat_interval_s
        self.registered_at = time.monotonic()
        self.follower.note(None, None, reg.learner_public_key)
        self.beat_now.set()  # the first heartbeat brings the newest version and where to pull it
        self.metrics.write("worker_registered", worker_id=self.worker_id, engine=cfg.engine,
                           relay_address=self.relay_address)
        where = f"relaying to peers from {self.relay_address}" if self.relay_address else \
            "a broadcast leaf (accepts_incoming=false: no relay)"
        log.info("registered as worker %s (S=%d, heartbeat every %.1f s), %s", self.worker_id, self.max_staleness,
                 self.heartbeat_interval_s, where)
        return reg

    async def _join(self, req: RegisterRequest) -> str:
        """Register with the join token. A worker restarted under the same id finds its old self
        still live until the coordinator times it out (409), and a fleet joining from behind one
        address may meet the registration rate limit (429): it waits and tries again."""
        deadline = time.monotonic() + JOIN_WAIT_S
        trusted = trusted_worker_token()  # a worker-trusted environment's workers must present it
        if trusted:
            self.link.session.headers[TRUSTED_HEADER] = trusted
        try:
            while True:
                try:
                    return await self.link.retrying("POST", "/v1/register", req, token=self.token)
                except RefusedError as exc:
                    if exc.status not in (409, 429) or time.monotonic() > deadline:
                        raise
                    log.info("registration deferred (HTTP %d: %s); trying again in 1 s", exc.status, exc.message)
                await wait_either(self.stop, self.stop, timeout_s=1.0)
                if self.stop.is_set():
                    raise Stopping from None
        finally:  # the registration alone asks for it
            self.link.session.headers.pop(TRUSTED_HEADER, None)

    async def reregister(self, seen_at: float) -> None:
        """Join again after an eviction, once, however many loops noticed it."""
        async with self.registration:
            if self.registered_at == seen_at:
                await self._register()

    async def _leave(self) -> None:
        try:
            await self.link.once("POST", "/v1/leave", LeaveRequest(worker_id=self.worker_id),
                                 timeout_s=HEARTBEAT_TIMEOUT_S)
        except (TransientError, RefusedError):
            pass  # the coordinator will time us out instead

    def set_active(self, active: bool) -> None:
        if active != self.active:
            log.info("the coordinator %s this worker", "activated" if active else
                     "deactivated (cost-aware activation): no leases until activated, weights kept current")
        if active and not self.active:
            self.woken.set()  # an idle worker waiting to ask again asks now
        self.active = active

    async def _lease(self) -> LeaseResponse | None:
        # a full window is waited out at the coordinator (a long poll), well inside our timeout;
        # not while a newer version is on its way: that version's room is what to wait for
        wait_s = 0.0 if self._behind() else min(LEASE_WAIT_S, self.cfg.request_timeout_s / 3)
        body = LeaseRequest(worker_id=self.worker_id, version=self.version, max_tasks=self.cfg.tasks_per_lease,
                            wait_s=wait_s)
        seen_at = self.registered_at
        try:
            # a held lease request is given up when the worker stops (it would hold the exit)
            answered, text = await unless_set(self.stop, self.link.retrying("POST", "/v1/lease", body))
            if not answered:
                raise Stopping
            reply = LeaseResponse.model_validate_json(text)
            self.hold_version = reply.hold_version
            return reply
        except RefusedError as exc:
            self.metrics.write("worker_refused", worker_id=self.worker_id, what="lease", error=exc.message)
            log.warning("lease refused (HTTP %d): %s", exc.status, exc.message)
            if exc.status == 404:
                await self.reregister(seen_at)
            self.cut_off(exc)
            return None

    def cut_off(self, exc: RefusedError) -> None:
        """403: the coordinator refuses this worker for good (quarantined by the rollout audit, or
        a credential that is not its own). Retrying cannot help: stop, and say why."""
        if exc.status == 403 and self.failure is None:
            self.metrics.write("worker_cut_off", worker_id=self.worker_id, reason=exc.message)
            self.failure = WorkerFailed(f"the coordinator refused this worker for good: {exc.message}")
            self.stop.set()

    # ---- rollouts ----
    async def _generate_and_submit(self, tasks: list[Task]) -> None:
        version = self.version
        started, cpu_started = time.perf_counter(), time.process_time()
        inflight = self._inflight(tasks)
        # emulated slower hardware (config: slowdown): paced by the engine (per decode step or
        # segment) where versions may arrive mid-generation, else idle after the generation
        paced = (inflight is not None or self.cfg.slowdown_per_token) and hasattr(self.engine, "slowdown")
        if hasattr(self.engine, "slowdown"):
            self.engine.slowdown = self.cfg.slowdown if paced else 1.0
            self.engine.slowdown_clock = self.cfg.slowdown_clock
        try:
            groups = await asyncio.to_thread(sample_groups, self.engine, self.episodes, tasks, inflight)
        except EpisodesFailed as exc:  # the environment's fault, not this worker's: the next lease may work
            log.warning("%s; its leases expire and go to another worker", exc)
            self.metrics.write("episodes_failed", worker_id=self.worker_id, leases=len(tasks), error=str(exc)[:500])
            return
        if not paced:
            await asyncio.sleep(slowdown_idle_s(self.cfg.slowdown, self.cfg.slowdown_clock,
                                                time.perf_counter() - started, time.process_time() - cpu_started))
        gen_s = time.perf_counter() - started
        per_task_s = gen_s / len(tasks)
        for task, completions in zip(tasks, groups, strict=True):
            body = RolloutSubmission(worker_id=self.worker_id, lease_id=task.lease_id, version=version,
                                     gen_time_s=per_task_s, completions=completions)
            await self._submit(body)
        self.stats["tasks"] += len(tasks)
        self.stats["rollouts"] += sum(len(g) for g in groups)
        self.stats["tokens"] += sum(len(c.token_ids) for g in groups for c in g)
        self.stats["gen_s"] += gen_s

    def _inflight(self, tasks: list[Task]) -> InFlight | None:
        """In-flight weight updates for this lease (sampling.segment_tokens; None: off)."""
        segment_tokens = tasks[0].sampling.segment_tokens if tasks else 0
        return self.follower.inflight(self.engine, segment_tokens) if segment_tokens > 0 else None

    async def _evaluate(self, task: EvalTask) -> None:
        """Greedy completions of an evaluation lease's prompts at the version held; the
        coordinator scores them (they are never trained on)."""
        started = time.perf_counter()
        completions = await asyncio.to_thread(self.engine.greedy, task.prompt_ids, task.max_new_tokens)
        gen_s = time.perf_counter() - started
        body = EvalSubmission(worker_id=self.worker_id, lease_id=task.lease_id, version=task.version,
                              completions=completions, gen_time_s=gen_s)
        self.stats["eval_prompts"] += len(completions)
        self.stats["eval_s"] += gen_s
        try:
            reply = EvalAck.model_validate_json(await self.link.retrying("POST", "/v1/evaluation", body))
            log.info("evaluation of version %d: %d held-out prompts in %.1f s%s", task.version, len(completions),
                     gen_s, " (its last)" if reply.done else "")
        except RefusedError as exc:  # expired (we were too slow) or moved on: the coordinator gave it up
            self.hold_version = None
            self.metrics.write("worker_refused", worker_id=self.worker_id, what="evaluation", error=exc.message)
            log.warning("evaluation refused (HTTP %d): %s", exc.status, exc.message)

    async def _submit(self, body: RolloutSubmission) -> None:
        try:
            reply = SubmitResponse.model_validate_json(await self.link.retrying("POST", "/v1/rollout", body))
            if not reply.accepted:
                self.stats["dropped"] += 1
        except RefusedError as exc:
            # 409: our lease expired and the prompt went to someone else; the group is discarded
            self.stats["dropped"] += 1
            self.metrics.write("worker_refused", worker_id=self.worker_id, what="rollout", error=exc.message)
            log.warning("rollout refused (HTTP %d): %s", exc.status, exc.message)
