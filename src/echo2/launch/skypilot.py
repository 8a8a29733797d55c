"""The SkyPilot fleet: workers on machines SkyPilot rents (clouds, Kubernetes, GPU marketplaces,
spot), acquired and released as the activation controller decides (a `FleetProvider`,
echo2.launch.fleet).

Each worker has its own cluster (`cluster_name(run id, worker id)`) running one task
(echo2.launch.sky_task): the machine of its catalog class, the coordinator's echo2, and
`echo2 worker` under its worker id. A worker's life:

    acquire ──> launching ──(launch ok)──> up ──(release)──> releasing ──(down ok)──> released
                  │ launch failed: down, then the next fallback class; none left: released,
                  │ tried again after `retry_after_s`
                  up, cluster gone (poll) + worker lost (observe) ──> down, "preempted", relaunch

The fleet ledger (echo2.report.fleet_ledger) gets each `acquiring` before SkyPilot is asked for the
machine and its `released` only once SkyPilot confirms the cluster is down (or gone): a
machine whose down failed stays held, is tried again at each poll and at close, and is never
acquired again until then (the ledger follows one machine per worker).

Acquire and release return at once: the launcher's loop calls them every half second while a
launch takes minutes (provisioning, then pip installing torch), so the SkyPilot calls run on a
small thread pool, one at a time per worker (a worker's down waits for its launch to end)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from echo2.config.catalog import WorkerClass
from echo2.launch.sky_api import ClusterGone, SkyApi, SkyTimeouts, cluster_states
from echo2.launch.sky_task import WorkerLaunch, check_classes, cluster_name, task_for
from echo2.report.fleet_ledger import FleetLedger
from echo2.report.metrics import MetricsWriter

__all__ = ["SkyPilotFleet", "SkyTimeouts", "WorkerLaunch", "cluster_name", "task_for"]

PROVIDER = "skypilot"
Phase = Literal["released", "launching", "up", "releasing", "replacing", "stuck"]
"""replacing: preempted, its cluster being downed before a relaunch; stuck: its down failed, the
ledger still holds it, and the fleet tries the down again."""


@dataclass(slots=True, eq=False)
class SkyWorker:
    """One worker id's state: at most one cluster at a time."""

    worker_id: str
    preferred_class: str
    worker_class: str
    cluster: str
    phase: Phase = "released"
    acquired_at: float | None = None
    """Monotonic time of the acquire; None once registered (its boot is over) or when released."""
    gone: bool = False
    """The last status poll did not see the cluster UP."""
    lost: bool = False
    """The coordinator recorded the worker lost or gone since it was acquired."""
    retry_at: float = 0.0
    holding: bool = False
    """The ledger holds a machine for it: acquiring written, released not yet."""
    down_reason: str = "idle"
    """Why its pending down (release, a failed launch, a preemption) was asked for: the ledger's reason."""
    busy: threading.Lock = field(default_factory=threading.Lock)
    """Held by the one SkyPilot job running for this worker."""


class SkyPilotFleet:
    """A FleetProvider over SkyPilot; every worker starts released until acquired."""

    releasable = True

    def __init__(self, api: SkyApi, ledger: FleetLedger, metrics: MetricsWriter, *, run_id: str,
                 catalog: dict[str, WorkerClass], workers: dict[str, str], launch: WorkerLaunch,
                 fallbacks: dict[str, list[str]] | None = None, timeouts: SkyTimeouts | None = None,
                 threads: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        """`workers`: worker id -> its catalog class. `fallbacks`: class -> the classes to try, in
        order (cheapest first), when a launch of it fails; each must have a skypilot table."""
        self.api, self.ledger, self.metrics, self.launch = api, ledger, metrics, launch
        self.catalog, self.timeouts, self.clock = catalog, timeouts or SkyTimeouts(), clock
        self.fallbacks = dict(fallbacks or {})
        check_classes(catalog, workers, self.fallbacks)
        self.workers = {w: SkyWorker(w, c, c, cluster_name(run_id, w)) for w, c in workers.items()}
        for worker_class in sorted(set(workers.values()) | {c for chain in self.fallbacks.values() for c in chain}):
            self._task("check", worker_class)  # SkyPilot's parser and WorkerConfig: errors now, not mid-run
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="skypilot")
        self.lock = threading.Lock()  # the workers' state, the ledger's and the metrics' writes
        self.jobs: set[Future] = set()
        self.next_status_at = 0.0
        self.closing = False

    # ---- FleetProvider ----

    def worker_ids(self) -> set[str]:
        return set(self.workers)

    def released(self) -> set[str]:
        with self.lock:
            return {w.worker_id for w in self.workers.values() if w.phase in ("released", "releasing")}

    def acquire(self, worker_id: str) -> None:
        """Launch the worker's cluster (on the pool); its class first, then its fallbacks."""
        worker = self.workers[worker_id]
        with self.lock:
            # releasing: its down comes first, and it is acquired at a later step of the controller's
            if worker.phase != "released" or self.clock() < worker.retry_at or self.closing:
                return  # held already, or failed on every class lately
            worker.phase, worker.worker_class = "launching", worker.preferred_class
            worker.acquired_at, worker.gone, worker.lost = self.clock(), False, False
        self._submit(self._launch_job, worker, self._classes(worker.preferred_class))

    def release(self, worker_id: str) -> None:
        """Down the worker's cluster (on the pool); the ledger's release follows the down."""
        worker = self.workers[worker_id]
        with self.lock:
            if worker.phase in ("released", "releasing"):
                return
            worker.phase, worker.acquired_at, worker.down_reason = "releasing", None, "idle"
        self._submit(self._down_job, worker)

    def observe(self, record: dict) -> None:
        """A coordinator record: a registration ends the worker's boot; a loss or leave, with its
        cluster gone, marks it preempted (see poll)."""
        worker = self.workers.get(record.get("worker_id", ""))
        if worker is None or record.get("role", "coordinator") != "coordinator":
            return
        with self.lock:
            if record.get("kind") == "worker_registered" and worker.acquired_at is not None:
                boot_s = self.clock() - worker.acquired_at
                worker.acquired_at, worker.lost = None, False
                self._metric("worker_rejoined", worker_id=worker.worker_id, rejoin_s=boot_s,
                             worker_class=worker.worker_class, provider=PROVIDER)
            elif record.get("kind") in ("worker_lost", "worker_left") and worker.phase == "up":
                worker.lost = True

    # ---- beyond the Protocol ----

    def booting(self) -> dict[str, float]:
        """Worker id -> seconds since its acquire, for those not registered yet."""
        now = self.clock()
        with self.lock:
            return {w.worker_id: now - w.acquired_at for w in self.workers.values()
                    if w.acquired_at is not None and w.phase in ("launching", "up")}

    def poll(self, now: float) -> None:
        """Called from the launcher's loop (`now`: its monotonic clock): every status_every_s the
        clusters' status is asked for (on the pool), downs that failed are tried again, and a
        worker whose cluster is gone and whom the coordinator lost is replaced."""
        with self.lock:
            preempted = [w for w in self.workers.values() if w.phase == "up" and w.gone and w.lost]
            for worker in preempted:
                worker.phase, worker.down_reason = "replacing", "preempted"  # held: not released() to the controller
            due = now >= self.next_status_at and not self.closing
            if due:
                self.next_status_at = now + self.timeouts.status_every_s
            stuck = [w for w in self.workers.values() if w.phase == "stuck"] if due else []
        for worker in preempted:
            self._submit(self._replace_job, worker)
        for worker in stuck:
            self._submit(self._down_job, worker)
        if due:
            self._submit(self._status_job)

    def close(self, reason: str = "shutdown") -> list[str]:
        """Down every cluster the ledger holds (this provider's), in parallel; returns the
        clusters whose down failed: they may still bill (`sky down NAME`, or `echo2 fleet down`)."""
        with self.lock:
            self.closing = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        held = [h for h in self.ledger.held().values() if h.provider == PROVIDER]
        if not held:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(held)), thread_name_prefix="skypilot-close") as pool:
            downed = list(pool.map(lambda h: self._down(h.worker_id, h.machine), held))
        failed = [h.machine for h, ok in zip(held, downed, strict=True) if not ok]
        with self.lock:
            for holding, ok in zip(held, downed, strict=True):
                if ok:
                    self.ledger.released(holding.worker_id, reason=reason)
                    if holding.worker_id in self.workers:
                        self.workers[holding.worker_id].phase = "released"
                        self.workers[holding.worker_id].holding = False
        return failed

    def settle(self, timeout_s: float) -> bool:
        """Wait for the SkyPilot jobs in flight (tests, an orderly exit); True when none is left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                pending = [job for job in self.jobs if not job.done()]
            if not pending:
                return True
            wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        with self.lock:
            return all(job.done() for job in self.jobs)

    # ---- jobs on the pool, one at a time per worker ----

    def _launch_job(self, worker: SkyWorker, classes: list[str]) -> None:
        with worker.busy:
            for index, worker_class in enumerate(classes):
                if worker.phase != "launching" or self.closing:
                    return  # released while this job waited; a closing fleet downs what the ledger holds
                error = self._launch(worker, worker_class)
                if error is None:
                    return
                following = classes[index + 1] if index + 1 < len(classes) else None
                with self.lock:
                    self._metric("skypilot_launch_failed", worker_id=worker.worker_id, worker_class=worker_class,
                                 cluster=worker.cluster, error=error, next_class=following)
                worker.down_reason = "launch_failed"
                if not self._down_and_release(worker):
                    return
            with self.lock:
                if worker.phase == "launching":
                    worker.phase, worker.acquired_at = "released", None
                    worker.retry_at = self.clock() + self.timeouts.retry_after_s
                self._metric("worker_acquire_failed", worker_id=worker.worker_id, classes=classes,
                             retry_after_s=self.timeouts.retry_after_s)

    def _launch(self, worker: SkyWorker, worker_class: str) -> str | None:
        """One launch of `worker_class`: None when the worker's task runs, else what went wrong."""
        cls_cfg = self.catalog[worker_class]
        with self.lock:
            if self.closing:
                return "the fleet is closing"
            worker.worker_class, worker.holding = worker_class, True
            self.ledger.acquiring(worker.worker_id, provider=PROVIDER, machine=worker.cluster,
                                  worker_class=worker_class, price_per_hour=cls_cfg.price_per_hour)
        try:
            task = self._task(worker.worker_id, worker_class)
            request_id = self.api.launch(task, worker.cluster)
            self.api.get(request_id, self.timeouts.launch_s)
        except Exception as exc:  # quota, no capacity, a timeout: the next class may still come up
            return f"{type(exc).__name__}: {exc}"
        with self.lock:
            if worker.phase == "launching":
                worker.phase = "up"
            self.ledger.started(worker.worker_id, cluster=worker.cluster, request_id=request_id)
            self._metric("worker_acquired", worker_id=worker.worker_id, worker_class=worker_class,
                         cluster=worker.cluster, provider=PROVIDER)
        return None

    def _classes(self, worker_class: str) -> list[str]:
        """The class, then its fallbacks in the caller's order."""
        return [worker_class, *self.fallbacks.get(worker_class, ())]

    def _task(self, worker_id: str, worker_class: str) -> Any:
        return task_for(worker_id, worker_class, self.catalog[worker_class],
                        coordinator_url=self.launch.coordinator_url, echo2_spec=self.launch.echo2_spec,
                        worker_fields=self.launch.worker_fields, auth_token=self.launch.auth_token)

    def _down_job(self, worker: SkyWorker) -> None:
        with worker.busy:
            if worker.phase not in ("releasing", "stuck"):
                return  # acquired again, or released already
            if self._down_and_release(worker):
                with self.lock:
                    worker.phase = "released"
                    self._metric("worker_released", worker_id=worker.worker_id, worker_class=worker.worker_class,
                                 cluster=worker.cluster, reason=worker.down_reason, provider=PROVIDER)

    def _replace_job(self, worker: SkyWorker) -> None:
        """The cloud took the machine back: down what is left of the cluster, release it as
        preempted, and launch a replacement of the same class (then its fallbacks)."""
        with worker.busy:
            if worker.phase != "replacing":
                return
            with self.lock:
                self._metric("worker_preempted", worker_id=worker.worker_id, worker_class=worker.worker_class,
                             cluster=worker.cluster, provider=PROVIDER)
            if not self._down_and_release(worker) or self.closing:
                return
            with self.lock:
                worker.phase, worker.acquired_at = "launching", self.clock()
                worker.gone, worker.lost = False, False
                classes = self._classes(worker.worker_class)
        self._launch_job(worker, classes)

    def _down_and_release(self, worker: SkyWorker) -> bool:
        """Down the worker's cluster; on success the ledger releases it (with `down_reason`), else
        it stays held (stuck). A worker the ledger holds nothing for has no cluster to down."""
        if worker.holding and not self._down(worker.worker_id, worker.cluster):
            with self.lock:
                worker.phase = "stuck"
            return False
        with self.lock:
            if worker.holding:
                self.ledger.released(worker.worker_id, reason=worker.down_reason)
                worker.holding = False
        return True

    def _down(self, worker_id: str, cluster: str) -> bool:
        try:
            self.api.get(self.api.down(cluster), self.timeouts.down_s)
        except ClusterGone:
            pass  # nothing there to pay for
        except Exception as exc:  # the machine may still bill: held, and tried again
            with self.lock:
                self._metric("skypilot_down_failed", worker_id=worker_id, cluster=cluster,
                             error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    def _status_job(self) -> None:
        with self.lock:
            up = {w.cluster: w for w in self.workers.values() if w.phase == "up"}
        if not up:
            return
        try:
            records = self.api.get(self.api.status(sorted(up)), self.timeouts.status_s)
        except Exception as exc:  # the next poll asks again
            with self.lock:
                self._metric("skypilot_status_failed", error=f"{type(exc).__name__}: {exc}")
            return
        states = cluster_states(records)
        with self.lock:
            for name, worker in up.items():
                gone = states.get(name) != "UP"
                if gone and not worker.gone:
                    self._metric("skypilot_cluster_gone", worker_id=worker.worker_id, cluster=name,
                                 status=states.get(name, "absent"))
                worker.gone = gone

    def _submit(self, job: Callable[..., None], *args: Any) -> None:
        with self.lock:
            if self.closing:
                return
            future = self.pool.submit(self._guarded, job, *args)
            self.jobs = {j for j in self.jobs if not j.done()} | {future}

    def _guarded(self, job: Callable[..., None], *args: Any) -> None:
        try:
            job(*args)
        except Exception as exc:  # a bug in a job must show, not vanish with its thread
            with self.lock:
                self._metric("skypilot_job_failed", job=job.__name__, error=f"{type(exc).__name__}: {exc}")
            raise

    def _metric(self, kind: str, **values: Any) -> None:
        """Callers hold self.lock (one writer at a time)."""
        self.metrics.write(kind, **values)
