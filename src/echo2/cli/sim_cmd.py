"""`echo2 sim`: simulate a whole deployment at a scale one machine cannot run (hundreds of GPU
workers over the internet, an 8B model) from a scenario file, and answer the sizing questions:
how long a version takes to reach every worker per broadcast topology, which S keeps the learner
busy at which bandwidth, and what the run costs against a centralized cluster. Prints a summary
table (or JSON) and writes summary.json plus three PNG plots to --out. Deterministic for a seed.
Exit status: 0 the run finished its steps, 1 it was cut off (no fleet could feed the learner
before the horizon), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from echo2.cli.common import add_set_arg

# Non-terminal output (pipes, docs, tests) gets a fixed width so the table never wraps.
PIPE_WIDTH = 118


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sim", help="simulate a deployment at internet scale: latency, utilization, cost", description=__doc__
    )
    parser.add_argument("--scenario", required=True, help="scenario TOML (see configs/sim/)")
    add_set_arg(parser, "override a field, e.g. sim.steps=500, workload.max_staleness=6, broadcast.topology=tree")
    parser.add_argument("--out", help="output directory (default runs/sim/<scenario name>)")
    parser.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    parser.add_argument("--no-sweeps", action="store_true", help="main run only: skip plots (a) and (b)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.config.sim import load_scenario
    from echo2.sim.analysis import analyze, write_outputs

    scenario = load_scenario(args.scenario, args.overrides)
    analysis = analyze(scenario, with_sweeps=not args.no_sweeps)
    out_dir = Path(args.out) if args.out else Path("runs") / "sim" / scenario.name
    files = write_outputs(analysis, out_dir)
    if args.json:
        print(json.dumps({**analysis.to_dict(), "files": files}, indent=2, allow_nan=False))
    else:
        from rich.console import Console

        from echo2.sim.report import render

        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else PIPE_WIDTH)
        render(analysis.result, console)
        for name, path in files.items():
            console.print(f"{name}: {path}")
    return 0 if analysis.result.finished else 1
