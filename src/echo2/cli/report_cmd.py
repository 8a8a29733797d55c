"""`echo2 report`: a run's summary and end-of-run plots from its metrics.jsonl, for any run dir
(a finished run, one still going, or one whose roles were started by hand); with `--follow`,
also the metric sinks of its `[report]` settings (TensorBoard, W&B), fed from the whole file and
then from what is appended, until the learner is done. `echo2 run` does all of this itself:
`--follow` is for roles started separately (`echo2 coordinator` and `echo2 learner` write to
the same run dir; start it beside them on that machine)."""

from __future__ import annotations

import argparse
import time

from echo2.cli.common import add_set_arg
from echo2.config.run_dir import read_resolved, with_overrides

# how often --follow reads what was appended: the sinks need no finer grain than a learner step
FOLLOW_POLL_S = 1.0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("report", help="summary, plots and metric sinks of a run dir", description=__doc__)
    parser.add_argument("--run-dir", required=True, help="the run's directory (holds config.json and metrics.jsonl)")
    parser.add_argument("--follow", action="store_true",
                        help="feed the [report] sinks (TensorBoard, W&B) from metrics.jsonl until the learner is done")
    add_set_arg(parser, "override a [report] field for this command only, e.g. --set report.wandb.enabled=true")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from echo2.report.finish import finish_run
    from echo2.report.render import render_summary

    cfg = read_resolved(args.run_dir)
    for item in args.overrides:
        if not item.startswith("report."):
            raise ValueError(f"--set {item}: echo2 report changes only report.* fields (the run's other settings "
                             "are its own)")
    cfg = with_overrides(cfg, args.overrides)
    console = Console()
    if args.follow:
        _follow(cfg, console)
    summary = finish_run(cfg.run_path, plots=cfg.report.plots)
    render_summary(summary, console)
    console.print(f"summary: {cfg.run_path / 'summary.json'}")
    return 0


def _follow(cfg, console) -> None:
    from echo2.report.metrics import MetricsTail
    from echo2.report.sink_factory import make_sinks
    from echo2.report.sinks import SinkFeeder

    sinks = SinkFeeder(make_sinks(cfg), warn=lambda line: console.print(f"[yellow]{line}[/]"))
    tail = MetricsTail(cfg.run_path / "metrics.jsonl")
    try:
        while True:
            records = tail.read_new()
            sinks.feed(records)
            # a learner_done of fewer steps is an earlier session's, before train.steps was raised
            if any(r.get("role") == "learner" and r.get("kind") == "learner_done"
                   and r.get("steps", 0) >= cfg.train.steps for r in records):
                return
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        console.print("stopped following; the sinks hold what was read so far")
    finally:
        sinks.close()
