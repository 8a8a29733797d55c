"""`echo2 worker`: a rollout worker that joins a coordinator from anywhere."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from echo2.cli.common import add_set_arg
from echo2.config.base import apply_overrides, read_toml, validate
from echo2.config.worker import WorkerConfig


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("worker", help="run a rollout worker")
    parser.add_argument("--coordinator", required=True, help="coordinator URL, e.g. http://10.0.0.5:8470")
    parser.add_argument("--config", help="worker TOML (fields of WorkerConfig)")
    add_set_arg(parser, "override a worker field, e.g. --set price_per_hour=0.34 (repeatable)")
    parser.add_argument("--metrics", help="append metrics JSON lines to this file")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.coordinator.main import auth_token
    from echo2.report.metrics import MetricsWriter
    from echo2.rollout.worker import Worker

    data = apply_overrides(read_toml(args.config) if args.config else {}, args.overrides)
    cfg = validate(WorkerConfig, data, source="worker config")
    _limit_threads(cfg.torch_threads)
    metrics = MetricsWriter(Path(args.metrics) if args.metrics else None, role="worker")
    worker = Worker(cfg, args.coordinator, auth_token(cfg.auth_token), metrics)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await worker.run(stop)

    asyncio.run(main())
    metrics.close()
    if worker.refusal:
        print(f"echo2 worker: the coordinator refused this worker: {worker.refusal}", file=sys.stderr)
        return 1
    return 0


def _limit_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(threads)
