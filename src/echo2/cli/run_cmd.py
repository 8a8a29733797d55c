"""`echo2 run`: the local launcher (coordinator + learner + N workers on this machine)."""

from __future__ import annotations

import argparse
import sys

from echo2.cli.common import add_config_args, config_from_args


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run coordinator, learner and workers locally")
    add_config_args(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from echo2.launch.local import run_local

    # piped output (make demo | tee, CI logs) gets room for the summary tables instead of 80 columns
    return run_local(config_from_args(args), Console(width=None if sys.stdout.isatty() else 132))
