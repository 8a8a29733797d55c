"""Run one broadcast with real processes: a learner origin and N workers, each in its own shaped
network namespace (or all on unshaped loopback), and measure dissemination against the model.

Used by `benchmarks/broadcast.py` and the netns integration test. Every process is started by
PID and stopped by PID (a `stop` command, then SIGKILL after a grace period); the namespaces are
deleted on the way out, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from echo2.broadcast.lab.netns import HostSpec, LabNetwork
from echo2.broadcast.latency import predict_plan_s
from echo2.broadcast.metrics import latency_summary
from echo2.broadcast.topology import plan_broadcast
from echo2.config.broadcast import BroadcastConfig
from echo2.planner.dissemination import ideal_s
from echo2.protocol.broadcast import OriginInfo, PeerInfo

MBIT = 1e6
TOKEN = "lab-token"
READY_TIMEOUT_S = 60.0
"""A node imports aiohttp, pydantic and cryptography and binds a port: ~0.5 s alone, several
seconds when 17 start at once on 2 cores."""
STOP_GRACE_S = 5.0
"""A node asked to stop closes its server within shutdown_timeout (1 s); then it is killed."""


@dataclass(frozen=True)
class LabSpec:
    n_workers: int
    total_bytes: int
    mode: Literal["pipelined", "one_to_many"] = "pipelined"
    chunk_bytes: int = 1 << 20
    origin_up_mbit: float = 100.0
    worker_up_mbit: float = 100.0
    worker_down_mbit: float = 100.0
    shaped: bool = True
    """True: network namespaces + tbf (root). False: unshaped loopback (no model prediction)."""
    kill: tuple[str, float] | None = None
    """(worker id, seconds after publish): SIGKILL that worker's process mid-transfer."""
    config: dict[str, Any] = field(default_factory=dict)
    """Extra BroadcastConfig fields."""

    def broadcast_config(self) -> BroadcastConfig:
        return BroadcastConfig(mode=self.mode, chunk_bytes=self.chunk_bytes, **self.config)


class LabProcess:
    """A node process and its JSON-line events (stdout); stderr goes to a log file."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name, self.process = name, process
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            await self.events.put(json.loads(line))
        await self.events.put({"event": "exited", "returncode": await self.process.wait()})

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())

    async def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        message = await asyncio.wait_for(self.events.get(), timeout_s)
        if message["event"] != event:
            raise RuntimeError(f"{self.name}: expected {event!r}, got {message}")
        return message

    async def stop(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.send({"cmd": "stop"})
            try:
                await asyncio.wait_for(self.process.wait(), STOP_GRACE_S)
            except TimeoutError:
                self.process.kill()  # by PID: this exact child
                await self.process.wait()
        self._reader.cancel()


async def spawn(name: str, argv: list[str], log_dir: Path) -> LabProcess:
    # the src dir this echo2 runs from (lab/ in broadcast/ in echo2/ in it): the nodes run the same code
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[3]))
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until exit
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log, env=env,
        limit=64 << 20,
    )
    log.close()
    return LabProcess(name, process)


def node_argv(role: str, name: str, config: BroadcastConfig, *, host: str, advertise: str) -> list[str]:
    return [sys.executable, "-m", "echo2.broadcast.lab.node", "--role", role, "--id", name, "--host", host,
            "--advertise", advertise, "--token", TOKEN, "--config", config.model_dump_json()]


async def run_lab(spec: LabSpec, log_dir: Path) -> dict[str, Any]:
    """Run `spec` once and return its measurements (see `summarize`)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    hosts = [HostSpec("origin", spec.origin_up_mbit * MBIT, spec.origin_up_mbit * MBIT)] + [
        HostSpec(f"w{i}", spec.worker_up_mbit * MBIT, spec.worker_down_mbit * MBIT) for i in range(spec.n_workers)
    ]
    network = LabNetwork(hosts) if spec.shaped else None
    with network or contextlib.nullcontext():
        processes: list[LabProcess] = []
        try:
            return await _run(spec, network, processes, log_dir)
        finally:
            await asyncio.gather(*(p.stop() for p in processes))


async def _run(spec: LabSpec, network: LabNetwork | None, processes: list[LabProcess],
               log_dir: Path) -> dict[str, Any]:
    config = spec.broadcast_config()
    names = ["origin"] + [f"w{i}" for i in range(spec.n_workers)]
    for index, name in enumerate(names):
        prefix = network.exec_prefix(index) if network else []
        host, advertise = ("0.0.0.0", network.ip(index)) if network else ("127.0.0.1", "127.0.0.1")
        argv = prefix + node_argv("origin" if index == 0 else "worker", name, config, host=host,
                                  advertise=advertise)
        processes.append(await spawn(name, argv, log_dir))
    ready = await asyncio.gather(*(p.expect("ready", READY_TIMEOUT_S) for p in processes))
    plan = _plan(spec, config, names, ready)
    origin, workers = processes[0], processes[1:]
    origin.send({"cmd": "publish", "version": 1, "total_bytes": spec.total_bytes})
    published = await origin.expect("published", READY_TIMEOUT_S + spec.total_bytes / 50e6)
    for worker in workers:
        worker.send({"cmd": "fetch", "signed": published["signed"], "assignment":
                     plan.for_worker(worker.name).model_dump(), "public_key": ready[0]["public_key"],
                     "held_version": None})
    killer = asyncio.create_task(_kill_later(spec, workers))
    slowest_bytes_per_s = min(spec.origin_up_mbit, spec.worker_down_mbit) * MBIT / 8
    deadline_s = 60 + 3 * spec.total_bytes * spec.n_workers / slowest_bytes_per_s
    outcomes = await asyncio.gather(*(_outcome(w, deadline_s) for w in workers))
    await killer
    origin.send({"cmd": "stats", "version": 1})
    stats = await origin.expect("stats", 30)
    relayed = await _relayed(workers)
    return summarize(spec, config, plan, published=published,
                     outcomes=dict(zip(names[1:], outcomes, strict=True)), stats=stats, relayed=relayed)


def _plan(spec: LabSpec, config: BroadcastConfig, names: list[str], ready: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    peers = [PeerInfo(peer_id=name, url=info["url"], upload_bytes_per_s=spec.worker_up_mbit * MBIT / 8,
                      download_bytes_per_s=spec.worker_down_mbit * MBIT / 8)
             for name, info in zip(names[1:], ready[1:], strict=True)]
    origin = OriginInfo(url=ready[0]["url"], upload_bytes_per_s=spec.origin_up_mbit * MBIT / 8)
    return plan_broadcast(1, origin, peers, config)


async def _kill_later(spec: LabSpec, workers: list[LabProcess]) -> None:
    if spec.kill is None:
        return
    name, after_s = spec.kill
    await asyncio.sleep(after_s)
    victim = next(w for w in workers if w.name == name)
    victim.process.kill()  # SIGKILL by PID, mid-transfer: no goodbye to its children


async def _outcome(worker: LabProcess, deadline_s: float) -> dict[str, Any]:
    message = await asyncio.wait_for(worker.events.get(), deadline_s)
    while message["event"] == "bad_peer":
        message = await asyncio.wait_for(worker.events.get(), deadline_s)
    return message


async def _relayed(workers: list[LabProcess]) -> dict[str, dict[str, Any]]:
    relayed = {}
    for worker in workers:
        if worker.process.returncode is None:
            worker.send({"cmd": "relayed", "version": 1})
            relayed[worker.name] = await worker.expect("relayed", 30)
    return relayed


def summarize(spec: LabSpec, config: BroadcastConfig, plan: Any, *, published: dict[str, Any],
              outcomes: dict[str, dict[str, Any]], stats: dict[str, Any],
              relayed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    fetched = {n: o for n, o in outcomes.items() if o["event"] == "fetched"}
    published_at = json.loads(published["signed"]["manifest_json"])["published_at"]
    verified_s = [o["metrics"]["verified_at"] - published_at for o in fetched.values()]
    loaded_s = [o["metrics"]["loaded_at"] - published_at for o in fetched.values()]
    down_bytes_per_s = spec.worker_down_mbit * MBIT / 8
    return {
        "mode": spec.mode, "n_workers": spec.n_workers, "total_bytes": spec.total_bytes,
        "chunk_bytes": config.chunk_bytes, "shaped": spec.shaped,
        "measured_s": max(verified_s) if verified_s else None,
        "predicted_s": predict_plan_s(plan, spec.total_bytes, config.chunk_bytes) if spec.shaped else None,
        "ideal_s": ideal_s(spec.total_bytes, worker_bytes_per_s=down_bytes_per_s) if spec.shaped else None,
        "verified": latency_summary(verified_s).model_dump(), "loaded": latency_summary(loaded_s).model_dump(),
        "per_worker": {n: {"depth": plan.for_worker(n).depth,
                           "first_chunk_s": round(o["metrics"]["first_chunk_at"] - published_at, 3),
                           "verified_s": round(o["metrics"]["verified_at"] - published_at, 3)}
                       for n, o in fetched.items()},
        "all_correct": all(o["payload_sha256"] == published["payload_sha256"] for o in fetched.values()),
        "failed": {n: o.get("error", o["event"]) for n, o in outcomes.items() if o["event"] != "fetched"},
        "max_depth": max(a.depth for a in plan.assignments),
        "origin_bytes_sent": stats["bytes_sent"], "relayed_bytes": {n: r["bytes"] for n, r in relayed.items()},
        "cpu_s": {"origin": round(stats["cpu_s"], 2), **{n: round(r["cpu_s"], 2) for n, r in relayed.items()}},
        "bytes_by_source": {n: o["metrics"]["bytes_by_source"] for n, o in fetched.items()},
        "resumed_at_chunks": {n: o["metrics"]["resumed_at_chunks"] for n, o in fetched.items()
                              if o["metrics"]["resumed_at_chunks"]},
        "hash_s": published["hash_s"], "wall_clock": time.time(),
    }
