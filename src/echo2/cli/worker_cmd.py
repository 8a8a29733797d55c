"""`echo2 worker`: a rollout worker that joins a coordinator from anywhere."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from echo2.cli.common import add_set_arg
from echo2.cli.logs import add_log_args, setup_logging
from echo2.config.base import apply_overrides, read_toml, validate
from echo2.config.worker import WorkerConfig


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("worker", help="run a rollout worker")
    parser.add_argument("--coordinator", required=True, help="coordinator URL, e.g. http://10.0.0.5:8470")
    parser.add_argument("--config", help="worker TOML (fields of WorkerConfig)")
    add_set_arg(parser, "override a worker field, e.g. --set price_per_hour=0.34 (repeatable)")
    parser.add_argument("--metrics", help="append metrics JSON lines to this file")
    parser.add_argument("--check", action="store_true",
                        help="check reachability, protocol version, join token and relay reachability, print one "
                             "line per check with the fix, and exit (0: all ok)")
    add_log_args(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.coordinator.main import auth_token

    data = apply_overrides(read_toml(args.config) if args.config else {}, args.overrides)
    cfg = validate(WorkerConfig, data, source="worker config")
    setup_logging(args)
    if args.check:
        from echo2.rollout.check import check

        return check(cfg, args.coordinator, auth_token(cfg.auth_token))
    return _work(cfg, args, auth_token(cfg.auth_token))


def _work(cfg: WorkerConfig, args: argparse.Namespace, token: str) -> int:
    from echo2.report.metrics import MetricsWriter
    from echo2.rollout.diagnosis import WorkerFailed
    from echo2.rollout.worker import Worker

    _limit_threads(cfg.torch_threads)
    metrics = MetricsWriter(Path(args.metrics) if args.metrics else None, role="worker")
    worker = Worker(cfg, args.coordinator, token, metrics)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await worker.run(stop)

    try:
        asyncio.run(main())
    except WorkerFailed as exc:
        print(f"echo2 worker: error: {exc}", file=sys.stderr)
        return 1
    finally:
        metrics.close()
    return 0


def _limit_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(threads)
