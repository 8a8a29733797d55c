"""`echo2 plan`: answer a provisioning question before renting anything. Reads a worker
catalog and a workload (TOML), prints the cheapest fleet that keeps the learner busy, its
predicted utilization and cost, and the saving against a centralized baseline; or, when no
fleet can, why not and what would fix it. Exit status: 0 feasible, 1 infeasible, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator

from echo2.cli.common import add_set_arg

# Non-terminal output (pipes, docs, tests) gets a fixed width so the worker table never wraps.
PIPE_WIDTH = 118


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="cheapest rollout fleet for a workload, and its cost", description=__doc__
    )
    parser.add_argument(
        "--catalog", required=True, help="TOML with [learner], [workers.NAME] (and [workload], [broadcast])"
    )
    parser.add_argument("--workload", help="TOML whose [workload]/[broadcast] tables replace the catalog's")
    add_set_arg(parser, "override a field, e.g. workload.max_staleness=6 or workers.a100_spot.count=4")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.config.catalog import load_plan_config
    from echo2.planner.plan import make_plan

    config = load_plan_config(args.catalog, args.workload, args.overrides)
    with _solver_prints_to_stderr():
        plan = make_plan(config)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, allow_nan=False))
    else:
        from rich.console import Console

        from echo2.cli.plan_render import render

        render(plan, Console(file=sys.stdout, width=None if sys.stdout.isatty() else PIPE_WIDTH))
    return 0 if plan.feasible else 1


@contextlib.contextmanager
def _solver_prints_to_stderr() -> Iterator[None]:
    """HiGHS 1.12 sometimes printf()s a debug line to the C-level stdout (ERGO-Code/HiGHS
    issue 2783); route file descriptor 1 to stderr while solving so `--json` stays parseable."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
