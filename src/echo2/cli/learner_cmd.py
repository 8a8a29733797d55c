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
    from echo2.coordinator.credentials import LEARNER, MIN_TOKEN_CHARS, key_file, read_secret
    from echo2.coordinator.main import auth_token
    from echo2.learner.train import Learner

    cfg = read_resolved(args.run_dir)
    learner_token = read_secret("LEARNER_TOKEN", key_file(cfg.run_path, LEARNER))
    if len(learner_token) < MIN_TOKEN_CHARS:
        raise ValueError("no learner token: set $ECHO2_LEARNER_TOKEN (or $ECHO2_LEARNER_TOKEN_FILE) to the "
                         f"coordinator's, or run beside it, where {key_file(cfg.run_path, LEARNER)} holds it")
    url = coordinator_url(args.run_dir, args.coordinator)
    Learner(cfg, url, learner_token, auth_token(cfg.coordinator.auth_token)).train()
    return 0
