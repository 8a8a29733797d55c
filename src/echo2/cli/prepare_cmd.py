"""`echo2 prepare`: build and warm-start the run's base model (cached in the run dir)."""

from __future__ import annotations

import argparse

from echo2.cli.common import add_config_args, config_from_args
from echo2.config.run_dir import write_resolved


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare", help="build the tiny model or dequantize a GGUF file, and run the warm start (cached)")
    add_config_args(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.learner.base_model import prepare_base_model
    from echo2.models.sources import check_model_source

    cfg = config_from_args(args)
    check_model_source(cfg.model)
    write_resolved(cfg)
    prepare_base_model(cfg)
    return 0
