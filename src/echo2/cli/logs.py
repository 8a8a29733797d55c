"""Console logging of the standalone roles (`echo2 coordinator`, `learner`, `worker`): plain
timestamped lines on stderr, one per thing that happened, so whoever runs a role on a rented
machine sees what it does. Under `echo2 run` the same lines go to `<run_dir>/logs/<role>.log`
(the launcher points each child's stderr there), not to the launcher's progress display."""

from __future__ import annotations

import argparse
import logging
import sys

LEVELS = ("debug", "info", "warning", "error")
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def add_log_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LEVELS, default="info",
                        help="console log level (default info: one line per registration, version, step, ...)")
    parser.add_argument("--quiet", action="store_true",
                        help="log warnings and errors only (same as --log-level warning)")


def setup_logging(args: argparse.Namespace) -> None:
    """Route echo2's loggers to stderr at the level asked for. Libraries stay at warning: their
    info lines (aiohttp, transformers) are noise to an operator."""
    level = logging.WARNING if args.quiet else getattr(logging, args.log_level.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("echo2").setLevel(level)
