"""`echo2 learner`: run the GRPO learner of a run dir (resumes from its newest checkpoint)."""

from __future__ import annotations

import argparse

from echo2.cli.common import add_set_arg, coordinator_url
from echo2.cli.logs import add_log_args, setup_logging
from echo2.config.run_dir import resolved_with_overrides

# a learner started beside its coordinator waits this long for it to bind and write its URL
# (it binds within seconds; a minute means it is not coming)
COORDINATOR_WAIT_S = 60.0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("learner", help="run the GRPO learner (resumes from the newest checkpoint)")
    parser.add_argument("--run-dir", required=True, help="run dir holding config.json and checkpoints")
    parser.add_argument("--coordinator", help="coordinator URL (default: from <run-dir>/coordinator.json)")
    add_set_arg(parser, "change a field of the run's config.json (rewritten), e.g. --set learner.host=0.0.0.0 "
                        "(repeatable)")
    add_log_args(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.coordinator.main import auth_token
    from echo2.coordinator.parts.credentials import LEARNER, MIN_TOKEN_CHARS, key_file, read_secret
    from echo2.learner.train import Learner

    cfg = resolved_with_overrides(args.run_dir, args.overrides)
    setup_logging(args)
    learner_token = read_secret("LEARNER_TOKEN", key_file(cfg.run_path, LEARNER))
    if len(learner_token) < MIN_TOKEN_CHARS:
        raise ValueError("no learner token: set $ECHO2_LEARNER_TOKEN (or $ECHO2_LEARNER_TOKEN_FILE) to the "
                         f"coordinator's, or run beside it, where {key_file(cfg.run_path, LEARNER)} holds it")
    url = coordinator_url(args.run_dir, args.coordinator, wait_s=COORDINATOR_WAIT_S)
    Learner(cfg, url, learner_token=learner_token, join_token=auth_token(cfg.coordinator.auth_token)).train()
    return 0
