"""`echo2 run`: the launcher: coordinator + learner on this machine, and the workers either here
(N local processes) or on other machines a provider starts and stops (`--provider ssh
--inventory hosts.toml`, `--provider skypilot`)."""

from __future__ import annotations

import argparse
import json
import sys

from echo2.cli.common import add_config_args, config_from_args


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run coordinator, learner and workers (here, or on a fleet)")
    add_config_args(parser)
    parser.add_argument("--provider", choices=["static", "local", "ssh", "skypilot"],
                        help="who holds the workers' machines (sets activation.provider); ssh needs --inventory")
    parser.add_argument("--inventory", help="SSH inventory TOML of the hosts (sets activation.inventory)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from echo2.launch.local import run_local

    if args.inventory and args.provider not in (None, "ssh"):
        raise ValueError(f"--inventory lists SSH hosts, but --provider is {args.provider!r}: use --provider ssh")
    if args.inventory and args.provider is None:
        args.provider = "ssh"
    # before the user's --set, so theirs win; json: a path with spaces or quotes stays one value
    flags = [f"activation.provider={json.dumps(args.provider)}"] if args.provider else []
    flags += [f"activation.inventory={json.dumps(args.inventory)}"] if args.inventory else []
    args.overrides = flags + args.overrides
    # piped output (make demo | tee, CI logs) gets room for the summary tables instead of 80 columns
    return run_local(config_from_args(args), Console(width=None if sys.stdout.isatty() else 132))
