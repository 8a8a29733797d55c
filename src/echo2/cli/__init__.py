"""The `echo2` command: one module per subcommand, heavy imports deferred to run time.

Each subcommand module exposes `add_parser(subparsers)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> module under echo2.cli; the module is imported only to build its parser.
SUBCOMMANDS: dict[str, str] = {
    "run": "echo2.cli.run_cmd",
    "prepare": "echo2.cli.prepare_cmd",
    "coordinator": "echo2.cli.coordinator_cmd",
    "learner": "echo2.cli.learner_cmd",
    "worker": "echo2.cli.worker_cmd",
    "plan": "echo2.cli.plan_cmd",
    "sim": "echo2.cli.sim_cmd",
    "export": "echo2.cli.export_cmd",
    "eval": "echo2.cli.eval_cmd",
    "certs": "echo2.cli.certs_cmd",
    "report": "echo2.cli.report_cmd",
    "models": "echo2.cli.models_cmd",
    "fleet": "echo2.cli.fleet_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="echo2",
        description="Asynchronous RL post-training with a central learner and remote rollout workers.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ValueError as exc:
        # user errors (bad config, bad flag values) print one clear line, not a traceback
        print(f"echo2 {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # output piped into `head` and closed early: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
