"""`echo2 coordinator`: run the coordinator service for a run dir."""

from __future__ import annotations

import argparse

from echo2.cli.common import add_config_args, config_from_args, read_resolved, write_resolved


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("coordinator", help="run the coordinator (leases, buffer, rewards)")
    parser.add_argument("--run-dir", help="serve the run whose resolved config.json is here")
    add_config_args(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.coordinator.main import run as serve

    if args.run_dir:
        cfg = read_resolved(args.run_dir)
    else:
        cfg = config_from_args(args)
        write_resolved(cfg)
    return serve(cfg)
