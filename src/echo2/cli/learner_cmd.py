"""`echo2 learner`: run the GRPO learner of a run dir (resumes from its newest checkpoint)."""

from __future__ import annotations

import argparse

from echo2.cli.common import coordinator_url, read_resolved


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("learner", help="run the GRPO learner (resumes from the newest checkpoint)")
    parser.add_argument("--run-dir", required=True, help="run dir holding config.json and checkpoints")
    parser.add_argument("--coordinator", help="coordinator URL (default: from <run-dir>/coordinator.json)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.coordinator.main import auth_token
    from echo2.learner.train import Learner

    cfg = read_resolved(args.run_dir)
    Learner(cfg, coordinator_url(args.run_dir, args.coordinator), auth_token(cfg.coordinator.auth_token)).train()
    return 0
