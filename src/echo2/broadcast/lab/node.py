"""One lab process (`python -m echo2.broadcast.lab.node`): a learner origin or a worker relay,
driven by JSON lines on stdin and answering with JSON lines on stdout.

Commands: origin `publish {version, total_bytes}`, `stats {version}`; worker `fetch {signed,
assignment, public_key, held_version}`, `relayed {version}`; both `stop`. A worker answers a
fetch when it completes, while it keeps relaying, so the driver can send fetches to all workers
at once. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import resource
import sys
import time
from typing import Any

from echo2.broadcast import (
    Origin,
    RelayServer,
    fetch_version,
    generate_private_key,
    public_key_from_hex,
    public_key_hex,
)
from echo2.broadcast.lab.payload import synthetic_payload
from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.broadcast import Assignment, BadPeerReport
from echo2.protocol.manifest import SignedManifest

STDIN_LINE_LIMIT = 64 << 20
"""Largest command line accepted (a signed manifest of ~900 GB of weights at 1 MiB chunks)."""


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Node:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.config = BroadcastConfig.model_validate_json(args.config)
        self.origin: Origin | None = None
        self.relay: RelayServer | None = None
        self.held_version: int | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.cpu_at_ready_s = 0.0  # process CPU seconds when it started serving (set by `start`)

    async def start(self) -> None:
        if self.args.role == "origin":
            self.origin = Origin(generate_private_key(), self.config, auth_token=self.args.token, host=self.args.host)
            await self.origin.start()
            port, extra = self.origin.relay.port, {"public_key": public_key_hex(self.origin.public_key)}
        else:
            self.relay = RelayServer(self.config, auth_token=self.args.token, host=self.args.host)
            await self.relay.start()
            port, extra = self.relay.port, {}
        self.cpu_at_ready_s = _cpu_s()
        emit("ready", url=f"http://{self.args.advertise}:{port}", **extra)

    async def handle(self, command: dict[str, Any]) -> bool:
        """Run one command; False when the node should exit."""
        name = command["cmd"]
        if name == "stop":
            return False
        if name == "publish":
            self._publish(command["version"], command["total_bytes"])
        elif name == "stats":
            assert self.origin is not None
            emit("stats", **self.origin.stats(command["version"]).model_dump(), cpu_s=_cpu_s() - self.cpu_at_ready_s)
        elif name == "fetch":
            task = asyncio.create_task(self._fetch(command))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif name == "relayed":
            assert self.relay is not None
            emit("relayed", version=command["version"], bytes=self.relay.bytes_sent(command["version"]),
                 cpu_s=_cpu_s() - self.cpu_at_ready_s)
        else:
            raise ValueError(f"unknown command {name!r}")
        return True

    def _publish(self, version: int, total_bytes: int) -> None:
        assert self.origin is not None
        payload = synthetic_payload(total_bytes)
        started = time.time()
        signed = self.origin.publish(version, payload)
        emit("published", signed=signed.model_dump(), payload_sha256=hashlib.sha256(payload).hexdigest(),
             hash_s=time.time() - started)

    async def _fetch(self, command: dict[str, Any]) -> None:
        try:
            result = await fetch_version(
                SignedManifest.model_validate(command["signed"]), Assignment.model_validate(command["assignment"]),
                public_key=public_key_from_hex(command["public_key"]), held_version=self.held_version,
                config=self.config, relay=self.relay, auth_token=self.args.token, worker_id=self.args.id,
                report_bad_peer=self._report,
            )
        except Exception as exc:
            emit("fetch_failed", error=repr(exc))
            return
        self.held_version = result.manifest.version
        metrics = result.metrics.loaded(at=time.time())  # the lab "loads" by keeping the bytes
        emit("fetched", metrics=metrics.model_dump(), payload_sha256=hashlib.sha256(result.payload).hexdigest())

    async def _report(self, report: BadPeerReport) -> None:
        emit("bad_peer", report=report.model_dump())


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main_async(args: argparse.Namespace) -> int:
    node = Node(args)
    await node.start()
    reader = asyncio.StreamReader(limit=STDIN_LINE_LIMIT)
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if not await node.handle(json.loads(line)):
            break
    if node.origin is not None:
        await node.origin.stop()
    if node.relay is not None:
        await node.relay.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["origin", "worker"], required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address the relay binds")
    parser.add_argument("--advertise", default="127.0.0.1", help="address peers use to reach it")
    parser.add_argument("--token", default="")
    parser.add_argument("--config", default="{}", help="BroadcastConfig as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"{args.id} %(levelname)s %(message)s")
    profile_dir = os.environ.get("ECHO2_LAB_PROFILE_DIR")  # diagnosing CPU cost per process
    if not profile_dir:
        return asyncio.run(main_async(args))
    import cProfile

    with cProfile.Profile() as profiler:
        code = asyncio.run(main_async(args))
    profiler.dump_stats(os.path.join(profile_dir, f"{args.id}.prof"))
    return code


if __name__ == "__main__":
    sys.exit(main())
