"""`echo2 coordinator`: run the coordinator service for a run dir."""

from __future__ import annotations

import argparse

from echo2.cli.common import add_config_args, config_from_args, refuse_config_with_run_dir
from echo2.cli.logs import add_log_args, setup_logging
from echo2.config.run_dir import resolved_with_overrides, write_resolved


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("coordinator", help="run the coordinator (leases, buffer, rewards)")
    parser.add_argument("--run-dir", help="serve the run whose resolved config.json is here (--set changes "
                                          "fields of it, e.g. coordinator.host, and rewrites it)")
    add_config_args(parser)
    add_log_args(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.coordinator.main import run as serve

    refuse_config_with_run_dir(args)
    if args.run_dir:
        cfg = resolved_with_overrides(args.run_dir, args.overrides)
    else:
        cfg = config_from_args(args)
        write_resolved(cfg)
    setup_logging(args)
    return serve(cfg)
