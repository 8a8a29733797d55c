"""The SSH fleet: workers on machines the user already has or rents by the hour, listed in an
inventory (echo2.config.inventory), started and stopped over SSH as the activation controller
decides (a `FleetProvider`, echo2.launch.fleet). Each step on a host is echo2.launch.ssh_host.

A worker's life:

    acquire ──> starting ──(echo2 installed, worker started: its PID)──> up ──(release)──> releasing
                  │ the host unusable: one line (host, fix), released,        │ SIGTERM, SIGKILL after
                  │ tried again after retry_after_s                           │ the grace, checked gone
                  up, coordinator lost it ──(checked over SSH: gone)──> released ("lost")
                                            (host unreachable) ──> stuck, retried

The fleet ledger (echo2.report.fleet_ledger) gets each `acquiring`, with the host and the worker's
config path, before anything runs on the host, its PID once started, and its `released` only
once the worker is checked gone: a worker whose stop failed stays held, is tried again at each
poll and at close, and `echo2 fleet down --all` can stop it from the ledger alone.

Acquire and release return at once: the launcher's loop calls them every half second while a
fresh host's install takes minutes, so the SSH calls run on a thread pool, one at a time per
worker, and one install at a time per host."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from echo2.config.inventory import SshHost, SshInventory
from echo2.launch.ssh_client import SshClient, SshFailure
from echo2.launch.ssh_host import Release, config_marker, ensure_installed, start_worker, stop_worker, worker_running
from echo2.report.fleet_ledger import FleetLedger, Holding
from echo2.report.metrics import MetricsWriter

PROVIDER = "ssh"
Phase = Literal["released", "starting", "up", "releasing", "stuck"]
"""stuck: its stop failed (the host unreachable); the ledger still holds it and the fleet tries again."""


@dataclass(frozen=True)
class SshLaunch:
    """What every worker the fleet starts is told."""

    run_id: str
    coordinator_url: str
    """Where the workers reach the coordinator, unless their host sets its own coordinator_url."""
    auth_token: str
    release: Callable[[], Release]
    """The echo2 the hosts run (built on first use: a wheel takes seconds to build)."""
    worker_fields: dict[str, Any] = field(default_factory=dict)
    """Settings every worker shares, under each host's own."""


@dataclass(frozen=True)
class SshTimings:
    stop_grace_s: float = 10.0
    """SIGTERM, then this long to leave (return its leases) before SIGKILL."""
    retry_after_s: float = 60.0
    """A host that failed an acquire is not tried again for this long."""
    register_timeout_s: float = 900.0
    """A worker started this long ago and still not registered is checked over SSH (a fresh host
    installs torch before it can register)."""
    check_every_s: float = 10.0
    """How often stuck workers and overdue registrations are looked at."""
    close_wait_s: float = 90.0
    """At close, how long SSH calls in flight are waited for before the ledger's holdings are stopped."""


@dataclass(slots=True, eq=False)
class SshWorker:
    worker_id: str
    host: SshHost
    phase: Phase = "released"
    pid: int = 0
    acquired_at: float | None = None
    """Monotonic time of the acquire; None once registered (its boot is over) or when released."""
    retry_at: float = 0.0
    holding: bool = False
    """The ledger holds it: acquiring written, released not yet."""
    down_reason: str = "idle"
    busy: threading.Lock = field(default_factory=threading.Lock)
    """Held by the one SSH job running for this worker."""


class SshFleet:
    """A FleetProvider over SSH hosts; every worker starts released until acquired."""

    releasable = True

    def __init__(self, inventory: SshInventory, launch: SshLaunch, ledger: FleetLedger, metrics: MetricsWriter, *,
                 warn: Callable[[str], None] = lambda line: None, timings: SshTimings | None = None,
                 threads: int = 8, clock: Callable[[], float] = time.monotonic) -> None:
        """`warn`: where a host's one-line problem is said (the launcher's console)."""
        self.inventory, self.launch, self.ledger, self.metrics, self.warn = inventory, launch, ledger, metrics, warn
        self.timings, self.clock = timings or SshTimings(), clock
        self.workers = {w: SshWorker(w, host) for host in inventory.hosts for w in host.worker_ids()}
        self.venvs: dict[str, str] = {}  # host name -> its venv with this echo2, once installed this run
        self.host_locks = {host.name: threading.Lock() for host in inventory.hosts}
        self.release_lock = threading.Lock()
        self.built: Release | None = None
        self.warned: dict[str, str] = {}  # host name -> the last line said about it
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ssh-fleet")
        self.lock = threading.Lock()  # the workers' state, the ledger's and the metrics' writes
        self.jobs: set[Future] = set()
        self.next_check_at = 0.0
        self.closing = False

    # ---- FleetProvider ----

    def worker_ids(self) -> set[str]:
        return set(self.workers)

    def released(self) -> set[str]:
        with self.lock:
            return {w.worker_id for w in self.workers.values() if w.phase in ("released", "releasing")}

    def acquire(self, worker_id: str) -> None:
        worker = self.workers[worker_id]
        with self.lock:
            if worker.phase != "released" or self.clock() < worker.retry_at or self.closing:
                return  # held already, or its host failed lately
            worker.phase, worker.acquired_at, worker.down_reason = "starting", self.clock(), "idle"
        self._submit(self._start_job, worker)

    def release(self, worker_id: str) -> None:
        worker = self.workers[worker_id]
        with self.lock:
            if worker.phase not in ("starting", "up"):
                return
            worker.phase, worker.acquired_at, worker.down_reason = "releasing", None, "idle"
        self._submit(self._stop_job, worker)

    def observe(self, record: dict) -> None:
        """A coordinator record: a registration ends the worker's boot; a loss is checked over SSH."""
        worker = self.workers.get(record.get("worker_id", ""))
        if worker is None or record.get("role", "coordinator") != "coordinator":
            return
        with self.lock:
            if record.get("kind") == "worker_registered" and worker.acquired_at is not None:
                boot_s = self.clock() - worker.acquired_at
                worker.acquired_at = None
                self._metric("worker_rejoined", worker_id=worker.worker_id, rejoin_s=boot_s,
                             worker_class=worker.host.worker_class, provider=PROVIDER)
                return
            lost = record.get("kind") in ("worker_lost", "worker_left") and worker.phase == "up"
        if lost:
            self._submit(self._check_job, worker, "lost")

    # ---- beyond the Protocol ----

    def booting(self) -> dict[str, float]:
        """Worker id -> seconds since its acquire, for those not registered yet."""
        now = self.clock()
        with self.lock:
            return {w.worker_id: now - w.acquired_at for w in self.workers.values()
                    if w.acquired_at is not None and w.phase in ("starting", "up")}

    def poll(self, now: float) -> None:
        """From the launcher's loop: stuck workers' stops are tried again, and a worker overdue to
        register is checked (one that died at start is released, its log named)."""
        with self.lock:
            if now < self.next_check_at or self.closing:
                return
            self.next_check_at = now + self.timings.check_every_s
            stuck = [w for w in self.workers.values() if w.phase == "stuck"]
            overdue = [w for w in self.workers.values() if w.phase == "up" and w.acquired_at is not None
                       and self.clock() - w.acquired_at > self.timings.register_timeout_s]
        for worker in stuck:
            self._submit(self._stop_job, worker)
        for worker in overdue:
            self._submit(self._check_job, worker, "never_registered")

    def close(self, reason: str = "shutdown") -> list[str]:
        """Stop every worker the ledger holds (this provider's), in parallel; returns one line for
        each that could not be stopped (it may still run: `echo2 fleet down` tries again)."""
        with self.lock:
            self.closing = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.settle(self.timings.close_wait_s)  # a start in flight records its PID first
        held = [h for h in self.ledger.held().values() if h.provider == PROVIDER]
        if not held:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(held)), thread_name_prefix="ssh-close") as pool:
            errors = list(pool.map(lambda h: stop_holding(h, self.timings.stop_grace_s), held))
        with self.lock:
            for holding, error in zip(held, errors, strict=True):
                if error is None:
                    self.ledger.released(holding.worker_id, reason=reason)
                    if holding.worker_id in self.workers:
                        worker = self.workers[holding.worker_id]
                        worker.phase, worker.holding = "released", False
        return [error for error in errors if error is not None]

    def settle(self, timeout_s: float) -> bool:
        """Wait for the SSH jobs in flight; True when none is left."""
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

    def _start_job(self, worker: SshWorker) -> None:
        host = worker.host
        with worker.busy:
            with self.lock:
                if worker.phase != "starting" or self.closing:
                    return  # released while this job waited
                worker.holding = True
                self.ledger.acquiring(worker.worker_id, provider=PROVIDER, machine=host.name,
                                      worker_class=host.worker_class,
                                      price_per_hour=host.price_per_hour / host.workers_per_host,
                                      host=host.model_dump(mode="json"), run_id=self.launch.run_id,
                                      marker=config_marker(host, self.launch.run_id, worker.worker_id))
            try:
                worker.pid = self._start(worker)
            except SshFailure as exc:
                self._acquire_failed(worker, str(exc), exc.kind)
                return
            except Exception as exc:  # a wheel that will not build: every host would fail alike
                self._acquire_failed(worker, f"host {host.name}: {type(exc).__name__}: {exc}", "start_failed")
                return
            with self.lock:
                self.ledger.started(worker.worker_id, pid=worker.pid)
                self._metric("worker_acquired", worker_id=worker.worker_id, worker_class=host.worker_class,
                             host=host.name, pid=worker.pid, provider=PROVIDER)
                if worker.phase == "starting":
                    worker.phase = "up"
                closing = self.closing
        if closing:  # the fleet closed while this start ran: nothing it started outlives it
            with worker.busy:
                worker.down_reason = "shutdown"
                self._stop(worker)

    def _start(self, worker: SshWorker) -> int:
        host = worker.host
        client = SshClient(host)
        release = self._release()
        with self.host_locks[host.name]:  # one install per host, however many of its workers start
            venv = self.venvs.get(host.name) or ensure_installed(client, release)
            self.venvs[host.name] = venv
        config = host.worker_config(worker.worker_id, self.launch.worker_fields)
        return start_worker(client, venv=venv, run_id=self.launch.run_id, worker=config,
                            token=self.launch.auth_token,
                            coordinator_url=host.coordinator_url or self.launch.coordinator_url)

    def _release(self) -> Release:
        with self.release_lock:
            if self.built is None:
                self.built = self.launch.release()
            return self.built

    def _acquire_failed(self, worker: SshWorker, line: str, kind: str) -> None:
        """The host cannot run it now: one line, nothing held, and no retry for a while."""
        with self.lock:
            self.ledger.released(worker.worker_id, reason="acquire_failed")
            worker.holding, worker.pid, worker.acquired_at = False, 0, None
            worker.phase = "released"
            worker.retry_at = self.clock() + self.timings.retry_after_s
            self._metric("worker_acquire_failed", worker_id=worker.worker_id, host=worker.host.name, failure=kind,
                         error=line, retry_after_s=self.timings.retry_after_s, provider=PROVIDER)
            repeated = self.warned.get(worker.host.name) == line
            self.warned[worker.host.name] = line
        if not repeated:  # said once per host until it changes; every retry is in the metrics
            self.warn(line)

    def _stop_job(self, worker: SshWorker) -> None:
        with worker.busy:
            if worker.phase not in ("releasing", "stuck"):
                return  # acquired again, or released already
            if self._stop(worker):
                with self.lock:
                    self._metric("worker_released", worker_id=worker.worker_id, host=worker.host.name,
                                 reason=worker.down_reason, provider=PROVIDER)

    def _stop(self, worker: SshWorker) -> bool:
        """Stop the worker's process; the ledger releases it once it is checked gone, else it
        stays held (stuck). Callers hold worker.busy."""
        if worker.holding:
            marker = config_marker(worker.host, self.launch.run_id, worker.worker_id)
            try:
                stop_worker(SshClient(worker.host), pid=worker.pid, marker=marker, grace_s=self.timings.stop_grace_s)
            except SshFailure as exc:
                with self.lock:
                    worker.phase = "stuck"
                    self._metric("ssh_stop_failed", worker_id=worker.worker_id, host=worker.host.name,
                                 error=str(exc), provider=PROVIDER)
                return False
        with self.lock:
            if worker.holding:
                self.ledger.released(worker.worker_id, reason=worker.down_reason)
            worker.holding, worker.pid, worker.acquired_at, worker.phase = False, 0, None, "released"
        return True

    def _check_job(self, worker: SshWorker, why: str) -> None:
        """The coordinator lost the worker (or it never registered): gone from its host, it is
        released; its host unreachable, it is held (stuck) and its stop retried."""
        with worker.busy:
            if worker.phase != "up":
                return
            marker = config_marker(worker.host, self.launch.run_id, worker.worker_id)
            try:
                running = worker_running(SshClient(worker.host), pid=worker.pid, marker=marker)
            except SshFailure as exc:
                with self.lock:
                    worker.phase, worker.down_reason = "stuck", "lost"
                    self._metric("worker_host_lost", worker_id=worker.worker_id, host=worker.host.name,
                                 error=str(exc), provider=PROVIDER)
                self.warn(f"{worker.worker_id}: {exc}")
                return
            if running and why == "lost":
                return  # it lost the coordinator for a while, not its process: it registers again
            worker.down_reason = why
            if not self._stop(worker):  # gone: only the ledger's record; still running unregistered: stopped
                return
            with self.lock:
                self._metric("worker_released", worker_id=worker.worker_id, host=worker.host.name, reason=why,
                             provider=PROVIDER)
        if why == "never_registered":
            self.warn(f"{worker.worker_id} on host {worker.host.name} did not register within "
                      f"{self.timings.register_timeout_s:.0f} s; its log: {marker[:-len('.toml')]}.log there")

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
                self._metric("ssh_job_failed", job=job.__name__, error=f"{type(exc).__name__}: {exc}")
            raise

    def _metric(self, kind: str, **values: Any) -> None:
        """Callers hold self.lock (one writer at a time)."""
        self.metrics.write(kind, **values)


def stop_holding(holding: Holding, grace_s: float) -> str | None:
    """Stop a worker the ledger holds, from the ledger's record alone (`echo2 fleet down` after a
    SIGKILL of the launcher): None once it is checked gone, else the one line why not."""
    details = holding.details
    try:
        host = SshHost.model_validate(details["host"])
        stop_worker(SshClient(host), pid=int(details.get("pid", 0)), marker=str(details["marker"]), grace_s=grace_s)
    except SshFailure as exc:
        return f"{holding.worker_id}: {exc}"
    except (KeyError, ValueError) as exc:
        return f"{holding.worker_id}: the ledger's record lacks what a stop needs ({exc}); stop it by hand"
    return None
