"""`echo2 export`: write a learner checkpoint of a run as a Hugging Face model directory
(config, tokenizer, safetensors weights) that `from_pretrained` loads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from echo2.config.run_dir import read_resolved


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("export", help="write a checkpoint as a Hugging Face model directory",
                                   description=__doc__)
    parser.add_argument("--run-dir", required=True, help="run dir holding config.json and checkpoints/")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest complete one)")
    parser.add_argument("--out", required=True, help="new (or empty) directory to write the model to")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="weights' dtype (auto: the base checkpoint's storage dtype)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.learner.export import export_checkpoint

    if args.step is not None and args.step < 0:
        raise ValueError(f"--step {args.step}: expected a checkpoint step >= 0")
    info = export_checkpoint(read_resolved(args.run_dir), Path(args.out), args.step, args.dtype)
    print(json.dumps(info, indent=2))
    return 0
